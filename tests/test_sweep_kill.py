"""Killing a sweep (SIGTERM, as ``kill PID`` sends) stops its worker processes: none is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCENARIO = """name: small
model: gpt-1.7b
cluster: {node: dgx-a100-80g, num_gpus: 8}
parallelism: {tp: 2, pp: 2, global_batch_size: 16, micro_batch_size: 1}
"""


def _descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_killing_a_sweep_leaves_no_worker_running(tmp_path):
    (tmp_path / "base.yaml").write_text(SCENARIO)
    batches = ", ".join(str(16 * k) for k in range(1, 101))
    (tmp_path / "sweep.yaml").write_text(f"base: base.yaml\ngrid:\n  parallelism.global_batch_size: [{batches}]\n"
                                         "  parallelism.tp: [1, 2]\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "sweep", "sweep.yaml", "--out", "r.csv", "--workers",
                             "2", "--no-progress"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _kill_and_check(proc, tmp_path)
    finally:  # a failed check leaves nothing running either
        if proc.poll() is None:
            for pid in _descendants(proc.pid):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.communicate()


def _kill_and_check(proc: subprocess.Popen, tmp_path: Path) -> None:
    workers: set[int] = set()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        workers |= _descendants(proc.pid)
        out = tmp_path / "r.csv"
        if len(workers) >= 2 and out.exists() and len(out.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep finished before it could be killed: make it longer"
    workers |= _descendants(proc.pid)
    assert workers, "the sweep started no worker processes"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "clustersim: interrupted"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not [p for p in workers if _alive(p)], "worker processes outlived the sweep"
    rows = (tmp_path / "r.csv").read_text().splitlines()
    assert len(rows) >= 3  # what finished before the kill is kept
