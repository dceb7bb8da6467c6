"""The engine's optional compiled build (setup.py: Cython over engine.py / network.py, typed by the .pxd files):

- it gives the same results bit for bit as the pure-Python modules, on random task lists that use every engine
  feature (dependencies, rendezvous, transfers on shared ports with latency and propagation, interference both
  ways, shared executors, counters, ``until_done``) and on whole simulations (the default, Megatron-1T folded,
  the default fully unrolled on 64 GPUs, a job with a background job on shared executors, DiLoCo over a WAN):
  one process per build (``CLUSTERSIM_ENGINE=python`` forces the pure one), outputs compared as text;
- a compiled module built from another source is never used: simulator/engine/__init__.py compares its embedded
  SHA-256 with the ``.py`` and ``.pxd`` beside it (an edited copy of the package falls back to pure Python).

Both are skipped, with the reason, where the compiled modules are not built (no compiler at install time, or a
checkout used without ``pip install -e .``); the selection itself (pure Python then) runs everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import simulator.engine as engine_package

ROOT = Path(__file__).resolve().parents[1]
COMPILED = engine_package.ENGINE_BUILD == "compiled (Cython)"
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason=f"the compiled engine is not in use here ({engine_package.ENGINE_BUILD}: "
                         f"{'; '.join(engine_package.ENGINE_BUILD_NOTES) or 'not built'})")

MEGATRON_1T = ["model=gpt-1t", "cluster.num_gpus=3072", "parallelism.tp=8", "parallelism.pp=64",
               "parallelism.virtual_stages=1", "parallelism.schedule=1f1b", "parallelism.global_batch_size=3072",
               "parallelism.micro_batch_size=1", "parallelism.recompute=full", "training.seq_length=2048"]
SCENARIOS = [
    ["simulate", "--json"],
    ["simulate", "--json", *(a for o in MEGATRON_1T for a in ("--set", o))],
    ["simulate", "--json", "--mode", "full", "--set", "cluster.num_gpus=64", "--set", "parallelism.pp=4",
     "--set", "parallelism.global_batch_size=64"],
    ["simulate", str(ROOT / "examples" / "vgg16-with-background-8xa100.yaml"), "--json"],
    ["simulate", str(ROOT / "examples" / "gpt-1.7b-diloco-two-continents.yaml"), "--json"],
]

# Random task lists (as tests/test_engine_cores.py draws them, from a seeded generator so both processes build
# the same ones), run by whichever engine the process selected; every task's times and the counters as text.
_RANDOM_RUNS = r"""
import json, random, sys
import simulator.engine
from simulator.engine.engine import Engine, Task
GB = 1e9
PORTS = {"a": 1 * GB, "b": 2 * GB, "c": 0.5 * GB, "d": 3 * GB}
def case(rng):
    n = rng.randint(1, 24)
    tasks, groups = [], []
    for i in range(n):
        actor, stream = rng.choice(("r0", "r1", "r2")), rng.choice(("compute", "comm", "p2p"))
        kind = rng.choice(["fixed", "fixed", "transfer", "rendezvous"])
        kw = {"duration_s": rng.choice([0.0, 0.5, 1.0, 2.0, 0.25, 1e-3, 0.3, 1.7]),
              "deps": [tasks[j] for j in sorted({rng.randrange(i) for _ in range(rng.randint(0, 3))})] if i else [],
              "alloc_bytes": rng.choice([0.0, 0.0, 1.0, 2.0]), "free_bytes": rng.choice([0.0, 0.0, 1.0, 2.0]),
              "counter": rng.choice(["memory", "memory", "other"])}
        if kind == "fixed":
            kw.update(slowdown_while_contended=rng.choice([0.0, 0.0, 0.4]), slows_comm=rng.random() < 0.5)
            if rng.randint(0, 3) == 0:
                kw.update(shares=rng.choice("xy"), priority=rng.randint(0, 2), interferes=rng.choice([0.0, 0.3]))
        else:
            ports = rng.sample(sorted(PORTS), rng.randint(0, 3))
            kw.update(demands={p: rng.choice([0.0, 0.5 * GB, 1 * GB, 1.3 * GB]) for p in ports},
                      latency_s=rng.choice([0.0, 0.0, 1e-5, 0.2]), propagation_s=rng.choice([0.0, 0.0, 0.1]),
                      contends=rng.random() < 0.5, comm_slowdown_while_computing=rng.choice([0.0, 0.0, 0.5]))
            if kind == "rendezvous":
                open_groups = [g for g in groups if len(g) < 3 and all(tasks[j].actor != actor for j in g)]
                if open_groups and rng.random() < 0.5:
                    open_groups[0].append(i)
                else:
                    groups.append([i])
        tasks.append(Task(f"t{i}", actor, stream, "x", **kw))
    for k, group in enumerate(groups):
        for j in group:
            tasks[j].rendezvous, tasks[j].rendezvous_size = f"g{k}", len(group)
    streams = {}
    for t in tasks:
        streams.setdefault((t.actor, t.stream), []).append(t)
    until = None if rng.random() < 0.6 else [tasks[rng.randrange(n)] for _ in range(rng.randint(0, 4))]
    engine = Engine(lambda port: PORTS[port])
    try:
        makespan = engine.run(streams, {("r0", "memory"): 5.0, ("r1", "other"): 1.0}, until)
    except RuntimeError as exc:
        makespan = str(exc)
    return repr((makespan, [(t.ready_s, t.start_s, t.end_s, tuple(t.run_spans)) for t in tasks],
                 sorted(engine.counter_series.items()), sorted(engine.counter_peaks.items())))
rng = random.Random(int(sys.argv[1]))
print(json.dumps({"build": simulator.engine.ENGINE_BUILD, "runs": [case(rng) for _ in range(int(sys.argv[2]))]}))
"""


def _python(args: list[str], pure: bool, cwd: Path = ROOT, pythonpath: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "CLUSTERSIM_CACHE": "0"}
    env.pop("CLUSTERSIM_ENGINE", None)
    if pure:
        env["CLUSTERSIM_ENGINE"] = "python"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, check=True)


@needs_compiled
def test_random_task_lists_bit_for_bit_compiled_and_pure():
    runs = {pure: json.loads(_python(["-c", _RANDOM_RUNS, "24", "300"], pure).stdout) for pure in (True, False)}
    assert runs[True]["build"] == "pure Python" and runs[False]["build"] == "compiled (Cython)"
    assert any("deadlock" not in r for r in runs[True]["runs"])
    for i, (pure, compiled) in enumerate(zip(runs[True]["runs"], runs[False]["runs"], strict=True)):
        assert pure == compiled, f"random case {i}"


@needs_compiled
@pytest.mark.parametrize("args", SCENARIOS, ids=["default", "megatron-1t-folded", "default-full-64",
                                                 "background-shared-executor", "diloco-wan"])
def test_simulate_json_bit_for_bit_compiled_and_pure(args):
    outputs = {pure: _python(["-m", "simulator", *args], pure).stdout for pure in (True, False)}
    assert json.loads(outputs[True])["step_time_s"] > 0
    assert outputs[True] == outputs[False]


def _copy_package(where: Path) -> Path:
    """The simulator package's __init__ and its engine folder (built modules included) under ``where``."""
    (where / "simulator").mkdir()
    shutil.copyfile(ROOT / "simulator" / "__init__.py", where / "simulator" / "__init__.py")
    shutil.copytree(ROOT / "simulator" / "engine", where / "simulator" / "engine",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return where / "simulator" / "engine"


_WHICH = ("import json, simulator.engine as e, simulator.engine.engine as m, simulator.engine.network as n\n"
          "print(json.dumps([e.ENGINE_BUILD, m.__name__, n.__name__, e.ENGINE_BUILD_NOTES]))")


def _which(where: Path, pure: bool = False) -> list:
    return json.loads(_python(["-c", _WHICH], pure, cwd=where, pythonpath=where).stdout)


@needs_compiled
def test_a_compiled_module_built_from_another_source_is_not_used(tmp_path):
    engine_dir = _copy_package(tmp_path)
    assert _which(tmp_path)[:3] == ["compiled (Cython)", "simulator.engine._compiled_engine",
                                    "simulator.engine._compiled_network"]
    assert _which(tmp_path, pure=True)[:3] == ["pure Python", "simulator.engine.engine", "simulator.engine.network"]
    # a developer edits engine.py (a comment is enough): its binary is stale, the pure module runs
    with open(engine_dir / "engine.py", "a") as source:
        source.write("\n# edited\n")
    build, engine_name, network_name, notes = _which(tmp_path)
    assert (build, engine_name, network_name) == ("partly compiled (Cython: network)", "simulator.engine.engine",
                                                  "simulator.engine._compiled_network")
    assert any("engine: compiled module built from another engine.py" in note for note in notes)
    # and the declarations: network.pxd edited, network's binary is stale too
    with open(engine_dir / "network.pxd", "a") as declarations:
        declarations.write("\n# edited\n")
    assert _which(tmp_path)[:3] == ["pure Python", "simulator.engine.engine", "simulator.engine.network"]


def test_without_compiled_modules_the_pure_ones_run(tmp_path):
    """A checkout or an install without the extensions (no compiler): the package imports and says so."""
    engine_dir = _copy_package(tmp_path)
    for built in engine_dir.glob("_compiled_*"):
        built.unlink()
    build, engine_name, network_name, notes = _which(tmp_path)
    assert (build, engine_name, network_name) == ("pure Python", "simulator.engine.engine", "simulator.engine.network")
    assert any("engine: no compiled module" in note for note in notes)
