"""What the fourteenth session's newcomer walk (newcomer6) found, each checked as the user meets it (the CLI through a
subprocess where it is CLI behaviour):

- ``simulate --json``'s ``default_framework`` block gave each framework's median and max only, while the printed
  WARNING named where the rows were published, the 90th percentile and the worst row: the block now carries them
  and the WARNING is written from the block (one source).
- The send / all-to-all efficiency of a node whose ring collectives have fitted laws (``intra_node.
  collective_efficiency``: GB200's 0.83 from collectives_bandwidth.csv row 117, MI300X's 0.70 from row 110) had no
  provenance line: the catalog now records the row (``collective_efficiency_fitted_on``) and simulate lists
  ``intra_node_send_all_to_all``.
- ``clustersim search`` / ``scale`` of a wide-area scenario at a GPU count its regions do not hold ended in a
  RuntimeError traceback ("checking layout {...}: ConfigError: ...").
- ``clustersim.simulate`` (the notebook API) returned a result without the WARNINGs and provenance ``--json`` and the
  table carry, though its docstring said ``to_dict()`` is the ``--json`` object; ``clustersim.search`` dropped the
  rows' ``warnings`` and ``notes`` (``search --csv`` has them).
- ``clustersim scale``'s table had an unexplained ``eff`` column and, for a CNN, a per-GPU column of dashes.
- ``clustersim validate`` printed "TFLOP/s per GPU (incl. recompute) [TFLOP/s]".
- ``clustersim specs show megatron-core`` (the framework the no-framework WARNING names) said "no catalog entry".
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
from cli_run import refused_line, run_cli

import clustersim
from simulator.cost.default_framework import FrameworkSummary, framework_text, load

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
WAN = str(EXAMPLES / "gpt-1.7b-diloco-two-continents.yaml")
RESNET = str(EXAMPLES / "resnet50-8xa100.yaml")


_cli, _bad = run_cli, refused_line


@pytest.fixture(scope="module")
def default_json() -> dict:
    proc = _cli("simulate", "--json")  # the built-in default: GPT-3 175B on A100s, no training.framework
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


# --- 1. --json's default_framework block carries what the WARNING says ---------------------------------------


def test_json_default_framework_block_has_the_warnings_source_spread_and_worst_row(default_json):
    block = default_json["default_framework"]
    (part,) = block["heldout_catalog_only"]
    entry = next(e for e in part["by_framework"] if e["framework"] == "megatron-deepspeed")
    rows = sorted((r for r in load() if r.framework == "megatron-deepspeed" and r.accelerator == "a100-sxm-80g"
                   and r.relative_error is not None), key=lambda r: abs(r.relative_error))
    assert entry["rows"] == len(rows) == 766
    assert entry["source"] == "vTrain's Megatron-DeepSpeed iteration times, MICRO 2024"
    assert entry["sets"] == ["vtrain_multi", "vtrain_single"] and entry["shipped_profile"] is True
    assert entry["worst"] == {"set": "vtrain_single", "row": 682, "relative_error": round(rows[-1].relative_error, 5)}
    assert entry["abs_error_p90"] == round(abs(rows[math.ceil(0.9 * len(rows)) - 1].relative_error), 5)
    assert "abs_error_p90" in block["fields"] and "null under 20 rows" in block["fields"]
    few = next(e for e in part["by_framework"] if e["rows"] < 20)
    assert few["abs_error_p90"] is None and few["worst"]["set"]
    # the WARNING is those entries in words: every framework's line, read back from the JSON alone
    warning = " ".join(line.strip() for w in default_json["warnings"] for line in w.splitlines())
    for e in part["by_framework"]:
        said = framework_text(FrameworkSummary.from_dict(e))
        assert said in warning and f"({e['worst']['set']} row {e['worst']['row']})" in said


# --- 2. the send / all-to-all efficiency says where it comes from --------------------------------------------


def test_every_collective_efficiency_read_from_a_row_records_that_row():
    """Where a node's source says its collective_efficiency came from a row of collectives_bandwidth.csv, the
    catalog records the row in ``collective_efficiency_fitted_on`` (the provenance line is read from it); a row of
    another node's part is marked as transferred, so it reads as derived."""
    from hardware_specs.catalog import NODES

    said = {}
    for name, node in NODES.all().items():
        source = node.intra_node.source
        match = re.search(r"collective_efficiency from .*?collectives_bandwidth\.csv row (\d+)", source) or \
            re.search(r"efficiency from collectives_bandwidth\.csv row (\d+)", source)
        if match:
            said[name] = match.group(1)
    assert {"gb200-nvl72", "dgx-b200", "hgx-b200", "p6-b200", "dgx-b300", "gb300-nvl72", "mi300x-8"} <= set(said)
    for name, row in said.items():
        fitted_on = NODES.get(name).intra_node.collective_efficiency_fitted_on
        assert fitted_on and f"collectives_bandwidth.csv row {row} " in fitted_on, name
    with open(ROOT / "validation" / "data" / "microbench" / "collectives_bandwidth.csv", newline="") as f:
        lines = list(csv.reader(f))
    assert lines[117 - 1][:1] == ["GB200"] and lines[117 - 1][7] == "p2p_copy"   # row = the file's line
    assert lines[110 - 1][:1] == ["MI300X"] and lines[110 - 1][7] == "all_reduce"
    assert abs(float(lines[117 - 1][12]) / 900 - NODES.get("gb200-nvl72").intra_node.collective_efficiency) < 0.005
    assert abs(float(lines[110 - 1][12]) / 448 - NODES.get("mi300x-8").intra_node.collective_efficiency) < 0.005


@pytest.mark.parametrize(("node", "state", "origin"), [
    ("gb200-nvl72", "calibrated", ""), ("dgx-b200", "derived", "gb200-nvl72"), ("gb300-nvl72", "derived", "gb200-nvl72"),
    ("mi300x-8", "calibrated", ""), ("mi325x-8", "derived", "mi300x-8"), ("dgx-h100", "stated", "")])
def test_the_send_all_to_all_efficiency_has_a_provenance_line(node, state, origin):
    from simulator.cost.provenance import efficiency_provenance, provenance_state
    from simulator.scenario import load_scenario

    scenario = load_scenario({"model": "llama3-8b", "cluster": {"node": node, "num_gpus": 8}})
    where = efficiency_provenance(scenario)["intra_node_send_all_to_all"]
    got, source = provenance_state(where)
    assert (got, source[:len(origin)]) == (state, origin), where
    if state == "calibrated":
        assert "validation/data/microbench/collectives_bandwidth.csv row 1" in where


def test_simulate_and_specs_show_say_where_gb200s_link_efficiency_comes_from():
    proc = _cli("simulate", str(EXAMPLES / "llama3-70b-gb200-nvl72.yaml"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    calibrated = " ".join(line.strip() for line in proc.stdout.split("  efficiencies   ")[1].split("derived")[0]
                          .splitlines())
    assert "intra_node_send_all_to_all" in calibrated
    shown = _cli("specs", "show", "gb200-nvl72").stdout
    assert "collective_efficiency: 0.83" in shown and "collective_efficiency_fitted_on:" in shown
    assert "row 117" in shown.split("collective_efficiency_fitted_on:")[1].split("supports_nvls")[0]


# --- 3. search / scale of a scenario whose regions do not fit the GPU count -----------------------------------


def test_search_of_a_wan_scenario_at_a_count_its_regions_do_not_hold_is_one_line():
    line = _bad("search", WAN, "--set", "cluster.num_gpus=8", "--workers", "1")
    assert "cluster.fabric.regions: the regions hold 4 nodes" in line


def test_scale_says_which_gpu_count_its_regions_do_not_hold(tmp_path):
    line = _bad("scale", WAN, "--gpus", "8,32", "--out", str(tmp_path / "s"), "--workers", "1")
    assert "cluster.fabric.regions:" in line and line.endswith("(at --gpus 8)")
    assert not (tmp_path / "s" / "scaling.csv").exists()


# --- 4. the notebook API says what the command line says -----------------------------------------------------


def test_api_simulate_result_is_the_json_object_with_its_warnings_and_provenance(default_json):
    from simulator.report.result import finite_json

    result = clustersim.simulate()
    doc = json.loads(json.dumps(finite_json(result.to_dict()), default=str))
    cli = {k: v for k, v in default_json.items() if k != "memory_series_bytes"}
    assert doc == cli
    assert doc["warnings"] and doc["default_framework"]["used"] == "megatron-core"
    html = result._repr_html_()
    assert "efficiencies   calibrated" in html and "WARNING: no training.framework named" in html
    flat = result.to_flat_dict()
    assert not any(isinstance(v, dict) for v in flat.values())
    assert flat["efficiency_provenance.framework_factors"] == "assumed"


def test_api_search_has_the_columns_of_search_csv(tmp_path):
    space = {"micro_batch_size": [128, 256], "zero_stage": [0]}
    frame = clustersim.search(RESNET, space=space)
    out = tmp_path / "rows.csv"
    proc = _cli("search", RESNET, "--space", "micro_batch_size=128,256", "--space", "zero_stage=0", "--csv", str(out),
                "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with out.open(newline="") as f:
        header = next(csv.reader(f))
    assert list(frame.columns) == header
    assert {"rank", "warnings", "notes"} <= set(frame.columns)
    timed = frame[frame["rank"].notna()]   # the layouts simulated (the others were pruned by a bound or memory)
    assert list(timed["rank"][:2]) == [1, 2] and timed["warnings"].notna().all() and timed.fits.all()


# --- 5. scale's table and validate's units -------------------------------------------------------------------


def _scale_row(n: int, samples: float, tokens: float | None, eff: float) -> dict:
    return {"num_gpus": n, "global_batch_size": 256, "tp": 1, "pp": 1, "dp": n, "cp": 1, "virtual_stages": 1,
            "micro_batch_size": 8, "zero_stage": 0, "recompute": "none", "schedule": "1f1b", "sequence_parallel": False,
            "fits": True, "infeasible_reason": None, "samples_per_s": samples, "samples_per_s_per_gpu": samples / n,
            "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens / n if tokens else None, "mfu": 0.3,
            "scaling_efficiency": eff}


def test_scale_table_says_what_its_columns_are_and_gives_a_cnn_samples_per_gpu():
    from simulator.explore.scaling import render_table

    cnn = render_table([_scale_row(8, 16000.0, None, 1.0), _scale_row(16, 30000.0, None, 0.94)])
    header, first = cnn.splitlines()[:2]
    assert "smp/s/GPU" in header and "tok/s/GPU" not in header
    assert first.split()[-3] == "2,000.0"   # 16,000 samples/s on 8 GPUs
    legend = " ".join(line.strip() for line in cnn.splitlines()[3:])
    assert legend.startswith("columns:") and "eff: scaling efficiency" in legend and "smp/s/GPU: samples/s per GPU" \
        in legend
    llm = render_table([_scale_row(8, 10.0, 40960.0, 1.0)])
    assert "tok/s/GPU" in llm.splitlines()[0] and llm.splitlines()[1].split()[-3] == "5,120"
    assert max(map(len, (cnn + "\n" + llm).splitlines())) <= 110


def test_validate_says_the_unit_once():
    proc = _cli("validate", "--case-set", "narayanan2021_table1", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TFLOP/s per GPU (incl. recompute) " in proc.stdout and "[TFLOP/s]" not in proc.stdout


def test_specs_show_megatron_core_says_what_the_default_framework_is():
    """The no-framework WARNING says "priced as megatron-core"; ``specs show megatron-core`` answered "no catalog
    entry" (the default has no profile file, so ``specs list`` still lists none for it)."""
    proc = _cli("specs", "show", "megatron-core", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["default"] is True and shown["description"].startswith("the catalog constants")
    from simulator.cost.default_framework import DEFAULT_MEANING

    assert shown["description"] == DEFAULT_MEANING
    assert "no catalog entry 'megatron-core'" in _bad("specs", "show", "megatron-core", "--kind", "node")


def test_compare_on_a_kind_without_pipeline_stages_asks_for_rank_class():
    """A trace's rank maps to a pipeline stage by default; swarm's ranks are peers, so compare said
    "--rank-class: 'stage0' is not simulated" to a user who had given no --rank-class."""
    trace = str(ROOT / "tests" / "data" / "traces" / "gloo_cpu_two_steps.json")
    swarm = str(EXAMPLES / "swarm-t4-preemptible.yaml")
    proc = _cli("compare", swarm, "--trace", trace)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("clustersim: error:")]
    assert line.startswith("clustersim: error: --rank-class: needed here: the trace's rank is pipeline stage 'stage0'")
    assert "give one of: peer0, " in line
    ok = _cli("compare", swarm, "--trace", trace, "--rank-class", "peer0")
    assert ok.returncode == 0 and "simulated step (peer0)" in ok.stdout


def test_deeppool_plan_says_how_many_layers_run_on_each_gpu_count():
    """The plan's header said "GPUs per layer {4: 8, 8: 23, 1: 9}": layer counts keyed by GPU count, read as
    "layer 4 on 8 GPUs". Now "23 layers on 8 GPUs, 8 on 4 GPUs, 9 on 1 GPU", and they add up to the network."""
    proc = _cli("plan", str(EXAMPLES / "vgg16-deeppool-8xa100.yaml"), "--planner", "deeppool", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    summary = doc["summary"]
    assert "GPUs per layer" not in summary
    counts = re.search(r"\): (\d+) layers on (\d+) GPUs((?:, \d+ on \d+ GPUs?)*);", summary)
    assert counts, summary
    pairs = [(int(counts.group(1)), int(counts.group(2)))] + [
        (int(a), int(b)) for a, b in re.findall(r", (\d+) on (\d+) GPU", counts.group(3))]
    per_layer = doc["details"]["gpus_per_layer"]
    assert sum(n for n, _ in pairs) == len(per_layer)
    gpus = list(per_layer.values())   # layer -> its GPU count
    assert sorted(pairs, key=lambda p: p[1]) == sorted(((gpus.count(g), g) for g in set(gpus)), key=lambda p: p[1])


def test_plan_refuses_co_located_jobs_before_planning():
    """Every planner returns a per_layer or replicated_pipeline plan, which co-location cannot run: plan printed
    "# the plan cannot run" (exit 0) after the planner's work; now refused as search and scale refuse it."""
    line = _bad("plan", str(EXAMPLES / "vgg16-with-background-8xa100.yaml"), "--planner", "deeppool")
    assert line.startswith("clustersim: error: co_located_jobs: plan explores one job's layouts")


def test_steps_below_one_names_the_option_typed():
    assert _bad("simulate", RESNET, "--steps", "0") == "clustersim: error: --steps: must be at least 1, got 0"


def test_the_api_names_its_own_arguments_and_refuses_an_unknown_mode(tmp_path):
    with pytest.raises(clustersim.ConfigError, match=r"^num_gpus: must be a positive integer, got 0$"):
        clustersim.search(RESNET, num_gpus=0)
    with pytest.raises(clustersim.ConfigError, match=r"^space\.tp: values must be positive integers, got 0$"):
        clustersim.search(RESNET, space={"tp": [0]})
    with pytest.raises(clustersim.ConfigError, match=r"^out: must end in \.csv or \.parquet"):
        clustersim.sweep({"base": RESNET, "grid": {"parallelism.micro_batch_size": [128]}}, tmp_path / "rows.txt")
    existing = tmp_path / "rows.csv"
    existing.write_text("x\n")
    with pytest.raises(clustersim.ConfigError, match=r"pass resume=True to continue it or force=True to overwrite"):
        clustersim.sweep({"base": RESNET, "grid": {"parallelism.micro_batch_size": [128]}}, existing)
    with pytest.raises(clustersim.ConfigError, match=r"^mode: must be 'symmetric' or 'full'"):
        clustersim.simulate(RESNET, mode="asymmetric")   # was run as symmetric, silently


def test_plots_of_a_step_under_a_second_are_in_milliseconds_as_the_table_is():
    """The table gives a sub-second step's breakdown in ms (session 13); plot's bars read "4.21e-05 s" and its
    timeline's axis 0.000-0.020 s beside "events shorter than 0.0145 ms drawn that wide"."""
    from simulator.report.plots import memory_over_time_figure, time_breakdown_figure, timeline_figure

    ax = time_breakdown_figure({"compute": 0.0209, "dp_comm": 4.21e-05}, 0.0217, title="t").axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert " 20.9 ms (96.3%)" in texts and " 0.0421 ms (0.2%)" in texts
    assert ax.get_xlabel().startswith("milliseconds per step")
    long = time_breakdown_figure({"compute": 20.0, "dp_comm": 7.3}, 27.3).axes[0]
    assert " 20 s (73.3%)" in [t.get_text() for t in long.texts] and long.get_xlabel().startswith("seconds per step")
    events = [{"rank_class": "r", "stream": "compute", "category": "compute", "start_s": 0.0, "end_s": 0.02}]
    timeline = timeline_figure(events).axes[0]
    assert timeline.get_xlabel().startswith("time in the step (ms)") and timeline.get_xlim()[1] > 15
    memory = memory_over_time_figure({"r": [(0.0, 2**30), (0.02, 2 * 2**30)]}, 80.0).axes[0]
    assert memory.get_xlabel() == "time (ms)"


def test_a_negative_count_in_a_list_is_named_by_the_option_not_taken_for_an_option():
    """argparse took ``-8,16`` for an option: "argument --gpus: expected one argument"."""
    assert _bad("scale", RESNET, "--gpus", "-8,16") == "clustersim: error: --gpus: GPU counts must be positive, got -8"
    from simulator.cli import _negative_lists_joined

    assert _negative_lists_joined(["scale", "--gpus", "-8,16", "--json"]) == ["scale", "--gpus=-8,16", "--json"]
    assert _negative_lists_joined(["search", "--workers", "-1", "--top", "3"]) == [
        "search", "--workers", "-1", "--top", "3"]   # one plain negative number: argparse reads it already
