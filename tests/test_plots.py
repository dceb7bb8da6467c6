"""Figures (simulator/report/plots.py, `clustersim plot`): memory per stage, time breakdown, timeline."""

from __future__ import annotations

from simulator.cli import main
from simulator.report.plots import memory_figure, time_breakdown_figure, timeline_figure

SMALL = ["--set", "model=llama-1b", "--set", "cluster.node=dgx-h100", "--set", "cluster.num_gpus=16",
         "--set", "training.seq_length=1024", "--set", "parallelism.tp=2", "--set", "parallelism.pp=2",
         "--set", "parallelism.virtual_stages=1", "--set", "parallelism.schedule=1f1b",
         "--set", "parallelism.global_batch_size=16"]


def test_cli_writes_all_figures(tmp_path, capsys):
    assert main(["plot", "--out", str(tmp_path), *SMALL]) == 0
    printed = capsys.readouterr().out.split()
    for stem in ("memory", "time_breakdown", "timeline"):
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
