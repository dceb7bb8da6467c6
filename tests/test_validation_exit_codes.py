"""Every ``python -m validation.X`` that checks a target exits 1 when a figure is past it (issue 20:
``python -m validation.ds3lab`` printed NOT MET and exited 0). The fit printers, which report a
fit and have no target, are listed with why; any other module with a ``__main__`` must end in
``raise SystemExit(...)`` / ``sys.exit(...)`` of a status its checks set."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from validation import ds3lab
from validation import layout_ranking as lr

ROOT = Path(__file__).resolve().parents[1]
FIT_PRINTERS = {  # module -> why it has no pass/fail
    "calibrate_a100": "prints the A100 fit (its held-out figures are checked by tests/test_calibration_a100.py)",
    "calibrate_direct_conv": "prints (and with --write writes) the direct-convolution fit",
    "calibrate_efa": "prints (and with --write writes) the EFA collective laws",
    "calibrate_frameworks": "prints (and with --write writes) the framework profiles' fits",
    "memory_classifier_ceiling": "an analysis (how well any classifier could do), no target",
}


def _main_calls(path: Path) -> list[ast.AST]:
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return node.body
    return []


def test_every_validation_main_exits_with_its_checks_status():
    mains = {p.stem if p.name != "__main__.py" else p.parent.name: p
             for p in [*ROOT.glob("validation/*.py"), *ROOT.glob("validation/*/__main__.py")]
             if p.name == "__main__.py" or _main_calls(p)}
    assert {"ds3lab", "deeppool_model", "layout_ranking", "modern", "calibrate_microbench", "calibrate_conv"} <= set(mains)
    for name, path in mains.items():
        if name in FIT_PRINTERS:
            continue
        text = path.read_text()
        last = ast.unparse(_main_calls(path)[-1]) if _main_calls(path) else text.rstrip().splitlines()[-1]
        assert "SystemExit(" in last or "sys.exit(" in last, f"validation/{name}: __main__ ends in {last!r}"


def _block(name: str, met: bool) -> dict:
    return {"case_set": name, "source": "s", "cases": [], "notes": [], "met": met,
            "median_abs_error_heldout": 0.1502, "heldout_rows": 24, "target_median_abs_error": 0.15,
            "max_abs_error_heldout": 0.3}


def test_ds3lab_exits_1_when_a_set_misses(monkeypatch, capsys):
    monkeypatch.setattr(ds3lab, "REPORTS", {"a": lambda: _block("a", True), "b": lambda: _block("b", False)})
    assert ds3lab.main() == 1
    out = capsys.readouterr().out
    assert "15.02% over 24 rows (target 15%)" in out and out.rstrip().endswith("FAIL: b past target")
    monkeypatch.setattr(ds3lab, "REPORTS", {"a": lambda: _block("a", True)})
    assert ds3lab.main() == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_layout_ranking_exits_1_when_the_heldout_spearman_misses(monkeypatch, capsys):
    import pandas as pd

    oom = {"n": 10, "accuracy": 0.95, "confusion": {}, "invalid": 0}
    rank = {"runs": 5, "mean_spearman": 0.70, "min_spearman": 0.5, "median_abs_error": 0.1, "unpredicted": 0,
            "mean_spearman_if_run": 0.7, "groups": {}, "table": pd.DataFrame()}
    monkeypatch.setattr(lr, "calibrated", lambda name: ([], None))
    monkeypatch.setattr(lr, "oom_report", lambda part, overhead: oom)
    monkeypatch.setattr(lr, "ranking_report", lambda *a, **k: rank)
    monkeypatch.setattr(lr, "memory_error", lambda oom, part: {"n": 0})
    assert lr._main(["--set", "hagemann"]) == 1
    out = capsys.readouterr().out
    assert "MISS: hagemann held-out mean Spearman 0.700 < 0.8" in out and out.rstrip().endswith("FAIL")
    assert lr._main(["--set", "hagemann", "--split", "all"]) == 0   # not the half the targets are set on
    rank["mean_spearman"] = 0.85
    assert lr._main(["--set", "hagemann"]) == 0


@pytest.mark.parametrize(("sets", "code"), [(["ds3lab_p2p"], 0), (["ds3lab_p2p", "ds3lab_gpt3xl_megatron_dp"], 1)])
def test_ds3lab_from_the_shell_exits_1_exactly_when_a_set_is_not_met(sets, code):
    """Real runs of the cheap sets from the shell (the whole script, parameter servers included, takes ~36
    CPU-s; every set's figures are checked in-process by tests/test_ds3lab*.py): exit 1 and a FAIL line naming
    the set when a block says NOT MET (the Megatron DP set today: a strict xfail in tests/test_ds3lab_dp.py),
    else 0 and PASS."""
    argv = [arg for name in sets for arg in ("--set", name)]
    out = subprocess.run([sys.executable, "-m", "validation.ds3lab", *argv], capture_output=True, text=True, cwd=ROOT)
    last = out.stdout.rstrip().splitlines()[-1]
    assert out.returncode == code, out.stderr[-2000:]
    assert (out.returncode == 1) == ("NOT MET" in out.stdout) == last.startswith("FAIL: "), out.stdout[-2000:]
    assert last == ("FAIL: ds3lab_gpt3xl_megatron_dp past target" if code else "PASS")


# -- each judged module's exit status follows its tolerance (in-process; audit s9 gap 10: the check above
# reads only the syntax of `__main__`, so a main() regressing to `return 0` would pass it). Each test runs
# the module's own main() twice: once where its figures meet the tolerance (exit 0) and once where a
# tolerance is tightened, or one prediction moved, past them (exit 1). Cheap modules run on their real
# data; the expensive ones (DeepPool whole models, the conv fit, the Blackwell simulations, the modern sets'
# simulations) get small stand-in figures for what they would simulate, and their own judging code.

def test_calibrate_collectives_exits_1_past_a_tolerance_and_0_within(monkeypatch, capsys):
    from validation import calibrate_collectives as cc
    from validation import calibrate_collectives_cross as cross

    for module, names in ((cc, ("MEDIAN", "WORST", "LARGE")), (cross, ("CROSS_MEDIAN", "CROSS_WORST", "CROSS_LARGE"))):
        for name in names:
            monkeypatch.setattr(module, name, 100.0)
    assert cc.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    monkeypatch.setattr(cc, "MEDIAN", 0.0)      # the in-node held-out median past a zero tolerance
    assert cc.main([]) == 1
    out = capsys.readouterr().out
    assert "MISS: " in out and out.rstrip().endswith("FAIL")
    monkeypatch.setattr(cc, "MEDIAN", 100.0)
    monkeypatch.setattr(cross, "CROSS_LARGE", 0.0)   # the cross-node >= 64 MiB rows alone
    assert cc.main([]) == 1
    assert "MISS: cross-node" in capsys.readouterr().out


def test_calibrate_microbench_exits_1_past_a_tolerance_and_0_within(monkeypatch, capsys):
    from validation import calibrate_microbench as mb

    assert mb.main([]) == 0   # today's figures meet every tolerance (rc 0, PASS)
    assert capsys.readouterr().out.rstrip().endswith("PASS")
    for name, value in (("GEMM_MEDIAN", 0.0), ("ATTENTION_MAX", 0.0), ("MXFP8_SPEEDUP_MEDIAN", 0.0)):
        with monkeypatch.context() as patch:
            patch.setattr(mb, name, value)
            assert mb.main([]) == 1, name
            out = capsys.readouterr().out
            assert "MISS" in out and out.rstrip().endswith("FAIL"), name


def test_deeppool_vit_exits_1_past_its_whole_model_target_and_0_within(monkeypatch, capsys):
    from validation import deeppool_vit as vit

    assert vit.main([]) == 0   # median |error| 3.3% against 5%
    assert "target 5%: met" in capsys.readouterr().out
    monkeypatch.setattr(vit, "WHOLE_MODEL_TARGET", 0.001)
    assert vit.main([]) == 1
    assert "NOT met" in capsys.readouterr().out


def test_deeppool_model_exits_1_when_either_target_is_missed(monkeypatch, capsys):
    """Stand-in figures for its ~9 CPU-s of simulation; its own target checks and exit."""
    import pandas as pd

    from validation import deeppool_model as dm

    monkeypatch.setattr(dm, "fitted_memory_kernels", lambda: type("K", (), {"by_kernel": {}, "fitted_on": "-"})())
    monkeypatch.setattr(dm, "fitted_host_s", lambda: 9e-6)
    monkeypatch.setattr(dm, "row_errors", lambda conv_host="per_network": pd.DataFrame(
        {"simulated_ms": [1.0, 1.1], "measured_ms": [1.0, 1.0], "heldout": [False, True], "kernel": ["concat"] * 2}))
    blocks = pd.DataFrame({"network": ["vgg", "resnet", "inception"], "batch": [32, 64, 128],
                           "heldout_error": [0.02, -0.03, 0.04]})
    monkeypatch.setattr(dm, "whole_model_errors", lambda: blocks)
    layers = {"general": 0.10, "per_network": 0.09}
    monkeypatch.setattr(dm, "per_layer_heldout", lambda host="per_network": pd.DataFrame(
        {"network": ["all"], "median_abs_error": [layers[host]]}))
    assert dm.main([]) == 0
    assert "issue-19 targets met" in capsys.readouterr().out
    blocks.loc[1, "heldout_error"] = -0.06   # the median block past 5%
    blocks.loc[2, "heldout_error"] = 0.07
    assert dm.main([]) == 1
    assert "per whole model median 6.0% (target 5%: NOT met)" in capsys.readouterr().out
    blocks["heldout_error"] = [0.02, -0.03, 0.04]
    layers["general"] = 0.16                 # the per-layer median past 15%
    assert dm.main([]) == 1
    assert "per-layer held-out median |error| 16.0% (general host model; target 15%: NOT met)" in capsys.readouterr().out


def test_calibrate_conv_exits_1_past_its_per_layer_target(monkeypatch, capsys):
    """Stand-in fits and error tables for its ~9 CPU-s of fitting; its own target check and exit: the
    held-out median |error| with the general host model, overall and per network, within 15%."""
    import pandas as pd

    from validation import calibrate_conv as conv

    errors = {"network": ["vgg", "vgg", "resnet", "resnet"], "layer_type": ["conv2d"] * 4,
              "error": [0.05, -0.1, 0.12, -0.02], "batch": [32, 64, 32, 64], "window": [3] * 4, "stride": [1] * 4}
    model = type("Fit", (), {"model_dump": lambda self, exclude=None: {}})()
    monkeypatch.setattr(conv, "fitted", lambda: (0.5, 1.0, "-"))
    monkeypatch.setattr(conv, "errors", lambda half: pd.DataFrame(errors))
    monkeypatch.setattr(conv, "spec_block", lambda: {})
    monkeypatch.setattr(conv, "conv_spec_block", lambda: {})
    monkeypatch.setattr(conv, "fitted_conv", lambda: (model, {"vgg": 1e-4}))
    monkeypatch.setattr(conv, "fitted_conv_general",
                        lambda: (model, type("Host", (), {"host_per_layer_s": 2e-4, "floor_s": 4e-4})()))
    monkeypatch.setattr(conv, "conv_errors", lambda half, name="general": pd.DataFrame(errors))
    assert conv.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith(": met")
    errors["error"] = [0.05, -0.1, 0.30, -0.2]   # resnet's median past 15% (the overall median is not)
    assert conv.main([]) == 1
    assert "NOT met (exit 1)" in capsys.readouterr().out


def test_blackwell_sanity_exits_1_when_a_prediction_is_flagged(monkeypatch, capsys):
    """Stand-in TFLOP/s for the table's simulations (the torchtitan MoE rows are simulated: ~1 CPU-s);
    its own flags: MFU above the part's MAMF efficiency, a ratio over H100 above or below the parts' ratios."""
    from validation import blackwell_sanity as bs

    # B200 2.0x and GB200 2.2x H100: within every part ratio (GEMM, attention, HBM, NVLink: 1.77-2.58x)
    tflops = {"H100": 300.0, "B200": 600.0, "GB200": 660.0}
    monkeypatch.setattr(bs, "simulate_run", lambda raw, part, training: {"model_tflops_per_gpu": tflops[part],
                                                                          "fits": True})
    assert bs.main([]) == 0
    assert capsys.readouterr().out.rstrip().endswith("CONSISTENT")
    tflops["B200"] = 3000.0                   # B200 10x H100: past every ratio of the parts and past MAMF
    assert bs.main([]) == 1
    out = capsys.readouterr().out
    assert "FLAG ratio>parts" in out and "on B200" in out and out.rstrip().endswith("FLAGGED")
    tflops["B200"] = 300.0                    # B200 as fast as H100: below every ratio of the parts
    assert bs.main([]) == 1
    out = capsys.readouterr().out
    assert "FLAG ratio<parts" in out and "on B200" in out and out.rstrip().endswith("FLAGGED")
    tflops["B200"] = 600.0
    monkeypatch.setattr(bs, "mamf_efficiency", lambda part, key: 0.01)
    assert bs.main([]) == 1
    assert "FLAG mfu>mamf" in capsys.readouterr().out


def test_modern_exits_1_when_a_set_misses_its_target(monkeypatch, capsys):
    """torchtitan's 18 held-out rows with stand-in predictions (their measured rate x (1 + error)) instead
    of their simulations; the set's own report judges them against its targets."""
    import importlib

    from validation.modern.case import CaseOutcome
    from validation.modern.registry import SETS, built

    modern = importlib.import_module("validation.modern.__main__")
    error = {"value": 0.0}

    def evaluate(name, half="heldout", workers=2, overrides=()):
        cases = [c for c in built(name)[0] if half == "all" or (half == "heldout") == c.heldout]
        return [CaseOutcome(c, c.measured_rate_per_gpu * (1 + error["value"]), c.measured_rate_per_gpu, True)
                for c in cases]

    monkeypatch.setattr(modern, "evaluate", evaluate)
    argv = ["--set", "torchtitan", "--no-catalog-only", "--no-user-profile"]
    assert modern.main(argv) == 0
    assert "NOT MET" not in capsys.readouterr().out
    error["value"] = SETS["torchtitan"].median_target + 0.01   # every row just past the median target
    assert modern.main(argv) == 1
    assert "NOT MET" in capsys.readouterr().out


#: the judged modules whose exit status a test above checks by running their main() both ways
BEHAVIOURAL = {"ds3lab", "layout_ranking", "calibrate_collectives", "calibrate_microbench", "deeppool_vit",
               "deeppool_model", "calibrate_conv", "blackwell_sanity", "modern"}
NOT_JUDGED = {  # modules with a __main__ that judge nothing (besides FIT_PRINTERS), with why
    "derive_parts": "prints (and with --write writes) the derived parts' spec blocks",
    "harness": "runs real torch.distributed measurements and writes them; `clustersim validate-runs` judges them "
               "(its exit 1 past --tolerance: tests/test_calibration.py)",
}


def test_every_judged_validation_main_has_a_behavioural_exit_check():
    """A new module with a __main__ must be judged here both ways or listed as judging nothing."""
    mains = {p.stem if p.name != "__main__.py" else p.parent.name
             for p in [*ROOT.glob("validation/*.py"), *ROOT.glob("validation/*/__main__.py")]
             if p.name == "__main__.py" or _main_calls(p)}
    assert mains == BEHAVIOURAL | set(NOT_JUDGED) | set(FIT_PRINTERS)
