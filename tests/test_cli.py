"""The ``clustersim`` command line, end to end.

A few real subprocess runs (``python -m simulator`` and the ``clustersim`` console script:
the default scenario's table, --help, specs show, an out-of-memory layout, a bad value) start together in
one module fixture so that the interpreter start-ups (~1.5 s each) overlap. Everything else
goes through ``simulator.cli.main``, the console script's entry point, in-process (same
handler, same stdout/stderr, same exit code): 2 CPU cores cannot afford one interpreter per case.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli import main

TINY = {
    "name": "tiny-cli",
    "model": {"name": "tiny", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 4,
              "vocab_size": 1024, "seq_length": 256},
    "cluster": {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": 8},
    "parallelism": {"tp": 2, "pp": 2, "dp": 2, "micro_batch_size": 1, "global_batch_size": 8},
}
OOM = {
    "model": "gpt3-175b",
    "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
    "parallelism": {"tp": 1, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8},
}
JSON_KEYS = {"num_parameters", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
             "mfu", "hfu", "peak_memory_gib", "fits", "memory_gib", "time_breakdown_s", "time_to_train_days",
             "infeasible_reason"}
MEMORY_KEYS = {"weights", "gradients", "optimizer", "activations", "other"}


def _write(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _with(base: dict, **sections) -> dict:
    """A copy of ``base`` with sections updated one level deep (``parallelism={"tp": 3}``)."""
    out = json.loads(json.dumps(base))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# ------------------------------------------------------------------ subprocess runs (concurrent)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The few real subprocess runs, started together (each costs ~1.5 s of interpreter start-up)."""
    tmp = tmp_path_factory.mktemp("cli")
    tiny = _write(tmp / "tiny.yaml", TINY)
    oom = _write(tmp / "oom.yaml", OOM)
    py = [sys.executable, "-m", "simulator"]
    script = shutil.which("clustersim")
    cases = {
        "default_table": py + ["simulate"],
        "help": ([script] if script else py) + ["--help"],
        "oom": py + ["simulate", str(oom), "--json"],
        "specs_show": ([script] if script else py) + ["specs", "show", "a100-sxm-80g"],
        "bad_type": py + ["simulate", str(tiny), "--set", "parallelism.tp=eight"],
        "steps": py + ["simulate", str(tiny), "--steps", "3", "--json"],
        "resnet50": py + ["simulate", str(EXAMPLES / "resnet50-8xa100.yaml")],
        "resnet50_json": py + ["simulate", str(EXAMPLES / "resnet50-8xa100.yaml"), "--json"],
        "resnet50_tp": py + ["simulate", str(EXAMPLES / "resnet50-8xa100.yaml"), "--set", "parallelism.tp=2",
                             "--set", "parallelism.dp=4"],
    }
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = {name: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=tmp) for name, argv in cases.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        out[name] = subprocess.CompletedProcess(cases[name], proc.returncode, stdout, stderr)
    return out


def test_simulate_many_steps_in_a_subprocess(runs):
    # --steps 3: three identical synchronous steps back to back; the mean is the makespan / 3.
    r = runs["steps"]
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["steps"] == 3 and len(out["step_times_s"]) == 3
    assert out["makespan_s"] == pytest.approx(3 * out["step_time_s"], rel=1e-12)
    assert out["step_times_s"] == pytest.approx([out["step_time_s"]] * 3, rel=1e-9)


def test_resnet50_example_prints_images_per_second(runs):
    r = runs["resnet50"]
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "(images)" in r.stdout
    assert "tokens/s" not in r.stdout
    out = json.loads(runs["resnet50_json"].stdout)
    assert out["sample"] == "image" and out["tokens_per_s"] is None
    assert out["samples_per_s"] == pytest.approx(2048 / out["step_time_s"])
    assert out["num_parameters"] == 25_557_032  # torchvision's ResNet-50
    assert 0 < out["mfu"] < 1 and out["fits"]


def test_tensor_parallel_resnet_is_one_line_naming_the_layer_kind(runs):
    r = runs["resnet50_tp"]
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: parallelism.tp:")
    assert "conv2d" in lines[0]


def test_default_simulate_prints_a_table(runs):
    r = runs["default_table"]
    assert r.returncode == 0, r.stderr
    assert "step time" in r.stdout
    assert "MFU" in r.stdout
    assert "Traceback" not in r.stderr


def test_help_lists_the_commands(runs):
    r = runs["help"]
    assert r.returncode == 0, r.stderr
    for command in ("simulate", "specs", "validate"):
        assert command in r.stdout
    for kind in ("spmd", "local_sgd", "parameter_server"):  # the strategy kinds, with what each models
        assert f"  {kind} " in r.stdout


def test_help_lists_every_strategy_kind_in_one_column(runs):
    """The kinds' summaries start in one column: with a fixed 18-character name field,
    layer_parallel_mgrit and replicated_pipeline (20 and 19 characters) ran into their summaries with
    one space, out of line with the others (until the tenth session)."""
    from simulator.strategies.registry import kind_summaries

    text = runs["help"].stdout
    lines = [line for line in text.splitlines() if line.split()[:1] and line.split()[0] in kind_summaries()]
    assert {line.split()[0] for line in lines} == set(kind_summaries())
    columns = {line.index(summary[:20]) for line in lines for name, summary in kind_summaries().items()
               if line.split()[0] == name}
    assert len(columns) == 1 and all(line[min(columns) - 2:min(columns)] == "  " for line in lines)


def test_out_of_memory_layout_is_a_result(runs):
    # GPT-3 175B unsharded (tp 1, pp 1) on A100 80GB: ~2.6 TiB of model state per GPU.
    r = runs["oom"]
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["fits"] is False
    assert data["infeasible_reason"] and "GiB" in data["infeasible_reason"]
    assert data["peak_memory_gib"] > 80


def test_specs_show_in_a_subprocess(runs):
    r = runs["specs_show"]
    assert r.returncode == 0, r.stderr
    spec = yaml.safe_load(r.stdout)
    assert spec["name"] == "a100-sxm-80g" and spec["peak_tflops"]["bf16"] == 312 and spec["hbm_gib"] == 80


def test_bad_input_in_a_subprocess_is_one_line_and_exit_2(runs):
    r = runs["bad_type"]
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("clustersim: error: parallelism.tp:")
    assert r.stdout == ""


# ------------------------------------------------------------------ the same entry point, in-process


def test_default_simulate_json(capsys):
    assert main(["simulate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert JSON_KEYS <= set(data)
    assert MEMORY_KEYS <= set(data["memory_gib"])
    # the built-in default: GPT-3 175B on 1024 A100s, tp 8, pp 8 -> dp 16, gbs 1536, s 2048, 300B tokens
    assert data["num_gpus"] == 1024 and data["parallelism"]["dp"] == 16
    assert data["fits"] is True and data["infeasible_reason"] is None
    step = data["step_time_s"]
    assert step > 0
    assert data["tokens_per_s"] == pytest.approx(1536 * 2048 / step, rel=1e-12)
    assert data["mfu"] == pytest.approx(data["model_tflops_per_gpu"] / 312, rel=1e-12)
    assert data["time_to_train_days"] == pytest.approx(300e9 / data["tokens_per_s"] / 86400, rel=1e-12)
    assert sum(data["time_breakdown_s"].values()) == pytest.approx(step, rel=1e-9)
    assert data["num_parameters"] > 170e9


def test_trace_file_is_chrome_trace_json(tmp_path, capsys):
    path = _write(tmp_path / "tiny.yaml", TINY)
    trace_path = tmp_path / "trace.json"
    assert main(["simulate", str(path), "--json", "--trace", str(trace_path)]) == 0
    step = json.loads(capsys.readouterr().out)["step_time_s"]
    trace = json.loads(trace_path.read_text())
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    complete = [e for e in events if e["ph"] == "X"]
    assert complete
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0 for e in complete)
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["args"]["name"] for e in meta if e["name"] == "process_name"} == {"stage0", "stage1"}
    assert max(e["ts"] + e["dur"] for e in complete) == pytest.approx(step * 1e6, rel=1e-9)
    assert not (tmp_path / "trace.json.tmp").exists()


def test_trace_with_table_output(tmp_path, capsys):
    path = _write(tmp_path / "tiny.yaml", TINY)
    assert main(["simulate", str(path), "--trace", str(tmp_path / "t.json")]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "trace written to" in out


def test_specs_list_and_show(capsys):
    assert main(["specs", "list"]) == 0
    listing = capsys.readouterr().out
    for name in ("a100-sxm-80g", "dgx-a100-80g", "fat-tree", "gpt3-175b"):
        assert name in listing
    assert main(["specs", "show", "a100-sxm-80g"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("# accelerator")
    spec = yaml.safe_load(shown)
    assert spec["name"] == "a100-sxm-80g"
    assert spec["peak_tflops"]["bf16"] == 312


def test_specs_list_puts_each_kinds_summaries_in_one_column(capsys):
    """Names of 18 characters and more (megatron-deepspeed, rtx3090-nvlink-workstation, ds3lab-case3-two-regions,
    se-resnext101-32x4d) ran into their summaries with one space under a fixed 18-character field (until the
    tenth session); each kind's summaries now start in one column, two spaces after its longest name."""
    assert main(["specs", "list"]) == 0
    blocks = capsys.readouterr().out.split("\n\n")[0].split("\n")
    kinds: dict[str, list[str]] = {}
    for line in blocks:
        if line and not line.startswith(" "):
            kind = line
            kinds[kind] = []
        elif line.strip():
            kinds[kind].append(line)
    assert {"accelerators:", "nodes:", "fabrics:", "frameworks:"} <= set(kinds)
    for kind, lines in kinds.items():
        width = max(len(line.split()[0]) for line in lines)
        assert all(line[2 + width:4 + width] == "  " and line[4 + width] != " " for line in lines), kind
    assert main(["specs", "show", "a100-sxm-80g", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["hbm_gib"] == 80


# ------------------------------------------------------------------ bad input, in-process


def _bad(capsys, argv) -> str:
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 2
    assert "Traceback" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    return lines[0]


BAD_SCENARIOS = [
    # (scenario, field the message must name)
    (_with(TINY, foo=1), "foo"),
    (_with(TINY, parallelism={"tp": 2, "tp_size": 2}), "parallelism.tp_size"),
    (_with(TINY, cluster={"gpus": 8}), "cluster.gpus"),
    (_with(TINY, parallelism={"tp": "eight"}), "parallelism.tp"),
    (_with(TINY, cluster={"num_gpus": "sixteen"}), "cluster.num_gpus"),
    (_with(TINY, parallelism={"tp": 0}), "parallelism.tp"),
    (_with(TINY, parallelism={"pp": -2}), "parallelism.pp"),
    (_with(TINY, cluster={"num_gpus": 0}), "cluster.num_gpus"),
    (_with(TINY, parallelism={"micro_batch_size": 0}), "parallelism.micro_batch_size"),
    (_with(TINY, parallelism={"global_batch_size": -8}), "parallelism.global_batch_size"),
    (_with(TINY, parallelism={"dp": 0}), "parallelism.dp"),
    (_with(TINY, model=dict(TINY["model"], hidden_size=0)), "model.hidden_size"),
    (_with(TINY, model=dict(TINY["model"], num_layers=-4)), "model.num_layers"),
    (_with(TINY, training={"seq_length": 0}), "training.seq_length"),
    # tp = 3 does not divide the 8 heads (num_gpus 12 = 3·2·2)
    (_with(TINY, cluster={"num_gpus": 12}, parallelism={"tp": 3}), "parallelism.tp"),
    # 12 heads, 4 kv heads, tp 3: 3 divides 12 but neither 3 | 4 nor 4 | 3
    (_with(TINY, model=dict(TINY["model"], hidden_size=384, num_attention_heads=12, num_kv_heads=4),
           cluster={"num_gpus": 3}, parallelism={"tp": 3, "pp": 1, "dp": 1, "global_batch_size": 2}),
     "parallelism.tp"),
    # pp·virtual_stages = 4·2 > 4 layers
    (_with(TINY, parallelism={"tp": 2, "pp": 4, "dp": 1, "virtual_stages": 2, "schedule": "interleaved"}),
     "parallelism.pp"),
    (_with(TINY, parallelism={"tp": 1, "pp": 8, "dp": 1}), "parallelism.pp"),
    # tp·pp·dp = 2·2·4 = 16 != 8
    (_with(TINY, parallelism={"dp": 4}), "parallelism"),
    # 8 GPUs, tp·pp = 3 does not divide them (dp auto)
    (_with(TINY, model=dict(TINY["model"], num_attention_heads=4, num_kv_heads=4),
           parallelism={"tp": 1, "pp": 3, "dp": "auto"}), "parallelism"),
    # gbs 7 not divisible by dp·mbs = 2·1
    (_with(TINY, parallelism={"global_batch_size": 7}), "parallelism.global_batch_size"),
    (_with(TINY, parallelism={"micro_batch_size": 3, "global_batch_size": 8}), "parallelism.global_batch_size"),
    (_with(TINY, model="no-such-model"), "model"),
    (_with(TINY, cluster={"node": "no-such-node"}), "cluster.node"),
    (_with(TINY, cluster={"fabric": "no-such-fabric"}), "cluster.fabric"),
    (_with(TINY, training={"precision": "fp8"}), "training.precision"),  # A100 has no fp8 peak
    (_with(TINY, parallelism={"schedule": "zigzag"}), "parallelism.schedule"),
    (_with(TINY, parallelism={"tp": 1, "dp": 4, "sequence_parallel": True}), "parallelism.sequence_parallel"),
    (_with(TINY, parallelism={"virtual_stages": 2}), "parallelism.virtual_stages"),
    (_with(TINY, parallelism={"ep": 2}), "parallelism.ep"),
    ({k: v for k, v in TINY.items() if k != "cluster"}, "cluster"),
]


@pytest.mark.parametrize(("data", "field"), BAD_SCENARIOS)
def test_bad_scenario_is_one_line_naming_the_field(tmp_path, capsys, data, field):
    path = _write(tmp_path / "scenario.yaml", data)
    line = _bad(capsys, ["simulate", str(path)])
    assert line.startswith(f"clustersim: error: {field}:"), line


def test_missing_scenario_file(tmp_path, capsys):
    line = _bad(capsys, ["simulate", str(tmp_path / "nope.yaml")])
    assert line.startswith("clustersim: error: scenario:") and "not found" in line


def test_invalid_yaml(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text("model: tiny\nparallelism: {tp: 2\n")
    line = _bad(capsys, ["simulate", str(path)])
    assert line.startswith("clustersim: error: scenario:") and "invalid YAML" in line


def test_scenario_that_is_not_a_mapping(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert _bad(capsys, ["simulate", str(path)]).startswith("clustersim: error: scenario:")


@pytest.mark.parametrize(("override", "field"), [
    ("parallelism.tp", "--set"),           # no '='
    ("=4", "--set"),                       # empty key
    ("parallelism.tp.inner=2", "parallelism.tp.inner"),  # tp is not a mapping
    ("parallelism.tp=eight", "parallelism.tp"),
    ("parallelism.bogus=1", "parallelism.bogus"),
])
def test_bad_set_override(tmp_path, capsys, override, field):
    path = _write(tmp_path / "scenario.yaml", TINY)
    line = _bad(capsys, ["simulate", str(path), "--set", override])
    assert line.startswith(f"clustersim: error: {field}:"), line


def test_trace_into_a_missing_folder(tmp_path, capsys):
    path = _write(tmp_path / "scenario.yaml", TINY)
    line = _bad(capsys, ["simulate", str(path), "--trace", str(tmp_path / "no" / "dir" / "t.json")])
    assert line.startswith("clustersim: error: --trace:")


def test_specs_show_unknown_name(capsys):
    assert _bad(capsys, ["specs", "show", "no-such-gpu"]).startswith("clustersim: error: name:")


def test_set_overrides_are_applied(tmp_path, capsys):
    path = _write(tmp_path / "scenario.yaml", TINY)
    assert main(["simulate", str(path), "--json", "--set", "parallelism.tp=4", "--set", "parallelism.dp=1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["parallelism"]["tp"], data["parallelism"]["pp"], data["parallelism"]["dp"]) == (4, 2, 1)


def test_mode_flag(tmp_path, capsys):
    path = _write(tmp_path / "scenario.yaml", TINY)
    assert main(["simulate", str(path), "--json", "--mode", "full"]) == 0
    assert json.loads(capsys.readouterr().out)["simulation_mode"] == "full"


def test_no_command_prints_help(capsys):
    assert main([]) == 0
    assert "simulate" in capsys.readouterr().out


def test_version_and_a_light_help():
    """``--version`` prints the package version; ``--help`` builds the parser without pandas or
    matplotlib (each command imports what it needs when it runs)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-m", "simulator", "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.startswith("clustersim ")
    # --help (every strategy kind and planner listed) imports none of the heavy libraries: the kinds'
    # summaries are read from their modules' source (simulator/registry_source.py)
    heavy = ('pandas', 'matplotlib', 'simpy', 'numpy', 'pydantic', 'yaml', 'importlib.metadata', 'multiprocessing')
    code = ("import sys, contextlib, io\nfrom simulator.cli import main\nwith contextlib.redirect_stdout(io.StringIO()) "
            "as page:\n    try:\n        main(['--help'])\n    except SystemExit:\n        pass\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules)); print('spmd' in page.getvalue() and "
            "'swarm' in page.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]


def test_validate_unknown_case_set(capsys):
    assert _bad(capsys, ["validate", "--case-set", "nope"]).startswith(
        "clustersim: error: --case-set: no case set 'nope'")
    # --set NAME, its name before session 11, still works (named as given); a KEY=VALUE there is refused
    assert _bad(capsys, ["validate", "--set", "nope"]).startswith("clustersim: error: --set: no case set 'nope'")
    assert _bad(capsys, ["validate", "--set", "parallelism.tp=2"]).startswith(
        "clustersim: error: --set: validate sets no scenario field (got 'parallelism.tp=2')")


def test_validate_old_set_flag_runs_the_case_set_with_a_note(monkeypatch, capsys):
    import simulator.commands.validate as validate

    ran = []
    monkeypatch.setattr(validate, "_ds3lab", lambda names: ran.extend(names) or [])
    assert main(["validate", "--set", "ds3lab_p2p", "--case-set", "ds3lab_gpt3xl_pipeline"]) == 0
    assert ran == ["ds3lab_gpt3xl_pipeline", "ds3lab_p2p"]
    err = capsys.readouterr().err
    assert err.startswith("NOTE: validate --set NAME is now --case-set NAME") and err.count("\n") == 1
    assert main(["validate", "--case-set", "ds3lab_p2p"]) == 0 and capsys.readouterr().err == ""


@pytest.mark.parametrize("columns", [80, 120])
def test_help_fits_the_terminal(monkeypatch, columns):
    """The strategy kinds' summaries and the planners' line wrap to the terminal as argparse's own text does
    (they ran to 240 columns on one line each until the twelfth session), each summary's first words still on
    its name's line (test_help_lists_every_strategy_kind_in_one_column)."""
    from simulator.cli import build_parser
    from simulator.strategies.registry import kind_summaries

    monkeypatch.setenv("COLUMNS", str(columns))
    text = build_parser().format_help()
    assert max(len(line) for line in text.splitlines()) <= columns - 2
    for name, summary in kind_summaries().items():
        assert any(line.split()[:1] == [name] and summary[:20] in line for line in text.splitlines()), name
    assert "adaptive, dapple, deeppool, pase" in " ".join(text.split())
