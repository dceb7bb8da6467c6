"""Bad input through every command, as a user types it (a subprocess each).

Every case must exit 2 with exactly one line on stderr (``clustersim: error: ...``), no traceback,
and no file left behind in the folder it ran in (no trace, no ``.tmp``, no header-only CSV). Each
case is its own process (forked from one interpreter, see :func:`run_cases`); each is a small
scenario or fails before anything is simulated, so the whole file takes seconds.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = str(ROOT / "examples" / "mixtral-8x7b-ep8-h100.yaml")
PROFILE = ROOT / "tests" / "data" / "harness" / "profile.yaml"
GOOD_TRACE = ROOT / "tests" / "data" / "traces" / "gloo_cpu_two_steps.json"

SMALL = """name: small
model: gpt-1.7b
cluster: {node: dgx-a100-80g, num_gpus: 8}
parallelism: {tp: 2, pp: 1, global_batch_size: 16, micro_batch_size: 1}
"""


def _nested(depth: int) -> str:
    return "model: " + "[" * depth + "]" * depth + "\n"


def _files(d: Path) -> None:
    """The bad (and a few good) input files the cases refer to."""
    (d / "small.yaml").write_text(SMALL)
    (d / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    (d / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1") + SMALL.split("\n", 1)[1].encode())
    (d / "nested.yaml").write_text(_nested(20000))
    (d / "nested_map.yaml").write_text("a: " + "{b: " * 5000 + "1" + "}" * 5000 + "\n")
    (d / "dup.yaml").write_text(SMALL + "parallelism: {tp: 4}\n")
    (d / "dup_inner.yaml").write_text(SMALL.replace("num_gpus: 8}", "num_gpus: 8, num_gpus: 16}"))
    (d / "empty.yaml").write_text("")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "scalar.yaml").write_text("just a string\n")
    (d / "tab.yaml").write_text("name: x\n\tmodel: y\n")
    (d / "alias_bomb.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8)))
    for name, text in {
        "nan_gbs.yaml": SMALL.replace("global_batch_size: 16", "global_batch_size: .nan"),
        "inf_gpus.yaml": SMALL.replace("num_gpus: 8", "num_gpus: .inf"),
        "nan_tokens.yaml": SMALL + "training: {tokens: .nan}\n",
        "inf_tokens.yaml": SMALL + "training: {tokens: .inf}\n",
        "nan_reserve.yaml": SMALL + "simulation: {hbm_reserve_gib: .nan}\n",
        "inf_reserve.yaml": SMALL + "simulation: {hbm_reserve_gib: .inf}\n",
        "nan_price.yaml": SMALL + "economics: {gpu_hour_usd: .nan}\n",
        "huge_gbs.yaml": SMALL.replace("global_batch_size: 16", "global_batch_size: 1000000000000"),
        "odd_gpus.yaml": SMALL.replace("num_gpus: 8", "num_gpus: 12").replace("batch_size: 16", "batch_size: 48"),
        "tp_true.yaml": SMALL.replace("tp: 2", "tp: true"),
        "tp_float.yaml": SMALL.replace("tp: 2", "tp: 2.5"),
        "tp_string.yaml": SMALL.replace("tp: 2", "tp: two"),
        "unknown_key.yaml": SMALL + "trainig: {precision: bf16}\n",
        "many_errors.yaml": SMALL.replace("tp: 2", "tp: two").replace("micro_batch_size: 1", "micro_batch_size: x"),
        "bad_model.yaml": SMALL.replace("gpt-1.7b", "no-such-model"),
        "bad_node.yaml": SMALL.replace("dgx-a100-80g", "no-such-node"),
        "inline_accel_nan.yaml": SMALL.replace(
            "node: dgx-a100-80g", "node: {name: n, gpus_per_node: 8, accelerator: {name: g, vendor: x, peak_tflops: "
            "{bf16: .nan}, hbm_gib: 80, hbm_bandwidth_gb_per_s: 2000}, intra_node: {kind: nvswitch, "
            "bandwidth_per_gpu_gb_per_s: 300, latency_us: 3}, nics_per_node: 8, nic_bandwidth_gbit_per_s: 200}"),
        "inline_accel_missing.yaml": SMALL.replace(
            "node: dgx-a100-80g", "node: {name: n, gpus_per_node: 8, accelerator: {name: g, peak_tflops: "
            "{bf16: 300}}, intra_node: {kind: nvswitch, bandwidth_per_gpu_gb_per_s: 300, latency_us: 3}, "
            "nics_per_node: 8, nic_bandwidth_gbit_per_s: 200}"),
        "inline_model_nan.yaml": SMALL.replace(
            "model: gpt-1.7b", "model: {name: m, num_layers: 4, hidden_size: 512, num_attention_heads: 8, "
            "vocab_size: 1000, seq_length: .nan}"),
        "seq_inf.yaml": SMALL + "training: {seq_length: .inf}\n",
        "model_list.yaml": SMALL.replace("model: gpt-1.7b", "model: [1, 2]"),
        "bad_precision.yaml": SMALL + "training: {precision: fp4}\n",
    }.items():
        (d / name).write_text(text)
    (d / "hf_t5.json").write_text(json.dumps({"model_type": "t5", "d_model": 512, "num_layers": 6,
                                               "num_heads": 8, "vocab_size": 32128}))
    (d / "hf_t5.yaml").write_text(SMALL.replace("model: gpt-1.7b", "model: hf_t5.json"))
    (d / "hf_nan.json").write_text('{"model_type": "llama", "hidden_size": NaN, "num_hidden_layers": 2, '
                                   '"num_attention_heads": 8, "vocab_size": 100, "max_position_embeddings": 64}')
    (d / "hf_nan.yaml").write_text(SMALL.replace("model: gpt-1.7b", "model: hf_nan.json"))
    (d / "hf_binary.json").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    (d / "hf_binary.yaml").write_text(SMALL.replace("model: gpt-1.7b", "model: hf_binary.json"))
    # sweeps
    (d / "sweep_binary.yaml").write_bytes(b"\xff\xfe\x00grid")
    (d / "sweep_grid_scalar.yaml").write_text("base: small.yaml\ngrid: {parallelism.tp: 2}\n")
    (d / "sweep_grid_empty.yaml").write_text("base: small.yaml\ngrid: {parallelism.tp: []}\n")
    (d / "sweep_base_missing.yaml").write_text("base: nowhere.yaml\ngrid: {parallelism.tp: [1, 2]}\n")
    (d / "sweep_set_bad.yaml").write_text("base: small.yaml\nset: [parallelism.tp]\ngrid: {parallelism.tp: [1]}\n")
    (d / "sweep_zip_uneven.yaml").write_text("base: small.yaml\nzip: {parallelism.tp: [1, 2], parallelism.pp: [1]}\n")
    (d / "sweep_nan.yaml").write_text("base: small.yaml\ngrid: {training.tokens: [.nan]}\n")
    (d / "sweep_ok.yaml").write_text("base: small.yaml\ngrid: {parallelism.tp: [1, 2]}\n")
    (d / "sweep_dup.yaml").write_text("base: small.yaml\ngrid: {parallelism.tp: [1]}\ngrid: {parallelism.tp: [2]}\n")
    # traces
    text = GOOD_TRACE.read_bytes()
    (d / "truncated.json.gz").write_bytes(gzip.compress(text)[: len(gzip.compress(text)) // 2])
    (d / "garbage.json.gz").write_bytes(b"not gzip at all")
    (d / "truncated.json").write_bytes(text[: len(text) // 2])
    (d / "binary_trace.json").write_bytes(bytes(range(256)))
    (d / "trace_list.json").write_text("[1, 2, 3]")
    (d / "trace_nan.json").write_text('{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": NaN, "dur": 5}]}')
    # harness runs
    runs = d / "runs" / "training"
    runs.mkdir(parents=True)
    (runs / "runs.json").write_text(json.dumps({"runs": [{"strategy": "ddp"}]}))
    runs2 = d / "runs2" / "training"
    runs2.mkdir(parents=True)
    (runs2 / "runs.json").write_text(json.dumps({"runs": [{"strategy": "ddp", "layout": {"tp": 1},
                                                            "step_time_s": "fast"}]}))
    runs3 = d / "runs3" / "training"
    runs3.mkdir(parents=True)
    (runs3 / "runs.json").write_text("{\"runs\": [")
    runs4 = d / "runs4" / "training"
    runs4.mkdir(parents=True)
    (runs4 / "runs.json").write_bytes(b"\xff\xfe")
    shutil.copy(PROFILE, d / "profile.yaml")
    (d / "profile_nan.yaml").write_text(PROFILE.read_text().replace("peak_tflops:\n      fp32: 0.092519",
                                                                      "peak_tflops:\n      fp32: .nan"))
    # co-located jobs (simulator/colocation/)
    bg = "{name: bg, model: gpt-1.7b, parallelism: {tp: 2, global_batch_size: 16, micro_batch_size: 1}}"
    (d / "co_dup_priority.yaml").write_text(SMALL + f"co_located_jobs:\n  - {{scenario: {bg}, priority: 1, "
                                            "interference_slowdown: 0.1}\n  - {scenario: " + bg + ", priority: 1, "
                                            "interference_slowdown: 0.1}\n")
    (d / "co_nan_interference.yaml").write_text(SMALL + f"co_located_jobs:\n  - {{scenario: {bg}, priority: 1, "
                                                "interference_slowdown: .nan}\n")
    (d / "co_missing_file.yaml").write_text(SMALL + "co_located_jobs:\n  - {scenario: nowhere-bg.yaml, priority: 1, "
                                            "interference_slowdown: 0.1}\n")
    (d / "co_not_a_list.yaml").write_text(SMALL + "co_located_jobs: bg.yaml\n")
    (d / "afile").write_text("x")
    (d / "adir").mkdir()


S = ["simulate"]
CASES: dict[str, list[str]] = {
    # files that are not scenarios
    "missing file": S + ["nowhere.yaml"],
    "binary file": S + ["binary.yaml"],
    "latin-1 file": S + ["latin1.yaml"],
    "deeply nested list": S + ["nested.yaml"],
    "deeply nested mapping": S + ["nested_map.yaml"],
    "duplicate top-level key": S + ["dup.yaml"],
    "duplicate inner key": S + ["dup_inner.yaml"],
    "empty file": S + ["empty.yaml"],
    "top-level list": S + ["list.yaml"],
    "top-level scalar": S + ["scalar.yaml"],
    "tab indentation": S + ["tab.yaml"],
    "alias bomb": S + ["alias_bomb.yaml"],
    "a folder as scenario": S + ["adir"],
    # numbers
    "nan global batch": S + ["nan_gbs.yaml"],
    "inf num_gpus": S + ["inf_gpus.yaml"],
    "nan tokens": S + ["nan_tokens.yaml"],
    "inf tokens": S + ["inf_tokens.yaml"],
    "nan hbm reserve": S + ["nan_reserve.yaml"],
    "inf hbm reserve": S + ["inf_reserve.yaml"],
    "nan price": S + ["nan_price.yaml"],
    "global batch 10^12": S + ["huge_gbs.yaml"],
    "num_gpus not a multiple of the node": S + ["odd_gpus.yaml"],
    "tp true": S + ["tp_true.yaml"],
    "tp 2.5": S + ["tp_float.yaml"],
    "tp two": S + ["tp_string.yaml"],
    "misspelt key": S + ["unknown_key.yaml"],
    "two bad fields": S + ["many_errors.yaml"],
    "unknown model": S + ["bad_model.yaml"],
    "unknown node": S + ["bad_node.yaml"],
    "inline accelerator nan peak": S + ["inline_accel_nan.yaml"],
    "inline accelerator missing fields": S + ["inline_accel_missing.yaml"],
    "inline model nan": S + ["inline_model_nan.yaml"],
    "inf seq_length": S + ["seq_inf.yaml"],
    "model as a list": S + ["model_list.yaml"],
    "unknown precision": S + ["bad_precision.yaml"],
    "co-located jobs with one priority": S + ["co_dup_priority.yaml"],
    "co-located NaN interference": S + ["co_nan_interference.yaml"],
    "co-located job file missing": S + ["co_missing_file.yaml"],
    "co-located jobs not a list": S + ["co_not_a_list.yaml"],
    "search with co-located jobs": ["search", "co_nan_interference.yaml"],
    "scale with co-located jobs": ["scale", "co_missing_file.yaml", "--gpus", "8,16"],
    "hf t5": S + ["hf_t5.yaml"],
    "hf NaN": S + ["hf_nan.yaml"],
    "hf binary": S + ["hf_binary.yaml"],
    # --set
    "--set without =": S + ["small.yaml", "--set", "parallelism.tp"],
    "--set nan": S + ["small.yaml", "--set", "parallelism.tp=nan"],
    "--set inf gbs": S + ["small.yaml", "--set", "parallelism.global_batch_size=.inf"],
    "--set num_gpus 1e30": S + ["small.yaml", "--set", "cluster.num_gpus=1e30"],
    "--set through a scalar": S + ["small.yaml", "--set", "model.name.x=1"],
    "--set empty key": S + ["small.yaml", "--set", "=3"],
    "--mode bogus": S + ["small.yaml", "--mode", "bogus"],
    "unknown option": S + ["small.yaml", "--frobnicate"],
    "unknown command": ["frobnicate"],
    # output paths checked before simulating
    "--trace missing folder": S + ["small.yaml", "--trace", "nope/t.json"],
    "--trace is a folder": S + ["small.yaml", "--trace", "adir"],
    "--trace under a file": S + ["small.yaml", "--trace", "afile/t.json"],
    "--trace empty": S + ["small.yaml", "--trace", ""],
    "--trace-ranks abc": S + ["small.yaml", "--trace", "t.json", "--trace-ranks", "abc"],
    "--trace-ranks without --trace": S + ["small.yaml", "--trace-ranks", "0"],
    "sweep --out under a file": ["sweep", "sweep_ok.yaml", "--out", "afile/r.csv"],
    "sweep --out bad suffix": ["sweep", "sweep_ok.yaml", "--out", "r.txt"],
    "sweep --out is a folder": ["sweep", "sweep_ok.yaml", "--out", "adir"],
    "sweep --dask unreachable": ["sweep", "sweep_ok.yaml", "--out", "r.csv", "--dask", "tcp://127.0.0.1:9"],
    "plot --out is a file": ["plot", "small.yaml", "--out", "afile"],
    "plot --format gif": ["plot", "small.yaml", "--out", "figs", "--format", "gif"],
    "scale --out is a file": ["scale", "small.yaml", "--gpus", "8", "--out", "afile"],
    "compare --plot missing folder": ["compare", "--trace", str(GOOD_TRACE), "--profile", "profile.yaml", "--plot",
                                      "nope/p.png"],
    "validate-runs --plot missing folder": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs",
                                            "--plot", "nope/p.png"],
    # sweeps
    "sweep binary": ["sweep", "sweep_binary.yaml", "--out", "r.csv"],
    "sweep grid scalar": ["sweep", "sweep_grid_scalar.yaml", "--out", "r.csv"],
    "sweep grid empty": ["sweep", "sweep_grid_empty.yaml", "--out", "r.csv"],
    "sweep base missing": ["sweep", "sweep_base_missing.yaml", "--out", "r.csv"],
    "sweep set malformed": ["sweep", "sweep_set_bad.yaml", "--out", "r.csv"],
    "sweep zip uneven": ["sweep", "sweep_zip_uneven.yaml", "--out", "r.csv"],
    "sweep duplicate key": ["sweep", "sweep_dup.yaml", "--out", "r.csv"],
    "sweep --workers 0": ["sweep", "sweep_ok.yaml", "--out", "r.csv", "--workers", "0"],
    "sweep --retry-errors alone": ["sweep", "sweep_ok.yaml", "--out", "r.csv", "--retry-errors"],
    # search and scale
    "search --gpus 0": ["search", "small.yaml", "--gpus", "0"],
    "search --space tp=abc": ["search", "small.yaml", "--space", "tp=abc"],
    "search --space unknown": ["search", "small.yaml", "--space", "xx=1"],
    "search --constraint nan": ["search", "small.yaml", "--constraint", "max_memory_gib=nan"],
    "search --top 0": ["search", "small.yaml", "--top", "0"],
    "search binary": ["search", "binary.yaml"],
    "scale --gpus abc": ["scale", "small.yaml", "--gpus", "abc"],
    "scale --gpus 0": ["scale", "small.yaml", "--gpus", "0"],
    "scale --gpus nan": ["scale", "small.yaml", "--gpus", "nan"],
    "scale --gpus empty": ["scale", "small.yaml", "--gpus", ""],
    # traces
    "compare truncated gz": ["compare", "--trace", "truncated.json.gz", "--profile", "profile.yaml"],
    "compare not gzip": ["compare", "--trace", "garbage.json.gz", "--profile", "profile.yaml"],
    "compare truncated json": ["compare", "--trace", "truncated.json", "--profile", "profile.yaml"],
    "compare binary": ["compare", "--trace", "binary_trace.json", "--profile", "profile.yaml"],
    "compare a list": ["compare", "--trace", "trace_list.json", "--profile", "profile.yaml"],
    "compare NaN timestamp": ["compare", "--trace", "trace_nan.json", "--profile", "profile.yaml"],
    "compare missing trace": ["compare", "--trace", "nowhere.json", "--profile", "profile.yaml"],
    "compare step 0": ["compare", "--trace", str(GOOD_TRACE), "--profile", "profile.yaml", "--step", "999"],
    "compare nan profile": ["compare", "--trace", str(GOOD_TRACE), "--profile", "profile_nan.yaml"],
    # harness runs
    "validate-runs rows missing keys": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs"],
    "validate-runs step time a string": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs2"],
    "validate-runs truncated runs.json": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs3"],
    "validate-runs binary runs.json": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs4"],
    "validate-runs --tolerance nan": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs",
                                      "--tolerance", "nan"],
    "validate-runs --tolerance inf": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs",
                                      "--tolerance", "0.1,inf"],
    "validate-runs --tolerance -1": ["validate-runs", "--profile", "profile.yaml", "--runs", "runs",
                                     "--tolerance", "-1"],
    "validate-runs missing profile": ["validate-runs", "--profile", "nope.yaml", "--runs", "runs"],
    "calibrate --from missing": ["calibrate", "--from", "nowhere"],
    "calibrate --out missing folder": ["calibrate", "--from", "runs", "--out", "nope/p.yaml"],
    # specs and validate
    "specs show unknown": ["specs", "show", "no-such-gpu"],
    "specs --kind bogus": ["specs", "list", "--kind", "bogus"],
    "validate unknown set": ["validate", "--case-set", "nope"],
    "validate --set KEY=VALUE": ["validate", "--set", "training.precision=fp8"],
    "validate --workers 0": ["validate", "--workers", "0"],
}


DRIVER = r"""
import json, os, sys, traceback
from pathlib import Path
import pandas, simpy, yaml  # noqa: F401 - imported once, before the forks
from simulator.cli import main
import simulator.scenario, simulator.simulate, simulator.explore.sweep, simulator.explore.search  # noqa: F401
folder, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
results = {}
for name, (work, argv) in cases.items():
    out, err = Path(work).with_suffix(".stdout"), Path(work).with_suffix(".stderr")
    pid = os.fork()
    if pid == 0:  # the child is the user's process: `clustersim ARGV` run in WORK
        os.chdir(work)
        fo, fe = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
        os.dup2(fo, 1), os.dup2(fe, 2)
        sys.argv = ["clustersim", *argv]
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, int) and exc.code is not None:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(), sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    results[name] = os.waitstatus_to_exitcode(status)
(folder / "results.json").write_text(json.dumps(results))
"""


def run_cases(folder: Path, files, cases: dict[str, list[str]]) -> dict[str, tuple[subprocess.CompletedProcess,
                                                                                   set[str]]]:
    """Every case in its own process, forked from one interpreter that imported the simulator once
    (a fresh ``python -m simulator`` per case costs 10-20 s on a loaded 2-core machine), each in its own copy
    of the inputs ``files`` writes; returns each case's process and the files it left behind. A few cases
    also run through ``python -m simulator`` itself (:func:`test_the_real_entry_point_agrees`)."""
    (folder / "_inputs").mkdir()
    files(folder / "_inputs")
    work_of, before = {}, {}
    for case, argv in cases.items():
        work = folder / case.replace(" ", "_").replace("/", "_")
        shutil.copytree(folder / "_inputs", work, symlinks=True)
        before[case] = {str(p.relative_to(work)) for p in work.rglob("*")}
        work_of[case] = (str(work), argv)
    (folder / "cases.json").write_text(json.dumps(work_of))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    subprocess.run([sys.executable, "-c", DRIVER, str(folder), str(folder / "cases.json")], env=env, check=True,
                   timeout=1200, stdin=subprocess.DEVNULL, capture_output=True)
    codes = json.loads((folder / "results.json").read_text())
    out = {}
    for case, (work, argv) in work_of.items():
        path = Path(work)
        proc = subprocess.CompletedProcess(argv, codes[case], path.with_suffix(".stdout").read_text(errors="replace"),
                                           path.with_suffix(".stderr").read_text(errors="replace"))
        out[case] = (proc, {str(p.relative_to(path)) for p in path.rglob("*")} - before[case])
    return out


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp("bad_input"), _files, CASES)


@pytest.mark.parametrize("case", ["binary file", "--mode bogus", "validate-runs --tolerance nan",
                                  "global batch 10^12"])
def test_the_real_entry_point_agrees(tmp_path, outcomes, case):
    """``python -m simulator`` (what the ``clustersim`` script runs) gives what the forked driver gave."""
    (tmp_path / "_inputs").mkdir()
    _files(tmp_path / "_inputs")
    work = tmp_path / "case"
    shutil.copytree(tmp_path / "_inputs", work)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, "-m", "simulator", *CASES[case]], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == outcomes[case][0].returncode == 2
    assert proc.stderr.strip() == outcomes[case][0].stderr.strip()


def test_there_are_at_least_sixty_cases_across_every_command():
    assert len(CASES) >= 60
    commands = {argv[0] for argv in CASES.values()}
    assert {"simulate", "search", "sweep", "scale", "plot", "compare", "validate-runs", "calibrate", "specs",
            "validate"} <= commands


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(outcomes, case):
    proc, left = outcomes[case]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not left, f"left behind: {sorted(left)}"


def test_the_cases_start_from_a_scenario_that_runs(tmp_path):
    """The control: the small scenario the cases break runs (so every case fails for its own reason)."""
    (tmp_path / "small.yaml").write_text(SMALL)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "simulator", "simulate", "small.yaml", "--json"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fits"] is True
