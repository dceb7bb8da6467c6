"""Bad FP8 / efficiency input is one ConfigError naming the field and the reason, exit 2 (issue 23's audit:
a recipe silently ignored under bf16, blockwise FP8 on a part without the kernel, an unknown key whose
message did not say where the setting lives); a recipe whose kernel exists but was not measured runs
with a visible warning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

EXAMPLE = "examples/gpt3-175b-fp8-512-h100.yaml"


def _simulate(*sets: str, json_out: bool = False) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "simulator", "simulate", EXAMPLE]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args + (["--json"] if json_out else []), capture_output=True, text=True)


NO_FRAMEWORK = "no training.framework named"  # the example names none: tests/test_default_framework.py judges that warning


def _fp8_warnings(doc: dict) -> list[str]:
    """The run's warnings less the no-framework one, which every run of this example carries."""
    return [w for w in doc["warnings"] if not w.startswith(NO_FRAMEWORK)]


@pytest.mark.parametrize(("sets", "field", "words"), [
    (("training.precision=bf16", "training.fp8_recipe=mxfp8"), "training.fp8_recipe", "applies to precision fp8 only"),
    (("training.precision=bf16", "training.fp8_recipe=delayed"), "training.fp8_recipe", "got bf16"),
    (("cluster.node=g6-12xlarge", "cluster.num_gpus=4", "parallelism.tp=4", "parallelism.pp=1",
      "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "training.fp8_recipe=blockwise"),
     "training.fp8_recipe", "no block-scaled FP8 GEMM kernel is known on l4"),
    (("efficiency.host_dispatch_us_per_kernel=-5",), "efficiency", "belong to the accelerator spec"),
    (("training.fp8_recpie=mxfp8",), "training.fp8_recpie", "known here: seq_length, precision"),
])
def test_bad_fp8_input_is_one_line_naming_the_field(sets, field, words):
    out = _simulate(*sets)
    assert out.returncode == 2, out.stdout[-500:] + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert lines[0].startswith(f"clustersim: error: {field}: ") and words in lines[0], lines[0]


def test_bf16_comparison_of_an_fp8_file_still_runs():
    # the file spells out fp8_gemms (its default): --set training.precision=bf16 compares the two
    # (inert under bf16: the same step as without the list) and bf16 GEMMs are slower than fp8 ones
    from simulator.scenario import load_raw, load_scenario
    from simulator.simulate import simulate

    out = _simulate("training.precision=bf16", json_out=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["precision"] == "bf16" and _fp8_warnings(doc) == [] and doc["fits"]
    raw, _ = load_raw(EXAMPLE)
    assert raw["training"].pop("fp8_gemms")
    raw["training"]["precision"] = "bf16"
    assert doc["step_time_s"] == pytest.approx(simulate(load_scenario(raw)).step_time_s, rel=1e-12)
    assert doc["step_time_s"] > 1.2 * simulate(load_scenario(EXAMPLE)).step_time_s


def test_blockwise_on_mi300x_runs_with_a_warning_naming_the_kernel():
    out = _simulate("cluster.node=mi300x-8", "training.fp8_recipe=blockwise")
    assert out.returncode == 0, out.stderr
    warning = next(line for line in out.stdout.splitlines()
                   if line.strip().startswith("WARNING:") and NO_FRAMEWORK not in line)
    assert "blockwise" in warning and "mi300x" in warning and "gemm_a8w8_blockscale" in warning
    assert "gemm_blockwise: assumed" in warning
    doc = json.loads(_simulate("cluster.node=mi300x-8", "training.fp8_recipe=blockwise", json_out=True).stdout)
    assert _fp8_warnings(doc) == [warning.strip().removeprefix("WARNING: ")]
    assert doc["efficiency_provenance"]["gemm_blockwise"] == "assumed"


def test_measured_recipes_carry_no_warning():
    doc = json.loads(_simulate("training.fp8_recipe=blockwise", json_out=True).stdout)  # H100: DeepGEMM measured
    assert _fp8_warnings(doc) == [] and len(doc["warnings"]) == 1  # the no-framework warning alone
