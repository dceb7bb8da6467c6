"""Sweeps (simulator/explore/sweep.py, `clustersim sweep`): grid expansion, point ids, streaming CSV and
Parquet output that survives interruption, --resume, failing points, local worker processes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import ConfigError
from simulator.explore.sweep import (
    PROVENANCE_COLUMNS,
    RESULT_COLUMNS,
    ParquetResults,
    flatten_result,
    load_sweep,
    point_id,
    provenance_columns,
    read_results,
    run_sweep,
    sweep_columns,
)

#: A tiny real scenario: Llama-style 1B on DGX H100 nodes, 8-16 GPUs, seq 1024 (a step simulates in ~20 ms).
TINY_BASE = {
    "model": "llama-1b",
    "cluster": {"node": "dgx-h100", "fabric": "fat-tree", "num_gpus": 8},
    "parallelism": {"tp": 1, "pp": 1, "dp": "auto", "global_batch_size": 32, "micro_batch_size": 1},
    "training": {"seq_length": 1024, "precision": "bf16", "tokens": 1e9},
}


def fake_simulate(raw):
    """Stands in for simulate_point: deterministic, fails for micro-batch 3, OOM for 4."""
    mbs = raw["parallelism"]["micro_batch_size"]
    if mbs == 3:
        raise RuntimeError("boom")
    n = raw["cluster"]["num_gpus"]
    step = 1.0 / n
    return {"num_parameters": 1e9, "step_time_s": step, "tokens_per_s": 1000.0 * n, "mfu": 0.4, "hfu": 0.5,
            "fits": mbs != 4, "infeasible_reason": "out of memory" if mbs == 4 else None,
            "memory_gib": {"weights": 1.0, "gradients": 1.0, "optimizer": 2.0, "activations": 3.0, "other": 0.5},
            "time_breakdown_s": {"compute": 0.8 * step, "dp_comm": 0.2 * step},
            "layer_split": [16], "new_key_from_core": 7}


def _sweep(**grid):
    return load_sweep({"name": "t", "base": TINY_BASE, "grid": grid})


def test_grid_and_zip_expansion_and_ids():
    sw = load_sweep({"base": TINY_BASE, "grid": {"cluster.num_gpus": [8, 16], "parallelism.micro_batch_size": [1, 2]},
                     "zip": {"parallelism.tp": [1, 2], "parallelism.sequence_parallel": [False, True]}})
    points = sw.points()
    assert len(points) == 2 * 2 * 2
    ids = [p[0] for p in points]
    assert len(set(ids)) == len(ids)
    assert ids == [p[0] for p in sw.points()]  # stable
    pid, values, raw = points[-1]
    assert values == {"cluster.num_gpus": 16, "parallelism.micro_batch_size": 2, "parallelism.tp": 2,
                      "parallelism.sequence_parallel": True}
    assert raw["parallelism"]["tp"] == 2 and raw["cluster"]["num_gpus"] == 16
    assert pid == point_id(raw)
    assert TINY_BASE["parallelism"]["tp"] == 1  # the base is not mutated


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"grid": {"parallelism.tpp": [1]}}, "grid.parallelism.tpp"),
        ({"grid": {"cluster.num_gpus": [-8]}}, "grid.cluster.num_gpus"),
        ({"grid": {"cluster.num_gpus": []}}, "grid.cluster.num_gpus"),
        ({"zip": {"parallelism.tp": [1, 2], "parallelism.pp": [1]}}, "zip"),
        ({"grids": {}}, "grids"),
        ({"base": "no/such/file.yaml"}, "base"),
        ({"set": ["training"]}, "set"),
        ({"show": ["tokens_per_s", "no_such_column"]}, "show.no_such_column"),
    ],
)
def test_bad_sweep_files_name_the_field(doc, field):
    doc = {"base": TINY_BASE, **doc}
    with pytest.raises(ConfigError) as info:
        load_sweep(doc).points()
    assert info.value.field == field, info.value


def test_a_misspelt_grid_key_is_answered_with_the_close_one_as_simulate_answers_it():
    """A sweep point's unknown key says what ``clustersim simulate --set`` says of it (the close spelling, the
    keys known at that level), then the point; until the tenth session only "unknown key (point {...})"."""
    with pytest.raises(ConfigError) as info:
        _sweep(**{"parallelism.micro_bach_size": [1, 2]}).points()
    assert info.value.field == "grid.parallelism.micro_bach_size"
    assert info.value.reason.startswith("unknown key; did you mean 'micro_batch_size'? (known here: tp, pp, dp, ")
    assert info.value.reason.endswith("(point {'parallelism.micro_bach_size': 1})")


def test_flatten_keeps_unknown_keys():
    row = flatten_result(fake_simulate({"parallelism": {"micro_batch_size": 1}, "cluster": {"num_gpus": 8}}))
    assert set(RESULT_COLUMNS) <= set(row)
    assert row["memory_gib.optimizer"] == 2.0 and row["layer_split"] == "[16]"
    assert json.loads(row["extra_json"]) == {"new_key_from_core": 7}


def test_csv_streams_resumes_and_records_failures(tmp_path):
    sw = _sweep(**{"cluster.num_gpus": [8, 16], "parallelism.micro_batch_size": [1, 2, 3, 4]})
    out = tmp_path / "r.csv"
    # An "interrupted" sweep: only 3 points ran.
    counts = run_sweep(sw, out, workers=1, progress=False, simulate_fn=fake_simulate, limit=3)
    assert sum(counts.values()) == 3
    assert len(pd.read_csv(out)) == 3
    # Without --resume an existing file is not overwritten.
    with pytest.raises(ConfigError) as info:
        run_sweep(sw, out, workers=1, progress=False, simulate_fn=fake_simulate)
    assert info.value.field == "--out"
    # A half-written last line (killed mid-write) is dropped on resume.
    with out.open("a") as fh:
        fh.write("deadbeef,8,")
    counts = run_sweep(sw, out, resume=True, workers=1, progress=False, simulate_fn=fake_simulate)
    assert counts["skipped"] == 3 and counts["ok"] + counts["infeasible"] + counts["error"] == 5
    frame = pd.read_csv(out)
    assert len(frame) == 8 and frame.point_id.is_unique
    assert set(frame.point_id) == {p[0] for p in sw.points()}
    by_mbs = frame.set_index("parallelism.micro_batch_size")
    assert set(by_mbs.loc[3, "status"]) == {"error"}
    assert all("RuntimeError: boom" in e for e in by_mbs.loc[3, "error"])
    assert set(by_mbs.loc[4, "status"]) == {"infeasible"}
    assert set(by_mbs.loc[1, "status"]) == {"ok"}
    # Resume again: nothing left; --retry-errors reruns the two failures.
    assert run_sweep(sw, out, resume=True, workers=1, progress=False, simulate_fn=fake_simulate)["skipped"] == 8
    again = run_sweep(sw, out, resume=True, retry_errors=True, workers=1, progress=False, simulate_fn=fake_simulate)
    assert again["error"] == 2 and again["skipped"] == 6
    assert len(read_results(out)) == 8


def test_parquet_dataset_survives_a_crash(tmp_path):
    sw = _sweep(**{"cluster.num_gpus": [8, 16, 32], "parallelism.micro_batch_size": [1, 2]})
    columns, types = sweep_columns(sw)
    assert types["cluster.num_gpus"] == "int" and types["fits"] == "bool"
    out = tmp_path / "r.parquet"
    # Simulate a crash: rows written to the journal, never turned into a part file, never closed.
    writer = ParquetResults(out, columns, types, resume=False, flush_rows=100)
    for pid, values, _raw in sw.points()[:2]:
        writer.write({"point_id": pid, **values, "status": "ok", "tokens_per_s": 1.0, "fits": True})
    writer._journal.close()  # the process died: no close(), no part file
    assert not list(out.glob("part-*.parquet"))
    counts = run_sweep(sw, out, resume=True, workers=1, progress=False, simulate_fn=fake_simulate)
    assert counts["skipped"] == 2 and counts["ok"] == 4
    frame = pd.read_parquet(out)
    assert len(frame) == 6 and frame.point_id.is_unique
    assert frame["cluster.num_gpus"].dtype.kind == "i"
    assert len(read_results(out)) == 6


def test_real_simulator_in_two_worker_processes(tmp_path):
    sw = _sweep(**{"cluster.num_gpus": [8, 16], "parallelism.tp": [1, 2], "parallelism.micro_batch_size": [1, 64]})
    out = tmp_path / "real.csv"
    counts = run_sweep(sw, out, workers=2, progress=False)
    frame = pd.read_csv(out)
    assert len(frame) == 8 and counts["error"] == 0
    ok = frame[frame.status == "ok"]
    assert len(ok) >= 4 and (ok.tokens_per_s > 0).all() and (ok.step_time_s > 0).all()
    # time/cost/energy are included when tokens are given
    assert (ok.cost_usd > 0).all() and (ok.energy_mwh > 0).all() and (ok.effective_time_to_train_days > 0).all()
    # micro-batch 64 with gbs 32 is indivisible: a row with the reason, not a crash
    bad = frame[frame["parallelism.micro_batch_size"] == 64]
    assert (bad.status == "infeasible").all() and bad.infeasible_reason.str.contains("global_batch_size").all()
    assert (ok["layout.dp"] * ok["layout.tp"] == ok["cluster.num_gpus"]).all()
    # each point's efficiency provenance (what `clustersim simulate` prints) is kept in the row
    for column in PROVENANCE_COLUMNS:
        assert ok[column].notna().all() and (ok[column].str.len() > 0).all()


def test_cli_sweep(tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(json.dumps({"name": "cli", "base": TINY_BASE, "grid": {"cluster.num_gpus": [8, 16]}}))
    out = tmp_path / "o.csv"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    assert len(pd.read_csv(out)) == 2
    assert "2 points run" in capsys.readouterr().err
    assert main(["sweep", str(sweep_file), "--out", str(out), "--resume", "--workers", "1", "--no-progress"]) == 0
    assert "2 already done" in capsys.readouterr().err
    assert main(["sweep", str(sweep_file), "--out", str(tmp_path / "o.txt")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["sweep", str(sweep_file), "--workers", "0"]) == 2
    assert main(["sweep", str(tmp_path / "missing.yaml")]) == 2


def test_example_sweeps_load():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parent.parent / "examples" / "sweeps").glob("*.yaml")):
        sweep = load_sweep(path)
        assert sweep.points(), path


EXAMPLE_SWEEPS = Path(__file__).resolve().parent.parent / "examples" / "sweeps"


def test_cli_prints_the_show_columns(tmp_path, capsys):
    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(json.dumps({"name": "show", "base": TINY_BASE, "grid": {"cluster.num_gpus": [16, 8]},
                                      "show": ["tokens_per_s", "efficiencies_assumed"]}))
    out = tmp_path / "o.csv"
    assert main(["sweep", str(sweep_file), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["cluster.num_gpus", "status", "tokens_per_s", "efficiencies_assumed"]
    frame = pd.read_csv(out)
    assert [int(line.split()[0]) for line in lines[1:]] == [16, 8]  # the sweep's point order
    for line, (_, row) in zip(lines[1:], frame.iterrows(), strict=True):
        assert f"{row.tokens_per_s:,.0f}" in line and line.rstrip().endswith(row.efficiencies_assumed)


def test_hardware_sweep_keeps_each_parts_provenance(tmp_path):
    """examples/sweeps/hardware-llama3-8b.yaml: one row per part, each with the lists `clustersim simulate`
    prints for that part (every component of its provenance in exactly one state column)."""
    from simulator.cost.provenance import efficiency_provenance
    from simulator.scenario import load_scenario

    sweep = load_sweep(EXAMPLE_SWEEPS / "hardware-llama3-8b.yaml")
    out = tmp_path / "hw.csv"
    counts = run_sweep(sweep, out, workers=1, progress=False)
    assert counts["ok"] == 6
    frame = read_results(out)
    assert set(frame["cluster.node"]) == {"dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "mi300x-8", "mi355x-8"}
    for (_, values, raw), (_, row) in zip(sweep.points(), frame.iterrows(), strict=True):
        assert row["cluster.node"] == values["cluster.node"]
        listed = [name for c in PROVENANCE_COLUMNS for name in row[c].split(", ") if name != "none"]
        assert sorted(listed) == sorted(efficiency_provenance(load_scenario(raw)))
        assert {c: row[c] for c in PROVENANCE_COLUMNS} == provenance_columns(raw)
    gb200 = frame[frame["cluster.node"] == "gb200-nvl72"].iloc[0]
    assert gb200["layout.tp"] == 8 and gb200.num_nodes == 16  # TP 8 over two 4-GPU trays of one NVLink domain
    assert "sustained_clock" in gb200.efficiencies_assumed


def test_shallue_sweep_shows_the_knee(tmp_path):
    """examples/sweeps/resnet50-shallue.yaml (issue 20): below the preset's b_noise doubling the batch
    about halves the steps and keeps the time to target; past it the steps flatten and the time doubles."""
    from simulator.economics.convergence import load_presets

    sweep = load_sweep(EXAMPLE_SWEEPS / "resnet50-shallue.yaml")
    out = tmp_path / "shallue.csv"
    assert run_sweep(sweep, out, workers=1, progress=False)["ok"] == 9
    frame = read_results(out).sort_values("parallelism.global_batch_size")
    batch = frame["parallelism.global_batch_size"].to_numpy()
    preset = load_presets()["resnet50-imagenet-assumed"]["batch"]
    expected = preset["s_min"] * (1 + preset["b_noise"] / batch)
    assert frame.steps_to_target.to_numpy() == pytest.approx(expected)
    assert frame.time_to_target_s.to_numpy() == pytest.approx(frame.steps_to_target * frame.step_time_s)
    ratio = frame.time_to_target_s.to_numpy()[1:] / frame.time_to_target_s.to_numpy()[:-1]
    assert ratio[0] < 1.05          # 512 -> 1024: the time to target stays flat (steps halve)
    assert ratio[-1] > 1.85         # 65,536 -> 131,072: it nearly doubles (steps barely move)
    assert (ratio[1:] >= ratio[:-1] - 1e-9).all()  # and the knee between is a monotone bend
