"""Figures (simulator/report/plots.py, `clustersim plot`): memory per stage and over time, time breakdown, timeline."""

from __future__ import annotations

from simulator.cli import main
from simulator.report.plots import (
    memory_figure,
    memory_over_time_figure,
    time_breakdown_figure,
    timeline_figure,
)

SMALL = ["--set", "model=llama-1b", "--set", "cluster.node=dgx-h100", "--set", "cluster.num_gpus=16",
         "--set", "training.seq_length=1024", "--set", "parallelism.tp=2", "--set", "parallelism.pp=2",
         "--set", "parallelism.virtual_stages=1", "--set", "parallelism.schedule=1f1b",
         "--set", "parallelism.global_batch_size=16"]


def test_cli_writes_all_figures(tmp_path, capsys):
    assert main(["plot", "--out", str(tmp_path), *SMALL]) == 0
    printed = capsys.readouterr().out.split()
    for stem in ("memory", "memory_over_time", "time_breakdown", "timeline"):
        png, svg = tmp_path / f"{stem}.png", tmp_path / f"{stem}.svg"
        assert png.read_bytes()[:4] == b"\x89PNG" and "<svg" in svg.read_text()[:3000]
        assert str(png) in printed


def test_memory_figure_stacks_kinds_per_stage():
    stages = [{"weights": 10, "gradients": 10, "optimizer": 40, "activations": 5, "other": 1},
              {"weights": 10, "gradients": 10, "optimizer": 40, "activations": 3, "other": 1}]
    fig = memory_figure(stages, 80.0, 78.0)
    ax = fig.axes[0]
    assert len(ax.patches) == 5 * 2  # a bar per kind per stage
    tops = [p.get_y() + p.get_height() for p in ax.patches]
    assert max(tops) == 66
    assert {line.get_ydata()[0] for line in ax.get_lines()} == {80.0, 78.0}


def test_timeline_rows_per_rank_class_and_stream():
    events = [{"rank_class": "stage1", "stream": "compute", "category": "compute", "start_s": 0.0, "end_s": 1.0},
              {"rank_class": "stage0", "stream": "tp", "category": "tp_comm", "start_s": 0.5, "end_s": 0.7},
              {"rank_class": "stage0", "stream": "compute", "category": "compute", "start_s": 0.0, "end_s": 0.5}]
    ax = timeline_figure(events).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stage0 · compute", "stage0 · tp", "stage1 · compute"]
    fig = time_breakdown_figure({"compute": 1.0, "tp_comm": 0.25, "dp_comm": 0.0}, 1.25)
    assert len(fig.axes[0].patches) == 2


def test_bad_format(tmp_path, capsys):
    assert main(["plot", "--out", str(tmp_path), "--format", "jpg"]) == 2
    assert "--format" in capsys.readouterr().err


def test_memory_over_time_is_a_step_line_per_rank_class_with_its_analytic_peak():
    gib = 2**30
    series = {"stage1": [(0.0, 1 * gib), (1.0, 3 * gib), (2.0, 1 * gib)], "stage0": [(0.0, 2 * gib), (1.5, 4 * gib)]}
    ax = memory_over_time_figure(series, 8.0, {"stage0": 4.0, "stage1": 3.0}).axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["stage0 (peak 4 GiB)", "stage1 (peak 3 GiB)", "HBM 8 GiB"]
    steps = [line for line in ax.get_lines() if line.get_label().startswith("stage")]
    assert [list(line.get_ydata()) for line in steps] == [[2.0, 4.0], [1.0, 3.0, 1.0]]


def test_a_timeline_above_its_event_cap_keeps_every_row_and_says_so():
    """Above ``max_events`` the figure shows the start of the run on every row (not the first rows
    whole and the last rows missing), and its title says how much it shows."""
    events = [{"rank_class": f"rank{r}", "stream": "compute", "category": "compute",
               "start_s": float(t), "end_s": t + 0.5} for r in range(4) for t in range(50)]
    fig = timeline_figure(events, "toy", max_events=100)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank{r} · compute" for r in range(4)]
    assert "the first 24 s of 200 events" in ax.get_title()
    assert "of" not in timeline_figure(events, "toy").axes[0].get_title()


def test_a_long_pipeline_that_the_engine_would_fold_still_gets_its_timeline_and_memory_series(tmp_path):
    """simulate() folds a long 1F1B pipeline (three short runs, extrapolated: no series, no timeline);
    the figures need the unrolled run (they silently lost memory_over_time and timeline before)."""
    from test_simulate import toy_raw

    from simulator.report.plots import plot_scenario
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    scenario = load_scenario(toy_raw(4, pp=4, global_batch_size=120))
    assert simulate(scenario).extra.get("engine_fold")  # this one folds in simulate
    names = {p.name for p in plot_scenario(scenario, tmp_path, formats=("png",))}
    assert {"memory_over_time.png", "timeline.png"} <= names
