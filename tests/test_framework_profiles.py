"""``training.framework``: the shipped framework profiles (hardware_specs/frameworks/), which entry a run
gets and what it is called (calibrated / derived / assumed), the step time it moves in the fitted
direction, bad names (exit 2), and that the shipped files are exactly what the validation's fit writes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from hardware_specs.catalog import ACCELERATORS
from hardware_specs.framework import DEFAULT_FRAMEWORK, FOLDER, framework_names, framework_profile
from simulator.cost.framework import ASSUMED, CALIBRATED, DEFAULT, DERIVED, choose, with_grouped_gemm_kernels
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate_point
from validation.modern.profiles import load_groups, resolved_scenario
from validation.modern.registry import SETS, built, user_framework, user_scenario
from validation.modern.shipped import render, shipped_profiles

SMALL = {"model": "llama3-8b", "cluster": {"node": "dgx-h100", "num_gpus": 8},
         "parallelism": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 3, "micro_batch_size": 1, "global_batch_size": 8},
         "training": {"seq_length": 2048, "precision": "bf16"}}


def _small(**training) -> dict:
    raw = copy.deepcopy(SMALL)
    raw["training"].update(training)
    return raw


def test_shipped_profiles_are_what_the_fit_writes():
    # validation/profiles/modern-*.yaml is what `python -m validation.modern --fit --write` writes; the shipped
    # files are rebuilt from them here and must match byte for byte (regenerate with --ship)
    docs = shipped_profiles()
    assert sorted(docs) == sorted(p.stem for p in FOLDER.glob("*.yaml"))
    for name, doc in docs.items():
        assert (FOLDER / f"{name}.yaml").read_text() == render(name, doc), f"{name}: run python -m validation.modern --ship"
    assert framework_names() == [DEFAULT_FRAMEWORK, *sorted(docs)]


def test_every_entry_names_fit_half_rows_of_its_framework():
    for name in framework_names()[1:]:
        profile = framework_profile(name)
        for entry in profile.entries:
            assert "fit half" in entry.fitted_on and entry.fit_cases >= 2
            assert entry.accelerator in ACCELERATORS.names()


def test_default_framework_is_the_catalog():
    plain = load_scenario(_small())
    named = load_scenario(_small(framework="megatron-core"))
    catalog = ACCELERATORS.get("h100-sxm-80g")
    # the catalog's constants (H100 holds no grouped kernel: torchtitan's, measured on B200, are not carried to it)
    assert plain.accelerator == named.accelerator == catalog == with_grouped_gemm_kernels(catalog, "megatron-core")
    # on B200, the catalog less the grouped kernels Megatron-Core does not run (torchtitan's)
    b200 = ACCELERATORS.get("b200")
    plain = load_scenario({**_small(), "cluster": {"node": "dgx-b200", "num_gpus": 8}})
    assert plain.accelerator == with_grouped_gemm_kernels(b200, "megatron-core")
    assert not plain.accelerator.efficiency.grouped_gemm and b200.efficiency.grouped_gemm
    assert plain.accelerator.model_copy(update={"efficiency": plain.accelerator.efficiency.model_copy(
        update={"grouped_gemm": b200.efficiency.grouped_gemm})}) == b200
    assert plain.frameworks[0].state == DEFAULT and plain.frameworks[0].entry is None


@pytest.mark.parametrize(("framework", "precision", "slower", "margin"), [
    ("torchtitan", "bf16", True, 1.05), ("llm-foundry", "bf16", True, 1.05), ("fms-fsdp", "bf16", True, 1.05),
    ("fms-fsdp-compile", "bf16", True, 1.05), ("nemo", "fp8", True, 1.0)])  # NeMo: 0.98 of the catalog curve
def test_switch_moves_step_time_in_the_fitted_direction(framework, precision, slower, margin):
    entry = choose(framework, ACCELERATORS.get("h100-sxm-80g"), precision).entry
    assert (entry.gemm_scale < 1) == slower  # the fit: slower than the catalog where its GEMM factor is below 1
    from simulator.cost.framework import with_framework_settings

    named = _small(precision=precision, framework=framework)
    same_settings, _ = with_framework_settings(named)  # the framework's own settings, then without its factors
    same_settings = copy.deepcopy(same_settings)
    del same_settings["training"]["framework"]
    base = simulate_point(same_settings)["step_time_s"]
    step = simulate_point(named)["step_time_s"]
    assert (step > base * margin) if slower else (step < base)


def test_choice_states_and_carry_over():
    h100, b200 = ACCELERATORS.get("h100-sxm-80g"), ACCELERATORS.get("b200")
    assert choose("llm-foundry", h100, "bf16").state == CALIBRATED
    tt = choose("torchtitan", h100, "bf16")  # fitted on Grand Teton's 500 W H100s: another board of the part
    assert tt.state == DERIVED and "500 W" in tt.note
    nemo_bf16 = choose("nemo", h100, "bf16")  # NeMo's fit is FP8 only: its factor carried to bf16
    assert nemo_bf16.state == DERIVED and nemo_bf16.entry.precisions == ["fp8"]
    blackwell = choose("torchtitan", b200, "bf16")  # Blackwell: the H100 factor, said to be carried over
    assert blackwell.state == DERIVED and blackwell.entry.accelerator == "h100-sxm-80g" and "b200" in blackwell.note
    assert choose("torchtitan", ACCELERATORS.get("mi325x"), "bf16").entry.accelerator == "mi300x"  # same vendor
    amd = choose("fms-fsdp", ACCELERATORS.get("mi300x"), "bf16")  # no AMD run of fms-fsdp: the catalog, assumed
    assert amd.state == ASSUMED and amd.entry is None and "assumed" in amd.note
    rowwise = choose("torchtitan", h100, "fp8", "rowwise")
    tensorwise = choose("torchtitan", h100, "fp8", "delayed")
    assert rowwise.entry.fp8_recipes == ["rowwise"] and tensorwise.entry.fp8_recipes is None
    assert rowwise.entry.gemm_scale < tensorwise.entry.gemm_scale


def test_unknown_framework_is_a_config_error_naming_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        load_scenario(_small(framework="pytorch-lightning"))
    assert info.value.field == "training.framework"
    assert all(name in info.value.reason for name in framework_names())


def test_cli_unknown_framework_exits_2_and_json_names_the_profile():
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", "--set", "training.framework=titan"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "training.framework" in bad.stderr and "torchtitan" in bad.stderr
    good = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", "examples/llama3-8b-torchtitan-sac-h100.yaml",
                           "--set", "cluster.node=dgx-b200", "--json"], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    doc = json.loads(good.stdout)
    assert doc["framework"] == "torchtitan" and doc["framework_state"] == DERIVED
    framework = doc["framework_profile"]
    assert framework["name"] == "torchtitan" and framework["state"] == DERIVED
    assert framework["fitted_for"]["accelerator"] == "h100-sxm-80g" and "fit half" in framework["fitted_on"]
    assert doc["efficiency_states"]["framework_factors"].startswith("derived")


def _first(name: str, group_part: str):
    groups = load_groups(SETS[name].profile_name)
    return next(c for c in built(name)[0] if c.profile_group in groups and group_part in c.profile_group)


@pytest.mark.parametrize(("case_set", "group"), [
    ("torchtitan", "|bf16"), ("torchtitan", "|fp8-rowwise"), ("torchtitan", "mi300x"), ("llmfoundry", "h100"),
    ("other", "fms-fsdp|h100"), ("vtrain_single", "megatron-deepspeed"), ("cnn_dle", "dle-pytorch|a100-sxm-80g|fp16"),
    ("cnn_dle", "dle-mxnet|v100-sxm-32g|fp32")])
def test_user_path_is_the_fitted_simulation_bit_for_bit(case_set, group):
    # what the validation reports as "fitted" is what a user gets by naming the framework on the catalog node
    case = _first(case_set, group)
    fitted = simulate_point(resolved_scenario(case, load_groups(SETS[case_set].profile_name)), run_if_oom=True)
    user = simulate_point(user_scenario(case), run_if_oom=True)
    assert user_framework(case) != DEFAULT_FRAMEWORK
    assert user["step_time_s"] == fitted["step_time_s"]


def test_framework_settings_fill_what_the_scenario_leaves_out_and_contrary_ones_are_warned():
    from simulator.cost.provenance import framework_setting_warnings

    assert framework_profile("torchtitan").fitted_with["training.fp8_saved_inputs"] is False
    fp8 = load_scenario(_small(precision="fp8", framework="torchtitan"))  # left out: torchao's setting applied
    assert fp8.training.fp8_saved_inputs is False and fp8.parallelism.cp_comm == "all_gather"
    assert "training.fp8_saved_inputs=false" in fp8.frameworks[0].settings
    assert framework_setting_warnings(fp8) == []
    given = load_scenario(_small(precision="fp8", framework="torchtitan", fp8_saved_inputs=True))  # given: kept
    assert given.training.fp8_saved_inputs is True
    (warning,) = framework_setting_warnings(given)
    assert "training.fp8_saved_inputs=true (fitted with false)" in warning
    bf16 = _small(framework="torchtitan", fp8_saved_inputs=True)  # bf16: nothing is saved in fp8, nothing to say
    assert framework_setting_warnings(load_scenario(bf16)) == []
    plain = load_scenario(_small())  # the default framework: the catalog, the schema defaults
    assert plain.frameworks[0].settings == () and plain.training.fp8_saved_inputs is True
    foundry = load_scenario(_small(framework="llm-foundry"))
    assert foundry.parallelism.zero3_backward_prefetch == "post" and foundry.training.fused_cross_entropy is True


def test_mixed_cluster_states_each_group_and_its_provenance():
    from simulator.cost.provenance import efficiency_provenance

    raw = _small(framework="torchtitan")
    raw["cluster"] = {"groups": [{"node": "dgx-h100", "nodes": 1}, {"node": "dgx-b200", "nodes": 1}]}
    raw["parallelism"].update(dp=16, global_batch_size=16)
    sc = load_scenario(raw)
    assert [c.state for c in sc.frameworks] == [DERIVED, DERIVED]
    assert "b200" in sc.frameworks[1].note and "b200" not in sc.frameworks[0].note
    provenance = efficiency_provenance(sc)
    assert "carried over" in provenance["dgx-h100:framework_factors"]
    assert "carried over" in provenance["dgx-b200:framework_factors"]


def test_framework_table_states_every_framework_on_the_parts_nobody_measured():
    from validation.modern.framework_table import UNMEASURED_PARTS, heldout_rows, unmeasured_markdown

    table = unmeasured_markdown().splitlines()
    assert len(table) == 2 + len(framework_names()) - 1 and all(p in table[0] for p in UNMEASURED_PARTS)
    torchtitan = next(line for line in table if line.startswith("| torchtitan |"))
    assert "bf16 derived (h100-sxm-80g bf16)" in torchtitan and "bf16 calibrated" in torchtitan  # B200; MI300X
    block = {"case_set": "x", "cases": [{"row": 1, "accelerator": "h100-sxm-80g", "precision": "bf16"},
                                        {"row": 2, "accelerator": "h100-sxm-80g", "precision": "bf16"}],
             "catalog_only": {"cases": [{"row": 1, "relative_error": 0.3}, {"row": 2, "relative_error": 0.5}]},
             "user_profile": {"cases": [
                 {"row": 1, "framework": "torchtitan", "state": "derived", "entry": "h100-sxm-80g bf16",
                  "relative_error": -0.05, "fits": True},
                 {"row": 2, "framework": "torchtitan", "state": "derived", "entry": "h100-sxm-80g bf16",
                  "relative_error": 0.10, "fits": True}]}}
    (row,) = heldout_rows([block])
    assert row["user"] == [-0.05, 0.10] and row["catalog"] == [0.3, 0.5] and row["state"] == "derived"


def test_constants_of_the_fitted_part_itself_stay_behind():
    # Megatron-DeepSpeed's A100 entry caps its GEMM curve at a share of the A100's best matmul and sets the A100
    # node's collective latency: on H100 only its framework factors (GEMM scale and tilt, host time) carry over
    a100 = choose("megatron-deepspeed", ACCELERATORS.get("a100-sxm-80g"), "fp16")
    h100 = choose("megatron-deepspeed", ACCELERATORS.get("h100-sxm-80g"), "bf16")
    assert {"gemm_ceiling", "intra_node_latency_us"} <= set(a100.factors)
    assert h100.state == DERIVED and set(h100.dropped) == {"gemm_ceiling", "intra_node_latency_us"}
    assert "gemm_ceiling" not in h100.factors and h100.factors["host_dispatch_us_per_kernel"] == 80.0
    plain = load_scenario(_small())
    sc = load_scenario(_small(framework="megatron-deepspeed"))
    assert sc.node.intra_node.latency_us == plain.node.intra_node.latency_us
    assert sc.accelerator.efficiency.host_dispatch_us_per_kernel == 80.0


def test_every_fitted_constant_of_a_shipped_framework_is_shipped():
    # a constant a fit learns to write (as sync_jitter was) must reach the shipped entry, not be dropped on the way
    from hardware_specs.framework import FACTOR_KEYS, HELDOUT_KEYS
    from validation.modern.shipped import FRAMEWORKS

    meta = {"fit_cases", "fit_median_abs_error", "fit_mean_abs_log_error", "fit_mean_set_median_abs_error",
            "fitted_on", *HELDOUT_KEYS}
    for profile, prefix, _ in FRAMEWORKS.values():
        for group, entry in load_groups(profile).items():
            if group.split("|")[0] == prefix:
                assert set(entry) <= set(FACTOR_KEYS) | meta, (group, set(entry) - set(FACTOR_KEYS) - meta)


def test_carry_over_check_chooses_as_if_the_part_was_never_measured():
    from simulator.cost.framework import choose_in

    profile = framework_profile("llm-foundry")
    h100 = ACCELERATORS.get("h100-sxm-80g")
    without = profile.model_copy(update={"entries": [e for e in profile.entries if e.accelerator != h100.name]})
    choice = choose_in(without, h100, "bf16")
    assert choice.state == DERIVED and choice.entry.accelerator == "a100-sxm-40g"  # slower part, nearest peak, by name
    fms = framework_profile("fms-fsdp")
    a100 = ACCELERATORS.get("a100-sxm-80g")
    only_h100 = fms.model_copy(update={"entries": [e for e in fms.entries if e.accelerator != a100.name]})
    assert choose_in(only_h100, a100, "bf16").state == ASSUMED  # never carried to a slower part


def test_specs_lists_the_frameworks_and_where_each_was_fitted(capsys):
    from simulator.cli import main

    assert main(["specs", "list", "--kind", "framework"]) == 0
    out = capsys.readouterr().out
    assert "torchtitan" in out and "h100-sxm-80g fp8 (rowwise)" in out and "megatron-core" not in out
    assert main(["specs", "show", "torchtitan", "--kind", "framework"]) == 0
    assert "fitted_with" in capsys.readouterr().out
