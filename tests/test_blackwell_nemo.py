"""validation/blackwell_nemo.py (``python -m validation.blackwell_sanity --nemo``): NeMo's H100 rows on Blackwell as a
NeMo user asks, the speed-up bounds rebuilt from the parts' microbenchmark ratios, and the exit status."""

from __future__ import annotations

import pytest

from validation import blackwell_nemo as bn
from validation import blackwell_sanity as bs


def test_bounds_of_a_pure_class_step_are_its_band():
    """A step that is all GEMM can speed up by the GEMM band and no more or less (5% margin either way)."""
    bands = bn.class_ratio_bands("B200", "H100", "bf16", 8)
    split = dict.fromkeys(bn.SPLIT_CLASSES, 0.0) | {"gemm": 1.0}
    lo, hi = bn.speedup_bounds(split, bands)
    assert lo == pytest.approx(bands["gemm"][0] / bn.MARGIN)
    assert hi == pytest.approx(bands["gemm"][1] * bn.MARGIN)


def test_hidden_communication_may_come_out_on_the_faster_part():
    """The slow side takes the reference's whole collective time as exposed; the fast side lets it hide when a link
    is faster, and keeps the exposed part where no link is (B300 over B200 inside one node: NVLink 1.00)."""
    bands = bn.class_ratio_bands("B200", "H100", "fp8", 64)
    split = dict.fromkeys(bn.SPLIT_CLASSES, 0.0) | {"gemm": 0.9, "comm_exposed": 0.1}
    lo_exposed, hi_exposed = bn.speedup_bounds(split, bands)
    lo_busy, hi_busy = bn.speedup_bounds(split, bands, comm_busy=0.4)
    assert lo_busy < lo_exposed and hi_busy == hi_exposed
    assert hi_exposed == pytest.approx(1.0 / (0.9 / bands["gemm"][1]) * bn.MARGIN)  # the comm may hide entirely
    same_links = bn.class_ratio_bands("B300", "B200", "fp8", 8)
    assert same_links["comm_exposed"][:2] == (1.0, 1.0)
    _, hi_same = bn.speedup_bounds(split, same_links)
    assert hi_same == pytest.approx(1.0 / (0.9 / same_links["gemm"][1] + 0.1) * bn.MARGIN)


def test_bands_come_from_the_named_rows():
    """GEMM: MAMF rows 8/6 (bf16) and the datasheet peaks; attention: FA4 in the B200 step (834) over FA3 in the H200
    step (447) and over FA2 on H100 at the same 8K causal (308); NVL72 adds NVLink over InfiniBand beyond 8 GPUs."""
    gemm = bn.gemm_band("B200", "H100", "bf16")
    assert gemm[:2] == pytest.approx((1745.0 / 794.5, 2250 / 989))
    attention = bn.attention_band("B200", "H100")
    assert attention[:2] == pytest.approx((834 / 447, 834 / 308))
    assert bn.comm_band("GB200", "H100", 64)[1] == bn.NVLINK5_OVER_NIC
    assert bn.comm_band("B200", "H100", 64)[1] < 2.5       # 8-GPU nodes on both: NVLink and NIC ratios only
    assert "assumed" in bn.gemm_band("GB300", "B300", "fp8")[2]  # no GB300 GEMM row: the peak ratio alone


def test_report_on_two_rows(capsys):
    """Llama 3 70B (row 67) is within its bounds on every part; Llama 2 7B at 256K tokens (row 29, 93% of the H100
    step in attention) is not: NeMo's cuDNN attention is priced as FlashAttention-2 on H100 and FlashAttention-4 on
    Blackwell, 3.0x apart at that length, above FA4 / FA2 measured at 8K (2.71x)."""
    assert bn.report([67]) == 0
    out = capsys.readouterr().out
    assert "row 67" in out and "B200/H100 2.3" in out and out.rstrip().endswith("CONSISTENT")
    assert bn.report([29]) == 1
    out = capsys.readouterr().out
    assert "FLAG ratio>parts: row 29 FP8 B200/H100" in out and out.rstrip().endswith("FLAGGED")


def _record(ratio: float) -> dict:
    run = {"tflops": 1.0, "tokens_per_s_per_gpu": 1.0, "step_s": 1.0, "fits": True, "peak_memory_gib": 1.0,
           "hbm_gib": 80.0, "framework_state": "derived", "split": dict.fromkeys(bn.SPLIT_CLASSES, 0.0), "comm_busy_s": 0}
    flag = "ratio>parts" if ratio > 2.7 else ""
    return {"row": 1, "label": "x", "precision": "FP8", "num_gpus": 8, "heldout": True, "set_aside": False,
            "h100_measured_tokens": 1.0, "runs": {"H100": run},
            "pairs": {"B200/H100": {"ratio": ratio, "lo": 1.8, "hi": 2.7, "flag": flag}}}


def test_sanity_nemo_exits_with_the_flags(monkeypatch, capsys):
    monkeypatch.setattr(bn, "table", lambda rows: [_record(2.2)])
    assert bs.main(["--nemo"]) == 0
    monkeypatch.setattr(bn, "table", lambda rows: [_record(3.1)])
    assert bs.main(["--nemo"]) == 1
    assert "FLAG ratio>parts: row 1 FP8 B200/H100 3.10" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--nemo-rows", "67"], ["--nemo", "--nemo-rows", "x"], ["--nemo", "--nemo-rows", "3000"]])
def test_bad_rows_exit_2(argv):
    with pytest.raises(SystemExit) as exc:
        bs.main(argv)
    assert exc.value.code == 2
