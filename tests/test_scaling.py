"""Scaling curves (simulator/explore/scaling.py, `clustersim scale`)."""

from __future__ import annotations

import csv

import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.explore.scaling import CSV_COLUMNS, parse_gpu_counts, scaling_curve
from simulator.explore.search import SearchSpace

TINY = ["model=llama-1b", "cluster.node=dgx-h100", "cluster.num_gpus=8", "training.seq_length=1024",
        "parallelism.global_batch_size=32", "parallelism.tp=1", "parallelism.pp=1", "parallelism.virtual_stages=1",
        "parallelism.schedule=1f1b"]


def fake_simulate(raw):
    """Throughput of N GPUs: 1000·N·(1 - N/1024), MFU falling likewise."""
    n = raw["cluster"]["num_gpus"]
    p = raw["parallelism"]
    eff = 1 - n / 1024
    return {"parallelism": {**p, "dp": n // (p.get("tp", 1) * p.get("pp", 1))}, "fits": True,
            "tokens_per_s": 1000.0 * n * eff, "mfu": 0.5 * eff, "step_time_s": 1.0, "infeasible_reason": None}


def test_ideal_scaling_and_efficiency_exact():
    rows = scaling_curve(None, [64, 128, 256], overrides=TINY, layout="fixed", workers=1, simulate_fn=fake_simulate)
    assert [r["num_gpus"] for r in rows] == [64, 128, 256]
    ref = 1000.0 * 64 * (1 - 64 / 1024)
    assert rows[2]["ideal_tokens_per_s"] == pytest.approx(ref * 4)
    assert rows[2]["scaling_efficiency"] == pytest.approx((1 - 256 / 1024) / (1 - 64 / 1024))
    assert rows[1]["ideal_mfu"] == pytest.approx(0.5 * (1 - 64 / 1024))
    assert rows[0]["scaling_efficiency"] == pytest.approx(1.0)
    assert all(r["global_batch_size"] == 32 for r in rows)  # strong scaling


def test_weak_scaling_grows_the_batch():
    rows = scaling_curve(None, [8, 16, 32], overrides=TINY, weak=True, layout="fixed", workers=1,
                         simulate_fn=fake_simulate)
    assert [r["global_batch_size"] for r in rows] == [32, 64, 128]


def test_real_search_per_count_with_infeasible_count():
    # 256 GPUs cannot split a global batch of 32 sequences (dp*mbs > gbs when tp*pp is small)
    # pp_split even only: the default also tries the balanced cut where it differs (this tiny model's embedding
    # and output layer outweigh a layer, so pp 2 would add 2 layouts: 6 tried at 8 GPUs)
    space = SearchSpace(tp=[1, 2], pp=[1, 2], micro_batch_size=[1], zero_stage=[1], recompute=["none"],
                        virtual_stages=[1], sequence_parallel=[False], pp_split=["even"])
    rows = scaling_curve(None, [8, 16, 256], overrides=TINY, space=space, workers=1)
    assert rows[0]["tokens_per_s"] > 0 and rows[1]["tokens_per_s"] > rows[0]["tokens_per_s"]
    assert rows[0]["dp"] * rows[0]["tp"] * rows[0]["pp"] == 8
    assert rows[2]["tokens_per_s"] is None and "none of" in rows[2]["infeasible_reason"]
    assert rows[0]["layouts_tried"] == 4


def test_cli_writes_csv_png_svg(tmp_path, capsys):
    out = tmp_path / "s"
    args = ["scale", "--gpus", "8,16", "--fixed", "--out", str(out), "--workers", "1"]
    for item in TINY:
        args += ["--set", item]
    assert main(args) == 0
    for name in ("scaling.csv", "scaling.png", "scaling.svg"):
        assert (out / name).stat().st_size > 0
    with (out / "scaling.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == list(CSV_COLUMNS) and len(rows) == 2
    assert float(rows[1]["tokens_per_s"]) > float(rows[0]["tokens_per_s"])
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in (out / "scaling.svg").read_text()[:2000]


@pytest.mark.parametrize("text", ["", "8,x", "0,8", "-8"])
def test_bad_gpu_lists(text):
    with pytest.raises(ConfigError) as info:
        parse_gpu_counts(text)
    assert info.value.field == "--gpus"


def test_cli_bad_input(capsys):
    assert main(["scale", "--gpus", "8,abc"]) == 2
    assert "--gpus" in capsys.readouterr().err
    assert main(["scale", "--gpus", "8", "--fixed", "--space", "tp=1"]) == 2


def fake_images(raw):
    """An image model: samples/s only (no tokens), 100·N·(1 - N/1024)."""
    n = raw["cluster"]["num_gpus"]
    p = raw["parallelism"]
    eff = 1 - n / 1024
    return {"parallelism": {**p, "dp": n}, "fits": True, "samples_per_s": 100.0 * n * eff, "tokens_per_s": None,
            "mfu": 0.4 * eff, "step_time_s": 1.0, "infeasible_reason": None}


def test_scaling_of_a_model_without_a_sequence_uses_samples_per_second():
    rows = scaling_curve(None, [64, 256], overrides=TINY, layout="fixed", workers=1, simulate_fn=fake_images)
    assert rows[1]["samples_per_s"] == pytest.approx(100.0 * 256 * 0.75)
    assert rows[1]["ideal_samples_per_s"] == pytest.approx(4 * 100.0 * 64 * (1 - 64 / 1024))
    assert rows[1]["scaling_efficiency"] == pytest.approx(0.75 / (1 - 64 / 1024))
    assert rows[1]["tokens_per_s"] is None and rows[1]["ideal_tokens_per_s"] is None
