"""``clustersim sweep SWEEP.yaml``: a grid over scenario fields, streamed to CSV or Parquet."""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli_options import add_execution, check_workers
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="run a grid of scenarios in parallel; results stream to CSV/Parquet",
        description="Run every point of a sweep file (see examples/sweeps/) and stream one row per point "
        "to --out as it finishes. --resume skips points already there.",
    )
    p.add_argument("sweep", help="sweep YAML file")
    p.add_argument("--out", help="results file, .csv or .parquet (default: <sweep name>.csv)")
    p.add_argument("--resume", action="store_true", help="skip points already in --out")
    p.add_argument("--retry-errors", action="store_true", help="with --resume: rerun points recorded as errors")
    p.add_argument("--force", action="store_true", help="overwrite an existing --out")
    add_execution(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args) -> int:
    from simulator.explore.sweep import load_sweep, read_results, run_sweep, summary_table

    check_workers(args.workers)
    if args.retry_errors and not args.resume:
        raise ConfigError("--retry-errors", "needs --resume")
    sweep = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path(f"{sweep.name or Path(args.sweep).stem}.csv")
    counts = run_sweep(sweep, out, resume=args.resume, force=args.force, retry_errors=args.retry_errors,
                       workers=args.workers, dask=args.dask, progress=not args.no_progress)
    done = counts["ok"] + counts["infeasible"] + counts["error"]
    print(f"{done} points run ({counts['ok']} ok, {counts['infeasible']} infeasible, {counts['error']} errors), "
          f"{counts['skipped']} already done -> {out}", file=sys.stderr)
    results = read_results(out) if out.exists() or sweep.doc.show else None
    if results is not None and "warnings" in results:
        from simulator.report.messages import distinct_messages, message_lines

        # what `clustersim simulate` says of the points' scenarios, each distinct message once (the
        # file's warnings and notes columns hold them per point)
        for line in message_lines(*distinct_messages(results[["warnings", "notes"]].to_dict("records"))):
            print(line, file=sys.stderr)
    if sweep.doc.show:  # the sweep file's `show` columns, one line per point
        print(summary_table(sweep, results))
    return 0
