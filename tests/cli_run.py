"""Running ``clustersim`` as a user does, for the subprocess CLI tests (test_newcomer_output.py,
test_newcomer_walk.py, test_newcomer_walk2.py): one place for how the command is started and for what a refused
command must look like (exit 2, one ``clustersim: error:`` line on stderr, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``python -m simulator ARGS`` from ``cwd`` with this checkout first on the path; no calibration folder
    from the caller's environment (each test's result must not depend on it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CLUSTERSIM_CALIBRATION_DIR", None)
    return subprocess.run([sys.executable, "-m", "simulator", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)


def refused_line(*args: str, cwd: Path = ROOT) -> str:
    """The one stderr line of a refused command (exit 2, no traceback), ``clustersim: error:`` head included."""
    proc = run_cli(*args, cwd=cwd)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("clustersim: error: "), proc.stderr
    return lines[0]
