"""``clustersim plan SCENARIO --planner NAME`` end to end (subprocesses, started together), and
DAPPLE's planner against ``clustersim search`` on DAPPLE's own V100 profiles
(validation/data/profiles/dapple_*.txt, from AlibabaPAI/DAPPLE@fd75dcf profiling_results/)."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.explore.planners import get_planner
from simulator.explore.planners.dapple import bottleneck_cut, replica_vectors
from simulator.explore.search import SearchSpace, search
from simulator.scenario import load_scenario
from simulator.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def _each_plan_simulated_once():
    """The in-process planner runs of this module simulate many of the same plans (DAPPLE's default run
    simulates every plan of DAPPLE alone before its extension's): the cost oracle
    (simulator/explore/planners/oracle.py) simulates each distinct plan once per module. It still counts
    every call (``simulated``, the planners' budgets and "plans simulated"), and an evaluation depends only
    on the plan's scenario mapping, the memo's key (pickled: an unequal mapping only misses the memo)."""
    from simulator.explore.planners import oracle

    original = oracle.Oracle.evaluate
    memo: dict[bytes, tuple] = {}

    def evaluate(self, raw):
        key = pickle.dumps(raw)
        if key not in memo:
            before = self.simulated
            e = original(self, raw)
            self.simulated = before  # counted below, once, as every call is
            memo[key] = (e.step_time_s, e.samples_per_s, e.fits, e.reason)
        self.simulated += 1
        return oracle.Evaluation(raw, *memo[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(oracle.Oracle, "evaluate", evaluate)
        yield
PROFILES = ROOT / "validation" / "data" / "profiles"
NODE = {  # 4 V100s per node on NVLink, 25 Gb/s Ethernet between nodes (a small DAPPLE "Config A")
    "name": "v100x4-25gbe", "accelerator": "v100-sxm-32g", "gpus_per_node": 4,
    "intra_node": {"kind": "nvswitch", "bandwidth_per_gpu_gb_per_s": 150, "latency_us": 3,
                   "collective_efficiency": 0.8, "supports_nvls": False, "source": "test"},
    "nics_per_node": 1, "nic_bandwidth_gbit_per_s": 25, "nic_efficiency": 0.9, "nic_latency_us": 10,
    "host_memory_gib": 244, "source": "test",
}
# (profile file, profiled batch, sample kind): DAPPLE's five V100 profiles
MODELS = {"gnmt": ("dapple_gnmt-16-pbs-64.txt", 64, "sentence"), "bert": ("dapple_bert-24-pbs-6.txt", 6, "sequence"),
          "vgg": ("dapple_vgg-19-pbs-32.txt", 32, "image"), "amoebanet": ("dapple_amoeba-18-pbs-8.txt", 8, "image"),
          "xlnet": ("dapple_xlnet-24-pbs-1.txt", 1, "sequence")}


def dapple_scenario(model: str, gpus: int = 8, batch: int = 128) -> dict:
    path, profile_batch, sample = MODELS[model]
    return {"name": f"{model}-dapple", "model": {"name": model, "family": "profile", "format": "pipedream",
                                                 "path": str(PROFILES / path), "profile_batch": profile_batch,
                                                 "sample_kind": sample},
            "cluster": {"node": NODE, "num_gpus": gpus}, "parallelism": {"global_batch_size": batch},
            "training": {"precision": "fp32"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    scenario = tmp / "gnmt.yaml"
    scenario.write_text(yaml.safe_dump(dapple_scenario("gnmt")))
    py = [sys.executable, "-m", "simulator", "plan", str(scenario)]
    cases = {
        "out": py + ["--planner", "dapple", "--out", str(tmp / "plan.yaml")],
        "print": py + ["--planner", "dapple", "--option", "max_stages=2", "--option", "refine=0",
                       "--option", "max_virtual_stages=1"],
        "json": py + ["--planner", "dapple", "--json", "--gpus", "4", "--option", "refine=0"],
        "unknown_planner": py + ["--planner", "nope"],
        "unknown_option": py + ["--planner", "dapple", "--option", "stages=2"],
        "bad_option": py + ["--planner", "dapple", "--option", "max_stages=zero"],
        "no_planner": py,
        # one stage (pure data parallelism): 12 sentences cannot split over its replicas (with more stages
        # DAPPLE finds 4 x 2 since parallelism: lays out only tp x cp x pp for replicated_pipeline)
        "bad_batch": py + ["--planner", "dapple", "--option", "max_stages=1",
                           "--set", "parallelism.global_batch_size=12"],
        "pase": [sys.executable, "-m", "simulator", "plan", str(ROOT / "examples" / "vgg16-pase-32x1080ti.yaml"),
                 "--planner", "pase", "--out", str(tmp / "pase.yaml"),
                 "--set", "parallelism.micro_batch_size=8"],  # per_layer reads none: the plan must not state it
        "pase_bad_dims": py + ["--planner", "pase", "--option", "dims=batch,depth"],
        "adaptive": [sys.executable, "-m", "simulator", "plan", str(ROOT / "examples" / "vgg16-adaptive-8xa100.yaml"),
                     "--planner", "adaptive", "--option", "gpus=4", "--out", str(tmp / "adaptive.yaml")],
        "adaptive_bad_choices": py + ["--planner", "adaptive", "--option", "choices=data,zigzag"],
    }
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp)
             for name, argv in cases.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        out[name] = subprocess.CompletedProcess(cases[name], proc.returncode, stdout, stderr)
    return tmp, out


def test_plan_writes_a_scenario_that_simulates_to_the_reported_step(runs):
    tmp, out = runs
    done = out["out"]
    assert done.returncode == 0, done.stderr
    assert "cost to find:" in done.stdout and "plans estimated" in done.stdout
    cost = next(line for line in done.stdout.splitlines() if line.startswith("# cost to find:"))
    assert re.fullmatch(r"# cost to find: \d+\.\d\d s wall, \d+\.\d\d CPU-s \(this process and its workers\), "
                        r"\d+ plans estimated, \d+ simulated", cost), cost
    text = (tmp / "plan.yaml").read_text()
    assert text.startswith("# plan found by `clustersim plan --planner dapple`")
    raw = yaml.safe_load(text)
    # GNMT-16 on 8 V100s: DAPPLE's plan (2 stages x 4 replicas, one more micro-batch in flight on stage 0,
    # 0.0739403 s), beaten by the extension's interleaved schedule over 4 chunks cut balanced -- by the
    # schedule estimate since the balanced cut is chosen on it (simulator/strategies/spmd/split.py):
    # 0.071563 s, 1.033x (the min-max cut did not beat DAPPLE's plan)
    assert raw["strategy"]["kind"] == "spmd"
    assert {k: raw["parallelism"][k] for k in ("pp", "dp", "virtual_stages", "schedule", "pp_split")} == {
        "pp": 2, "dp": 4, "virtual_stages": 2, "schedule": "interleaved", "pp_split": "balanced"}
    assert "# DAPPLE: 2 stage(s), layers [51, 43], replicas [4, 4], 32 micro-batches, ZeRO 1, warm-up K_i = S - i + 1" in text
    assert ("# then the simulator's schedule choice (an extension, not in DAPPLE): interleaved 1F1B, 2 stage(s) x 4 "
            "replicas, 2 chunks per stage cut balanced, 32 micro-batches, ZeRO 1 = 0.071563 s (1.033x)") in text
    assert "# DAPPLE's early backward with K_i = S - i + 1 micro-batches in flight on every stage but the last" in text
    reported = float(text.split("simulated step time ")[1].split(" s,")[0])
    assert simulate(load_scenario(raw)).step_time_s == pytest.approx(reported, rel=1e-5)


def test_plan_prints_the_yaml_and_json(runs):
    _, out = runs
    assert out["print"].returncode == 0, out["print"].stderr
    printed = yaml.safe_load(out["print"].stdout)
    assert len(printed["strategy"]["stages"]) <= 2
    assert out["json"].returncode == 0, out["json"].stderr
    result = json.loads(out["json"].stdout)
    assert result["scenario"]["cluster"]["num_gpus"] == 4
    assert sum(s["replicas"] for s in result["details"]["dapple_scenario"]["strategy"]["stages"]) == 4
    assert result["step_time_s"] <= result["details"]["dapple_step_s"]
    assert result["plans_simulated"] >= 1 and result["plans_estimated"] >= result["plans_simulated"]
    assert result["wall_s"] > 0
    # CPU seconds beside wall (issue 22 "what it cost to find"; wall alone says little on a loaded machine):
    # the search priced and simulated plans, so it took CPU time, and no more than the process's own total
    assert 0 < result["cpu_s"]


@pytest.mark.parametrize(("case", "field"), [
    ("unknown_planner", "--planner"), ("unknown_option", "--option stages"), ("bad_option", "--option max_stages"),
    ("no_planner", "--planner"), ("bad_batch", "parallelism.global_batch_size"), ("pase_bad_dims", "--option dims"),
    ("adaptive_bad_choices", "--option choices"),
])
def test_bad_input_is_one_line_naming_the_field_and_exit_2(runs, case, field):
    _, out = runs
    done = out[case]
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert field in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_pase_writes_the_example_plan(runs):
    """PaSE on examples/vgg16-pase-32x1080ti.yaml finds the plan the example holds."""
    tmp, out = runs
    assert out["pase"].returncode == 0, out["pase"].stderr
    found = yaml.safe_load((tmp / "pase.yaml").read_text())
    example = yaml.safe_load((ROOT / "examples" / "vgg16-pase-32x1080ti.yaml").read_text())
    assert found["strategy"] == example["strategy"]
    assert "layer and reshard costs priced" in out["pase"].stdout
    # the input's micro_batch_size (8) is not written: per_layer does not read it, so simulate would only NOTE it
    assert found["parallelism"] == example["parallelism"] == {"global_batch_size": 256}
    assert "does not read" not in out["pase"].stderr


def test_adaptive_writes_the_example_plan_that_simulates_to_its_step(runs):
    """The adaptive per-component planner on examples/vgg16-adaptive-8xa100.yaml finds the plan the
    example holds, says what changes at 4 GPUs, and the written YAML simulates to the reported step."""
    tmp, out = runs
    done = out["adaptive"]
    assert done.returncode == 0, done.stderr
    assert "at gpus 4:" in done.stdout and "best uniform choice simulated" in done.stdout
    text = (tmp / "adaptive.yaml").read_text()
    assert text.startswith("# plan found by `clustersim plan --planner adaptive`")
    raw = yaml.safe_load(text)
    example = yaml.safe_load((ROOT / "examples" / "vgg16-adaptive-8xa100.yaml").read_text())
    assert raw["strategy"] == example["strategy"]
    reported = float(text.split("simulated step time ")[1].split(" s,")[0])
    assert simulate(load_scenario(raw)).step_time_s == pytest.approx(reported, rel=1e-5)


def test_dapple_finds_the_example_plan():
    """DAPPLE on examples/gnmt16-dapple-v100.yaml (the catalog GNMT-16, 16 V100s in 2 servers,
    25 GbE) finds the plan the example holds, and it simulates to the planner's step."""
    raw = yaml.safe_load((ROOT / "examples" / "gnmt16-dapple-v100.yaml").read_text())
    found = get_planner("dapple").run(raw, {})
    assert found.scenario["strategy"] == raw["strategy"]
    assert simulate(load_scenario(raw)).step_time_s == pytest.approx(found.step_time_s, rel=1e-12)


def test_replica_vectors_keep_stages_inside_a_node_or_on_whole_nodes():
    vectors = replica_vectors(8, 4, 2)
    assert (4, 4) in vectors and (1, 3) not in vectors  # 1 + 3 leaves 4 GPUs: fine; (1, 3) uses only 4
    assert (2, 6) not in vectors  # 6 GPUs from the middle of a node would straddle nodes
    assert (3, 5) not in vectors
    assert replica_vectors(8, 4, 1) == [(8,)]
    assert all(sum(v) == 8 for s in range(1, 5) for v in replica_vectors(8, 4, s))


def test_bottleneck_cut_is_the_best_contiguous_cut():
    """Against every cut of 6 layers into 3 stages, the second stage twice as fast."""
    import itertools

    import numpy as np

    times = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    prefixes = [np.concatenate([[0.0], np.cumsum(np.array(times) * f)]) for f in (1.0, 0.5, 1.0)]
    best = min(max(prefixes[i][b] - prefixes[i][a] for i, (a, b) in enumerate(zip((0, x, y), (x, y, 6), strict=True)))
               for x, y in itertools.combinations(range(1, 6), 2))
    counts = bottleneck_cut(prefixes, 6)
    starts = np.concatenate([[0], np.cumsum(counts)])
    found = max(prefixes[i][starts[i + 1]] - prefixes[i][starts[i]] for i in range(3))
    assert found == pytest.approx(best, rel=1e-6)
    assert bottleneck_cut(prefixes, 2) is None


def test_unknown_planner_in_process():
    with pytest.raises(ConfigError, match="known: adaptive, dapple"):
        get_planner("pipedream")


def _best_search_step(raw, space=None) -> float:
    rows = search(raw, workers=1, space=space)
    return min(r["step_time_s"] for r in rows if r.get("fits") and r.get("step_time_s"))


@pytest.fixture(scope="module")
def search_rows():
    """Every uniform layout ``clustersim search`` simulates for each model on 8 V100s (fits, with a step):
    the even split only (``pp_split: even``; the search also tries the cost-balanced cut, which is a
    non-uniform split of the kind DAPPLE's planner itself makes)."""
    return {model: [r for r in search(dapple_scenario(model), workers=1, space=SearchSpace(pp_split=["even"]))
                    if r.get("fits") and r.get("step_time_s")] for model in MODELS}


@pytest.fixture(scope="module")
def dapple_steps():
    return {model: get_planner("dapple").run(dapple_scenario(model), {}) for model in MODELS}


@pytest.fixture(scope="module")
def dapple_alone():
    """DAPPLE's plan space only (one model chunk per device: ``max_virtual_stages=1``)."""
    return {model: get_planner("dapple").run(dapple_scenario(model), {"max_virtual_stages": 1}) for model in MODELS}


# planner / search's best on 8 V100s (2 nodes of 4, 25 GbE), batch 128: DAPPLE alone (its K_i chosen)
DAPPLE_ALONE_RATIO = {"gnmt": 0.955, "bert": 0.986, "vgg": 0.709, "amoebanet": 1.000, "xlnet": 1.000}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_dapple_alone_is_no_slower_than_the_best_uniform_layout(model, dapple_alone, search_rows):
    """The DAPPLE acceptance check of issue 22 on 8 V100s (2 nodes of 4, 25 GbE), global batch 128:
    the plan DAPPLE's planner finds in its own plan space (no interleaving) simulates no slower
    than the best layout `clustersim search` finds over its whole space, interleaved schedules
    included (planner / search: GNMT 0.955, BERT 0.986, VGG 0.709, AmoebaNet 1.000, XLNet 1.000;
    at 16 GPUs: benchmarks/bench_dapple_planner.py)."""
    found = dapple_alone[model]
    best = min(r["step_time_s"] for r in search_rows[model])
    assert found.scenario["strategy"]["kind"] == "replicated_pipeline"
    assert "extension_simulated" not in found.details and found.step_time_s == found.details["dapple_step_s"]
    assert found.step_time_s <= best * (1 + 1e-9), (found.summary, found.step_time_s, best)
    assert found.step_time_s / best == pytest.approx(DAPPLE_ALONE_RATIO[model], abs=5e-4)


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(MODELS))
def test_dapple_with_the_extension_is_no_slower_than_dapple_alone(model, dapple_steps, dapple_alone):
    """The default planner (DAPPLE, then the interleaving extension) returns the faster of the two:
    never slower than DAPPLE alone; on BERT the extension wins (1.425 s against 1.433 s)."""
    found, alone = dapple_steps[model], dapple_alone[model]
    assert found.step_time_s <= alone.step_time_s * (1 + 1e-9)
    assert found.details["dapple_step_s"] == pytest.approx(alone.step_time_s, rel=1e-12)
    if model == "bert":
        assert found.scenario["strategy"]["kind"] == "spmd" and found.scenario["parallelism"]["virtual_stages"] > 1
        assert found.step_time_s < alone.step_time_s


@pytest.fixture(scope="module")
def gnmt_papers_warm_up():
    """DAPPLE's plan of GNMT-16 with the paper's warm-up K_i = S - i and no interleaving."""
    return get_planner("dapple").run(dapple_scenario("gnmt"), {"max_virtual_stages": 1, "max_extra_warmup": 0})


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="DAPPLE with the paper's warm-up K_i = S - i and no interleaving: GNMT-16 "
                                       "on 8 V100s 0.08091 s against search's interleaved pp 2 x dp 4 0.07739 s "
                                       "(1.045); met with one more micro-batch in flight (0.07394 s, 0.955)")
def test_dapple_with_the_papers_warm_up_alone_on_gnmt(gnmt_papers_warm_up, search_rows):
    found = gnmt_papers_warm_up
    assert found.step_time_s <= min(r["step_time_s"] for r in search_rows["gnmt"]) * (1 + 1e-9)


@pytest.mark.slow
def test_on_gnmt_the_papers_warm_up_is_the_best_one_chunk_layout_and_a_deeper_one_wins(gnmt_papers_warm_up, dapple_alone,
                                                                                      search_rows):
    """GNMT-16 on 8 V100s: with DAPPLE's K_i = S - i the planner's plan (2 x 4, cut 47/47, ZeRO-1:
    0.08091 s) is the best layout with one chunk per device search finds, to 1e-9, and every faster
    layout is interleaved (virtual stages > 1: Narayanan et al. 2021 Sec. 2.2.2; search's best
    0.07739 s), which DAPPLE's plan space cannot express. With stage 0 one micro-batch ahead
    (K_0 = 3) the sends over the Ethernet overlap with its forwards, the balanced cut 51/43 pays,
    and DAPPLE's plan beats search's best: 0.07394 s."""
    paper = gnmt_papers_warm_up
    rows = search_rows["gnmt"]
    faster = [r for r in rows if r["step_time_s"] < paper.step_time_s * (1 - 1e-9)]
    assert faster and all(r["parallelism"]["virtual_stages"] > 1 for r in faster)
    one_chunk = min(r["step_time_s"] for r in rows if r["parallelism"]["virtual_stages"] == 1)
    assert paper.step_time_s == pytest.approx(one_chunk, rel=1e-9)
    assert "extra_warmup" not in paper.scenario["strategy"]
    found = dapple_alone["gnmt"]
    strategy = found.scenario["strategy"]
    assert strategy["extra_warmup"] == 1 and [s["layers"] for s in strategy["stages"]] == [51, 43]
    assert found.step_time_s < min(r["step_time_s"] for r in faster)


@pytest.mark.slow
def test_dapples_baselines_are_always_simulated(dapple_alone, search_rows):
    """Pure data parallelism (with and without ZeRO-1) and the straight pipeline (8 stages of one
    GPU, beyond ``max_stages`` 4) are simulated for every model; on BERT-24, where DAPPLE's latency
    model ranks data parallelism with ZeRO-1 first, data parallelism without it (1.452 s, search's
    dp 8 exactly) is what the planner's paper-warm-up plan space returns."""
    for model, found in dapple_alone.items():
        depths = {len(d["stages"]) for d in found.details["simulated"]}
        assert {1, 8} <= depths, (model, depths)
        dp_zero = {d["zero_stage"] for d in found.details["simulated"] if len(d["stages"]) == 1}
        assert dp_zero == {0, 1}, model
        assert found.details["data_parallel_step_s"] is not None
    paper = get_planner("dapple").run(dapple_scenario("bert"), {"max_virtual_stages": 1, "max_extra_warmup": 0})
    dp8 = min(r["step_time_s"] for r in search_rows["bert"] if r["parallelism"]["dp"] == 8)
    assert len(paper.scenario["strategy"]["stages"]) == 1 and paper.scenario["parallelism"].get("zero_stage", 0) == 0
    assert paper.step_time_s == pytest.approx(dp8, rel=1e-9) == pytest.approx(1.452, abs=5e-4)


def test_the_extension_off_is_dapple_alone():
    """``max_virtual_stages=1`` keeps DAPPLE's own plan space: a replicated pipeline, and no plan
    simulated by the extension."""
    found = get_planner("dapple").run(dapple_scenario("gnmt", gpus=4), {"max_virtual_stages": 1, "refine": 0,
                                                                        "max_stages": 2})
    assert found.scenario["strategy"]["kind"] == "replicated_pipeline"
    assert "extension_simulated" not in found.details and found.step_time_s == found.details["dapple_step_s"]


@pytest.mark.slow
def test_dapple_replicates_stages_unequally_where_it_pays():
    """DAPPLE's "Config B" (one V100 per server, 25 GbE), VGG-19 on 8 servers, batch 128: the
    convolutions' stage takes the most replicas and the fully connected layers' stage one GPU
    (their 120 M parameters all-reduced over nothing), and the plan beats every uniform layout
    search finds (simulated: 0.139 s against 0.383 s for pp 2 x dp 4)."""
    raw = dapple_scenario("vgg", batch=128)
    raw["cluster"]["node"] = {**NODE, "name": "v100x1-25gbe", "gpus_per_node": 1}
    found = get_planner("dapple").run(raw, {})
    replicas = [s["replicas"] for s in found.scenario["strategy"]["stages"]]
    assert len(set(replicas)) > 1 and replicas[0] == max(replicas) and replicas[-1] == 1, found.summary
    assert found.step_time_s < _best_search_step(raw)


def test_the_planners_probe_builds_with_a_batch_smaller_than_the_gpus():
    """U-Net's 2 images on 8 A100s: the probe DAPPLE's and the adaptive planner's pipeline choice read
    the model, the cluster and the batch from builds (it needs no data-parallel degree); each plan
    then checks its own divisibility."""
    from simulator.explore.planners.dapple import base_scenario
    from simulator.explore.sweep import absolutize

    path = ROOT / "examples" / "unet-domain-parallel-8xa100.yaml"
    scenario = base_scenario(absolutize(yaml.safe_load(path.read_text()), path.parent))
    assert (scenario.parallelism.global_batch_size, scenario.num_gpus) == (2, 8)
