"""Mixed clusters (issue 21): node groups, per-rank compute speed, per-group NICs and memory.

Exact timelines on a toy cluster of two one-GPU nodes, one GPU half as fast (half the peak and
half the memory bandwidth, flat efficiency, no launch overhead, so every kernel takes exactly twice
as long) and with half the NIC rate: a data-parallel step is the slower rank's passes, then the
all-reduce at the slower NIC, then the slower rank's optimizer step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.report.result import unwrap_table
from simulator.scenario import gradient_bytes, load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mixed-a100-t4.yaml"
SWEEP = ROOT / "examples" / "sweeps" / "mixed-a100-t4.yaml"


def _accelerator(name: str, scale: float) -> dict:
    return {"name": name, "vendor": "toy", "peak_tflops": {"fp16": 100 * scale}, "hbm_gib": 80 * scale,
            "hbm_bandwidth_gb_per_s": 1000 * scale, "tdp_watts": 300,
            "efficiency": {"gemm_curve": [{"gflop": 1, "efficiency": 1.0}], "memory_bound_efficiency": 1.0,
                           "kernel_launch_overhead_us": 0, "source": "toy: assumed"}, "source": "toy"}


def _node(name: str, scale: float, nic_gbit: float, gpus: int = 1) -> dict:
    return {"name": name, "accelerator": _accelerator(f"{name}-gpu", scale), "gpus_per_node": gpus,
            "intra_node": {"kind": "pcie", "bandwidth_per_gpu_gb_per_s": 10, "latency_us": 1,
                           "collective_efficiency": 1.0, "source": "toy"},
            "nics_per_node": 1, "nic_bandwidth_gbit_per_s": nic_gbit, "nic_efficiency": 1.0, "nic_latency_us": 10,
            "host_memory_gib": 64, "source": "toy"}


FAST, SLOW = _node("fast", 1.0, 80), _node("slow", 0.5, 40)
TOY = {
    "model": {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 8,
              "vocab_size": 1024, "seq_length": 128},
    "cluster": {"groups": [{"node": FAST, "nodes": 1}, {"node": SLOW, "nodes": 1}],
                "fabric": {"name": "toy", "levels": 1, "switch_latency_us": 0, "source": "toy"}},
    "training": {"precision": "fp16", "attention": "standard"},
    "parallelism": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 2, "overlap_grad_reduce": False},
    "simulation": {"mode": "full"},
}


def _with(base: dict, **sections) -> dict:
    """A copy of ``base`` with sections updated one level deep (``cluster`` replaced whole)."""
    out = json.loads(json.dumps(base))
    for key, value in sections.items():
        if key != "cluster" and isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


def _events(result) -> dict[tuple[str, str], tuple[float, float]]:
    return {(e.rank_class, e.name): (e.start_s, e.end_s) for e in result.timeline}


def test_groups_resolve_in_rank_order():
    sc = load_scenario(TOY)
    assert sc.mixed and sc.num_gpus == 2 and sc.num_nodes == 2
    assert [g.node.name for g in sc.groups] == ["fast", "slow"]
    assert sc.rank_accelerator(0).name == "fast-gpu" and sc.rank_accelerator(1).name == "slow-gpu"
    assert sc.rank_node(1).nic_bandwidth_gbit_per_s == 40
    assert sc.cluster_label == "1x fast + 1x slow"
    with pytest.raises(IndexError):
        sc.rank_group(2)


def test_data_parallel_step_is_the_slower_rank_then_the_all_reduce_at_the_slower_nic():
    result = simulate(load_scenario(TOY))
    ev = _events(result)
    fast_f, slow_f = ev[("rank0", "F.mb0.c0.compute")], ev[("rank1", "F.mb0.c0.compute")]
    fast_b, slow_b = ev[("rank0", "B.mb0.c0.compute")], ev[("rank1", "B.mb0.c0.compute")]
    # every kernel of the half-speed GPU takes exactly twice as long
    assert slow_f[1] - slow_f[0] == pytest.approx(2 * (fast_f[1] - fast_f[0]), rel=1e-12)
    assert slow_b[1] - slow_b[0] == pytest.approx(2 * (fast_b[1] - fast_b[0]), rel=1e-12)
    # the all-reduce starts when the slower rank's backward ends, for both ranks
    reduce0, reduce1 = ev[("rank0", "grads.dp_grad_all_reduce")], ev[("rank1", "grads.dp_grad_all_reduce")]
    assert reduce0 == reduce1 and reduce0[0] == pytest.approx(slow_b[1], rel=1e-12)
    # 2 ranks on 2 nodes: the ring moves 2(n-1)/n S = S of (fp16) gradients through each NIC, at the
    # slower NIC's 40 Gb/s = 5 GB/s, after 2(n-1) = 2 steps of the 10 us NIC latency
    sc = load_scenario(TOY)
    grad_bytes = Planner(sc).stage_params_local(0) * gradient_bytes(sc.training)
    assert gradient_bytes(sc.training) == 2
    assert reduce0[1] - reduce0[0] == pytest.approx(2 * 10e-6 + grad_bytes / 5e9, rel=1e-9)
    fast_opt, slow_opt = ev[("rank0", "optimizer_step")], ev[("rank1", "optimizer_step")]
    assert slow_opt[1] - slow_opt[0] == pytest.approx(2 * (fast_opt[1] - fast_opt[0]), rel=1e-12)
    assert result.step_time_s == pytest.approx(slow_opt[1], rel=1e-12)
    assert result.step_time_s == pytest.approx(
        (slow_f[1] - slow_f[0]) + (slow_b[1] - slow_b[0]) + (reduce0[1] - reduce0[0]) + (slow_opt[1] - slow_opt[0]),
        rel=1e-12)


def test_homogeneous_slow_cluster_has_the_same_step():
    """Two slow GPUs: the same step as one fast and one slow (the fast one only waits)."""
    slow_only = _with(TOY, cluster={**TOY["cluster"], "groups": [{"node": SLOW, "nodes": 2}]})
    mixed = simulate(load_scenario(TOY)).step_time_s
    assert simulate(load_scenario(slow_only)).step_time_s == pytest.approx(mixed, rel=1e-12)


def test_pipeline_stages_on_different_gpus_take_different_times():
    raw = _with(TOY, parallelism={"pp": 2, "global_batch_size": 4, "micro_batch_size": 1})
    result = simulate(load_scenario(raw))
    ev = _events(result)
    f0, f1 = ev[("rank0", "F.mb0.c0.compute")], ev[("rank1", "F.mb0.c1.compute")]
    planner = Planner(load_scenario(raw))
    ops0 = tuple(op for op in planner._chunk_ops("F", 0) if op.kind != "collective")
    ops1 = tuple(op for op in planner._chunk_ops("F", 1) if op.kind != "collective")
    assert f0[1] - f0[0] == pytest.approx(planner.computes[0].ops_time_s(ops0), rel=1e-12)
    assert f1[1] - f1[0] == pytest.approx(planner.computes[1].ops_time_s(ops1), rel=1e-12)
    assert f1[1] - f1[0] == pytest.approx(2 * planner.computes[0].ops_time_s(ops1), rel=1e-12)


@pytest.mark.parametrize("sets", [
    {},
    {"parallelism": {"pp": 2, "global_batch_size": 8}},
    {"parallelism": {"tp": 2, "global_batch_size": 8}},
])
def test_symmetric_mode_equals_full_mode_on_a_mixed_cluster(sets):
    """Two nodes of 2 fast GPUs then two of 2 slow: symmetric mode represents each stage by its
    slowest group's rank, which every synchronous collective waits for anyway."""
    groups = [{"node": _node("fast2", 1.0, 80, gpus=2), "nodes": 2}, {"node": _node("slow2", 0.5, 40, gpus=2), "nodes": 2}]
    raw = _with(TOY, cluster={**TOY["cluster"], "groups": groups},
                parallelism={"global_batch_size": 8, "overlap_grad_reduce": True})
    raw = _with(raw, **sets)
    sc = load_scenario(raw)
    full = simulate(sc, mode="full").step_time_s
    assert simulate(sc, mode="symmetric").step_time_s == pytest.approx(full, rel=1e-9)
    assert simulate(sc, mode="symmetric", engine="fast").step_time_s == pytest.approx(full, rel=1e-9)


def test_memory_is_checked_per_group():
    """The fast GPUs hold 80 GiB, the slow 40: a layout needing more than 38 usable GiB fits the
    first group and not the second; the reason names the group."""
    raw = _with(TOY, model="gpt-1.7b", parallelism={"global_batch_size": 2})
    result = simulate(load_scenario(raw), run_if_oom=False)
    assert not result.fits
    assert "slow-gpu" in result.infeasible_reason and "cluster.groups.1" in result.infeasible_reason
    fast_only = simulate(load_scenario(_with(raw, cluster={**raw["cluster"], "groups": [{"node": FAST, "nodes": 2}]})),
                         run_if_oom=False)
    assert fast_only.fits


def test_result_names_the_groups():
    result = simulate(load_scenario(EXAMPLE))
    groups = result.extra["node_groups"]
    assert [(g["node"], g["accelerator"], g["gpus"], g["ranks"]) for g in groups] == [
        ("dgx-a100-80g", "a100-sxm-80g", 16, [0, 15]), ("g4dn-12xlarge", "t4", 16, [16, 31])]
    assert result.run["node"] == "2x dgx-a100-80g + 4x g4dn-12xlarge"
    assert result.run["accelerator"] == "a100-sxm-80g + t4"
    # MFU's peak is the mean over ranks: (16 x 312 + 16 x 65) / 32 fp16 TFLOP/s
    assert result.peak_tflops_per_gpu == pytest.approx((312 + 65) / 2)


def test_example_stage_on_t4s_is_slower_than_on_a100s():
    planner = Planner(load_scenario(EXAMPLE))
    assert planner.actor_ranks == {"stage0": 0, "stage1": 16}
    a100 = planner.chunk_pass_s(0, "F", 0)
    t4 = planner.chunk_pass_s(16, "F", 1)
    assert t4 > 3 * a100   # 312 vs 65 TFLOP/s fp16 peaks, 2039 vs 320 GB/s


def test_one_group_is_the_old_form():
    raw = _with(TOY, parallelism={"global_batch_size": 16})
    one = load_scenario(_with(raw, cluster={"groups": [{"node": "dgx-a100-80g", "nodes": 2}]}))
    old = load_scenario(_with(raw, cluster={"node": "dgx-a100-80g", "num_gpus": 16}))
    assert not one.mixed and one.num_gpus == 16 and one.node == old.node
    assert simulate(one).step_time_s == pytest.approx(simulate(old).step_time_s, rel=1e-12)


@pytest.mark.parametrize(("cluster", "field", "words"), [
    ({"groups": [{"node": "dgx-z100", "nodes": 1}]}, "cluster.groups.0.node", "unknown node"),
    ({"groups": [{"node": "dgx-a100-80g", "nodes": 0}]}, "cluster.groups.0.nodes", ""),
    ({"groups": [{"node": "dgx-a100-80g", "nodes": 1}], "node": "dgx-a100-80g"}, "cluster.groups", "not both"),
    ({"groups": [{"node": "dgx-a100-80g", "nodes": 1}, {"node": "g4dn-12xlarge", "nodes": 1}], "num_gpus": 16},
     "cluster.num_gpus", "12"),
    ({"groups": []}, "cluster.groups", ""),
    ({"groups": [{"node": "dgx-a100-80g"}]}, "cluster.groups.0.nodes", ""),
    ({"node": "dgx-a100-80g"}, "cluster.num_gpus", "required"),
])
def test_bad_groups_name_the_field(cluster, field, words):
    with pytest.raises(ConfigError) as exc:
        load_scenario(_with(TOY, cluster=cluster))
    assert exc.value.field == field
    assert words in str(exc.value)


def test_a_group_without_the_precision_is_refused():
    raw = _with(TOY, training={"precision": "bf16"},
                cluster={"groups": [{"node": "dgx-a100-80g", "nodes": 1}, {"node": "g4dn-12xlarge", "nodes": 1}]})
    with pytest.raises(ConfigError) as exc:
        load_scenario(raw)
    assert exc.value.field == "training.precision" and "t4" in str(exc.value) and "cluster.groups.1" in str(exc.value)


def test_parameter_server_refuses_mixed_clusters():
    raw = _with(TOY, strategy={"kind": "parameter_server"})
    with pytest.raises(ConfigError) as exc:
        simulate(load_scenario(raw))
    assert exc.value.field == "cluster.groups"


@pytest.mark.parametrize("strategy", [{"kind": "local_sgd", "local_steps": 2}, {"kind": "async_pipeline"}])
def test_other_kinds_run_at_the_slowest_groups_pace(strategy):
    """local_sgd (the spmd planner without per-step reduction) and async_pipeline (one actor per
    stage, from its slowest group) both run on a mixed cluster, slower than on the fast GPUs alone."""
    raw = _with(TOY, strategy=strategy, simulation={"mode": "symmetric", "steps": 2},
                parallelism={"pp": 2 if strategy["kind"] == "async_pipeline" else 1, "global_batch_size": 4})
    if strategy["kind"] == "async_pipeline":
        raw["cluster"]["groups"] = [{"node": _node("fast2", 1.0, 80, gpus=2), "nodes": 1},
                                    {"node": _node("slow2", 0.5, 40, gpus=2), "nodes": 1}]
    mixed = simulate(load_scenario(raw)).step_time_s
    fast = [{"node": g["node"] if "fast" in g["node"]["name"] else FAST | {"gpus_per_node": g["node"]["gpus_per_node"]},
             "nodes": g["nodes"]} for g in raw["cluster"]["groups"]]
    fast_only = simulate(load_scenario(_with(raw, cluster={**raw["cluster"], "groups": fast}))).step_time_s
    assert mixed > 1.15 * fast_only


# --- the example through the CLI (subprocesses, started together) -------------------------

def test_example_runs_in_simulate_sweep_and_search(tmp_path):
    py = [sys.executable, "-m", "simulator"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(EXAMPLE.read_text()),
                                   "cluster": {"groups": [{"node": "dgx-a100-80g", "nodes": 1}], "node": "dgx-h100"}}))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(EXAMPLE.read_text().replace("node: g4dn-12xlarge", "node: g4dn-99xlarge"))
    zero = tmp_path / "zero.yaml"
    zero.write_text(EXAMPLE.read_text().replace("nodes: 4 ", "nodes: 0 "))
    cases = {
        "simulate": py + ["simulate", str(EXAMPLE), "--json"],
        "sweep": py + ["sweep", str(SWEEP), "--out", str(tmp_path / "mixed.csv"), "--workers", "1", "--no-progress"],
        "search": py + ["search", str(EXAMPLE), "--json", "--no-cache", "--workers", "1", "--space", "tp=1",
                        "--space", "pp=1,2", "--space", "zero_stage=1", "--space", "micro_batch_size=1",
                        "--space", "recompute=none", "--space", "virtual_stages=1"],
        "both": py + ["simulate", str(bad)],
        "unknown": py + ["simulate", str(unknown)],
        "zero": py + ["simulate", str(zero)],
    }
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = {k: subprocess.Popen(v, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
             for k, v in cases.items()}
    out = {k: (p.returncode, *p.communicate(timeout=300)) for k, p in procs.items()}
    out = {k: (procs[k].returncode, so, se) for k, (_, so, se) in out.items()}

    code, stdout, stderr = out["simulate"]
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["fits"] and result["step_time_s"] > 0 and result["node"] == "2x dgx-a100-80g + 4x g4dn-12xlarge"

    code, stdout, stderr = out["sweep"]
    assert code == 0, stderr
    import pandas as pd
    rows = pd.read_csv(tmp_path / "mixed.csv")
    assert len(rows) == 4
    one_stage = rows[rows["layout.pp"] == 1]
    assert not one_stage["fits"].any() and one_stage["infeasible_reason"].str.contains("on t4").all()
    assert rows[rows["layout.pp"] == 2]["step_time_s"].gt(0).all()

    code, stdout, stderr = out["search"]
    assert code == 0, stderr
    ranked = json.loads(stdout)
    best = ranked[0]
    assert best["parallelism"]["pp"] == 2 and best["fits"]
    assert any("on t4" in (r.get("infeasible_reason") or "") for r in ranked)

    for name, field in (("both", "cluster.groups"), ("unknown", "cluster.groups.1.node"),
                        ("zero", "cluster.groups.1.nodes")):
        code, stdout, stderr = out[name]
        assert code == 2, (name, stderr)
        assert field in stderr and "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1


def test_symmetric_mode_is_an_upper_bound_when_replicas_differ():
    """Ranks 0..3 on fast, slow, slow, fast one-GPU nodes with pp=2 (stage 0: ranks 0-1, stage 1:
    ranks 2-3): replica 0 is fast then slow, replica 1 slow then fast. Symmetric mode represents
    each stage by a slow rank -- a slow-slow pipeline no replica has -- so it runs longer than full
    mode (0.819 vs 0.786 ms), never shorter."""
    groups = [{"node": FAST, "nodes": 1}, {"node": SLOW, "nodes": 2}, {"node": FAST, "nodes": 1}]
    raw = _with(TOY, cluster={**TOY["cluster"], "groups": groups},
                parallelism={"pp": 2, "global_batch_size": 8, "overlap_grad_reduce": True})
    sc = load_scenario(raw)
    assert Planner(sc, mode="symmetric").actor_ranks == {"stage0": 1, "stage1": 2}
    full = simulate(sc, mode="full").step_time_s
    symmetric = simulate(sc, mode="symmetric").step_time_s
    assert full < symmetric < 1.1 * full
    assert simulate(sc, mode="symmetric", engine="fast").step_time_s == pytest.approx(symmetric, rel=1e-9)


def test_framework_line_once_when_the_groups_agree_else_per_accelerator():
    # one framework entry per node group: the table prints one line when they say the same (the catalog
    # default on both), else each after its group's accelerator (dle-pytorch: fitted on A100, assumed on T4)
    def framework_lines(*sets: str) -> list[str]:
        args = [sys.executable, "-m", "simulator", "simulate", str(EXAMPLE)]
        for s in sets:
            args += ["--set", s]
        run = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        return [line for line in unwrap_table(run.stdout) if line.startswith("  framework ")]

    default = framework_lines()
    assert len(default) == 1 and "megatron-core (default)" in default[0]
    named = framework_lines("training.framework=dle-pytorch")
    assert [line.split()[1] for line in named] == ["a100-sxm-80g:", "t4:"]
    assert "(assumed)" in named[1] and "(assumed)" not in named[0]
