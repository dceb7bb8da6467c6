"""``training.optimizer_fusion`` accepted but changing no memory is said, on every kind that accepts it
(simulator/strategies/optimizer_fusion.py ``accumulation_notes``): with more than one micro-batch a
step per worker the gradients accumulate and stay whole until the update, so step in backward saves
nothing (GPT-1.7B cyclic DP, 2 micro-batches: 1.00694 s and 50.68 GiB under none, backward and forward
alike). Each case is ``clustersim simulate`` in a subprocess (about 0.5 CPU-s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BACKWARD = ("training.optimizer_fusion=backward saves no memory here: the {m} micro-batches a step (per worker) "
            "accumulate their gradients, which stay whole until each chunk's update")
FORWARD = ("training.optimizer_fusion=forward changes no memory: the {m} micro-batches a step (per worker) accumulate "
           "their gradients")


def _simulate(example: str, *sets: str, as_json: bool = True):
    cmd = [sys.executable, "-m", "simulator", "simulate", str(ROOT / "examples" / f"{example}.yaml")]
    for item in sets:
        cmd += ["--set", item]
    done = subprocess.run(cmd + (["--json"] if as_json else []), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout) if as_json else done.stdout


# (kind, example, settings, micro-batches a step per worker)
ACCUMULATING = [
    ("spmd", "vit-l16-step-in-backward-a100", ("parallelism.global_batch_size=2",), 2),
    ("cyclic_dp", "gpt-1.7b-cyclic-dp-a100", (), 2),
    ("local_learning", "gpt-1.7b-local-learning-a100", (), 8),
    ("async_pipeline", "gpt-1.7b-pipedream-2bw-a100", (), 16),
    ("local_sgd", "gpt-1.7b-diloco-two-continents", (), 4),
]


@pytest.mark.parametrize(("kind", "example", "sets", "micro_batches"), ACCUMULATING)
@pytest.mark.parametrize("mode", ["backward", "forward"])
def test_fusion_under_accumulation_is_noted_in_json(kind, example, sets, micro_batches, mode):
    doc = _simulate(example, *sets, f"training.optimizer_fusion={mode}")
    assert doc["strategy"] == kind
    notes = doc.get("notes") or []
    assert len(notes) == 1, notes
    assert notes[0].startswith((BACKWARD if mode == "backward" else FORWARD).format(m=micro_batches)), notes[0]


def test_the_note_is_one_line_under_the_result():
    out = _simulate("gpt-1.7b-cyclic-dp-a100", "training.optimizer_fusion=backward", as_json=False)
    lines = [line for line in out.splitlines() if "optimizer_fusion" in line]
    assert len(lines) == 1 and lines[0].startswith("  NOTE: " + BACKWARD.format(m=2)), lines
    assert out.rstrip().splitlines()[-1] == lines[0]


@pytest.mark.parametrize(("example", "sets"), [
    ("vit-l16-step-in-backward-a100", ()),  # one micro-batch a step: step in backward saves memory (4.87 -> 3.76 GiB)
    ("gpt-1.7b-pipedream-a100", ()),        # PipeDream updates after every micro-batch: nothing accumulates
    ("gpt-1.7b-cyclic-dp-a100", ("training.optimizer_fusion=none",)),
])
def test_no_note_where_fusion_applies_or_is_not_asked(example, sets):
    settings = sets or ("training.optimizer_fusion=backward",)
    assert not _simulate(example, *settings).get("notes")
