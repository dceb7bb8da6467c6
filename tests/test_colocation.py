"""Co-located jobs on shared GPUs (simulator/colocation/): a foreground scenario and background jobs
of their own on the same GPUs (DeepPool, Park et al. 2022). Small clusters (2 GPUs), a few steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.colocation.run import alone
from simulator.errors import ConfigError
from simulator.report.result import unwrap_table
from simulator.scenario import load_scenario
from simulator.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]


def _background(name: str = "bg", model: str = "resnet50", mbs: int = 16, **extra) -> dict:
    return {"name": name, "model": model, "parallelism": {"dp": 2, "micro_batch_size": mbs,
                                                            "global_batch_size": 2 * mbs}, **extra}


def _scenario(jobs: list[dict], steps: int = 12) -> dict:
    """VGG-16 on 2 A100s, 1 image per GPU: about 30% of each step waits on the all-reduce."""
    return {"name": "fg", "model": "vgg16", "cluster": {"node": "dgx-a100-80g", "num_gpus": 2},
            "parallelism": {"dp": 2, "micro_batch_size": 1, "global_batch_size": 2},
            "simulation": {"steps": steps}, "co_located_jobs": jobs}


def _job(priority: int = 1, slowdown: float = 0.0, **bg) -> dict:
    return {"scenario": _background(**bg), "priority": priority, "interference_slowdown": slowdown}


def _fg_busy_s(result) -> float:
    """The foreground's kernel time on its critical GPU per step (compute, optimizer, recompute)."""
    b = result.time_breakdown_s
    return b["compute"] + b["optimizer"] + b["recompute"] + b["host_stall"]


def _fg_kernels(result):
    """The foreground's timed kernels (its compute streams in the shared run)."""
    return [e for e in result.timeline if e.stream == "compute" and "/" not in e.rank_class]  # not job1/...


def _kernel_stretch(scenario) -> list[float]:
    """Each foreground kernel's time in the shared run over its time alone (the plans run the same
    kernels in the same order)."""
    shared = simulate(scenario, detail=False)
    by_itself = simulate(alone(scenario), mode="full")
    a, b = _fg_kernels(shared), _fg_kernels(by_itself)
    assert [(e.rank_class, e.name) for e in a] == [(e.rank_class, e.name) for e in b]
    return [(x.end_s - x.start_s) / (y.end_s - y.start_s) for x, y in zip(a, b, strict=True)], shared, by_itself


def test_without_interference_the_foreground_never_waits_for_the_background():
    # Priority 0 is never held back: every foreground kernel takes exactly its time alone. Its steps
    # may still be longer: the background's all-reduce shares the GPUs' links with the foreground's.
    stretch, shared, by_itself = _kernel_stretch(load_scenario(_scenario([_job(slowdown=0.0)])))
    assert stretch == pytest.approx([1.0] * len(stretch), rel=1e-9)
    assert all(s >= a - 1e-15 for s, a in zip(shared.step_times_s, by_itself.step_times_s, strict=True))
    assert shared.mode == "full"


def test_background_gets_the_idle_share_and_the_totals_add_up():
    result = simulate(load_scenario(_scenario([_job(slowdown=0.0)])))
    info = result.extra["co_location"]
    fg, bg = info["jobs"]
    idle_share = 1.0 - _fg_busy_s(result) / result.step_time_s
    assert 0.1 < idle_share < 0.9
    # the background gets at most the foreground's idle GPU time (its own all-reduce waits lose some)
    assert 0.5 * idle_share < bg["relative_throughput"] <= idle_share + 1e-9
    assert 0.9 < fg["relative_throughput"] <= 1.0  # its kernels never wait; its all-reduce shares links
    assert info["normalized_throughput"] == pytest.approx(fg["relative_throughput"] + bg["relative_throughput"])
    assert info["model_tflops_per_gpu_total"] == pytest.approx(
        fg["model_tflops_per_gpu_shared"] + bg["model_tflops_per_gpu_shared"])
    assert bg["samples_per_s_shared"] == pytest.approx(bg["samples_per_s_alone"] * bg["relative_throughput"])
    assert bg["steps_shared"] >= 1
    assert info["notes"] == []


def test_interference_stretches_foreground_kernels_within_its_bound():
    s = 0.25
    stretch, shared, by_itself = _kernel_stretch(load_scenario(_scenario([_job(slowdown=s)])))
    assert min(stretch) >= 1.0 - 1e-9 and max(stretch) <= 1.0 + s + 1e-9
    assert max(stretch) == pytest.approx(1.0 + s)  # a kernel that ran entirely beside waiting background work
    assert shared.step_time_s > by_itself.step_time_s
    assert shared.extra["co_location"]["jobs"][1]["interference_assumed"] is True


def test_the_higher_priority_background_job_gets_more():
    # Two identical background jobs: the one with priority 1 fills the foreground's gaps first.
    jobs = [_job(priority=2, name="second"), _job(priority=1, name="first")]
    info = simulate(load_scenario(_scenario(jobs))).extra["co_location"]
    rows = {r["scenario"]: r for r in info["jobs"]}
    assert [r["priority"] for r in info["jobs"]] == [0, 1, 2]
    assert rows["first"]["relative_throughput"] > 0.1
    # strict priorities: the first job always has a kernel waiting, so the second never runs
    assert rows["second"]["relative_throughput"] == 0.0 and rows["second"]["step_time_shared_s"] is None
    assert any("second got through 0.00 of a step" in note for note in info["notes"])
    one = simulate(load_scenario(_scenario([_job(priority=1, name="first")]))).extra["co_location"]
    # the second job takes nothing from the first: it only gets what both others leave
    assert rows["first"]["relative_throughput"] == pytest.approx(one["jobs"][1]["relative_throughput"], rel=1e-9)


def test_memory_of_every_job_counts():
    # Two ResNet-50 jobs of 1024 images per GPU: each fits beside the foreground, both together do not.
    big = [_job(priority=1, name="a", mbs=1024), _job(priority=2, name="b", mbs=1024)]
    assert simulate(load_scenario(_scenario(big[:1], steps=2))).fits
    result = simulate(load_scenario(_scenario(big, steps=2)), run_if_oom=False)
    assert not result.fits
    assert "co-located jobs need" in result.infeasible_reason
    assert result.step_time_s is None  # not simulated


@pytest.mark.parametrize("jobs, field", [
    ([_job(priority=1), _job(priority=1, name="b2")], "co_located_jobs.1.priority"),
    ([_job(priority=0)], "co_located_jobs.0.priority"),
    ([{"scenario": _background(), "priority": 1}], "co_located_jobs.0.interference_slowdown"),
    ([_job(cluster={"node": "dgx-h100", "num_gpus": 2})], "co_located_jobs.0.scenario.cluster"),
    ([_job(co_located_jobs=[])], "co_located_jobs.0.scenario.co_located_jobs"),
    ([_job(parallelism={"dp": 3, "micro_batch_size": 1, "global_batch_size": 3})],
     "co_located_jobs.0.scenario.parallelism"),
    ([{"scenario": "nowhere.yaml", "priority": 1, "interference_slowdown": 0.1}], "co_located_jobs.0.scenario"),
])
def test_bad_jobs_are_one_error_naming_the_field(jobs, field):
    with pytest.raises(ConfigError) as err:
        load_scenario(_scenario(jobs))
    assert err.value.field.startswith(field), str(err.value)


def test_a_kind_that_simulates_one_actor_per_stage_is_refused():
    bg = _background(model="gpt-1.7b")
    bg.update(strategy={"kind": "cyclic_dp"}, parallelism={"dp": 2, "micro_batch_size": 1, "global_batch_size": 2},
              training={"seq_length": 512})
    scenario = load_scenario(_scenario([{"scenario": bg, "priority": 1, "interference_slowdown": 0.1}], steps=2))
    with pytest.raises(ConfigError, match="every rank simulated") as err:
        simulate(scenario)
    assert err.value.field == "co_located_jobs.0.scenario.strategy.kind"


def test_the_fast_engine_is_refused_and_auto_is_the_engine():
    scenario = load_scenario(_scenario([_job()], steps=2))
    with pytest.raises(ConfigError) as err:
        simulate(scenario, engine="fast")
    assert err.value.field == "--engine"
    auto, full = simulate(scenario, engine="auto"), simulate(scenario)
    assert auto.step_times_s == full.step_times_s and auto.extra["engine"] == "full"


def test_cli_end_to_end(tmp_path):
    (tmp_path / "bg.yaml").write_text(json.dumps(_background(name="the-background")))
    scenario = _scenario([{"scenario": "bg.yaml", "priority": 1, "interference_slowdown": 0.1,
                           "interference_source": "my measurement"}], steps=6)
    (tmp_path / "fg.yaml").write_text(json.dumps(scenario))
    cmd = [sys.executable, "-m", "simulator.cli", "simulate", str(tmp_path / "fg.yaml")]
    table = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert table.returncode == 0, table.stderr
    text = "\n".join(unwrap_table(table.stdout))  # the interference line is wrapped at 110 columns
    assert "co-located jobs on the same 2 GPUs" in text
    assert "the-background" in text and "source: my measurement" in text
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    data = json.loads(out.stdout)
    info = data["co_location"]
    assert [j["scenario"] for j in info["jobs"]] == ["fg", "the-background"]
    assert data["co_located_normalized_throughput"] == pytest.approx(info["normalized_throughput"])
    assert data["step_time_s"] == pytest.approx(info["jobs"][0]["step_time_shared_s"])
    bad = subprocess.run([*cmd, "--set", "co_located_jobs.0.priority=0"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "co_located_jobs.0.priority" in bad.stderr


def test_set_reaches_into_the_list_of_jobs():
    raw = _scenario([_job(slowdown=0.1)], steps=2)
    scenario = load_scenario(raw, ["co_located_jobs.0.interference_slowdown=0.3", "co_located_jobs.0.priority=4"])
    assert (scenario.co_located[0].interference_slowdown, scenario.co_located[0].priority) == (0.3, 4)
    with pytest.raises(ConfigError, match="is a list of 1"):
        load_scenario(raw, ["co_located_jobs.1.priority=2"])


def test_sweep_over_the_interference(tmp_path):
    # The background file is relative to the base scenario's folder; sweep points run anywhere.
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "bg.yaml").write_text(json.dumps(_background()))
    (tmp_path / "fg.yaml").write_text(json.dumps(_scenario(
        [{"scenario": "jobs/bg.yaml", "priority": 1, "interference_slowdown": 0.0}], steps=4)))
    (tmp_path / "sweep.yaml").write_text("base: fg.yaml\ngrid: {co_located_jobs.0.interference_slowdown: [0.0, 0.5]}\n")
    out = tmp_path / "rows.csv"
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "sweep", str(tmp_path / "sweep.yaml"), "--out",
                          str(out), "--workers", "1"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    import pandas as pd

    rows = pd.read_csv(out).sort_values("co_located_jobs.0.interference_slowdown")
    assert list(rows["status"]) == ["ok", "ok"]
    slowed = [json.loads(x)["co_location"]["jobs"][0]["relative_throughput"] for x in rows["extra_json"]]
    assert slowed[1] < slowed[0] <= 1.0


def test_the_timeline_shows_background_kernels_only_where_the_foreground_left_the_gpu_idle():
    result = simulate(load_scenario(_scenario([_job(slowdown=0.0)], steps=4)))
    events = [e for e in result.timeline if e.stream == "compute"]
    for gpu in ("rank0", "rank1"):
        fg = [(e.start_s, e.end_s) for e in events if e.rank_class == gpu]
        bg = [(e.start_s, e.end_s) for e in events if e.rank_class == f"job1/{gpu}"]
        assert fg and bg
        overlap = sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in fg for a2, b2 in bg)
        assert overlap <= 1e-12 * result.makespan_s
        assert max(b for _, b in bg) <= result.makespan_s + 1e-12  # cut where the foreground ended


@pytest.mark.parametrize("command", [["search"], ["scale", "--gpus", "2,4"]])
def test_search_and_scale_refuse_co_located_jobs(tmp_path, command):
    (tmp_path / "fg.yaml").write_text(json.dumps(_scenario([_job()], steps=2)))
    run = subprocess.run([sys.executable, "-m", "simulator.cli", command[0], str(tmp_path / "fg.yaml"), *command[1:]],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2
    assert run.stderr.startswith("clustersim: error: co_located_jobs: ") and run.stderr.count("\n") == 1
