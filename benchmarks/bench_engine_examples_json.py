"""Dump ``clustersim simulate --json`` for every example, one file each, to compare two versions of
the engine byte for byte (not a test: a check to run before and after an engine change).

    PYTHONPATH=<old tree> python benchmarks/bench_engine_examples_json.py /tmp/before
    PYTHONPATH=<new tree> python benchmarks/bench_engine_examples_json.py /tmp/after
    diff -r /tmp/before /tmp/after && echo identical

Each file holds the command's exit code, its stdout and its stderr; the CPU seconds per example go to
this script's stdout (compare them as ratios measured in one run).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from pathlib import Path

from simulator.cli import main as cli_main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    os.environ["CLUSTERSIM_CACHE"] = "0"
    total = 0.0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        stdout, stderr = io.StringIO(), io.StringIO()
        start = time.process_time()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = cli_main(["simulate", str(path), "--json"])
            except SystemExit as exc:
                code = exc.code
        cpu = time.process_time() - start
        total += cpu
        (out / f"{path.stem}.json").write_text(f"exit {code}\n{stdout.getvalue()}\n--- stderr\n{stderr.getvalue()}")
        print(f"{path.stem:<48} {cpu:7.3f} CPU-s  exit {code}", flush=True)
    print(f"{'total':<48} {total:7.3f} CPU-s")


if __name__ == "__main__":
    main()
