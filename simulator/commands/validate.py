"""``clustersim validate``: every published case set, simulated, with errors and tolerances.

Per case: published vs simulated and the relative error; per set: mean and max absolute
error against the set's stated tolerances. Exit code 1 when any case or set is past its
tolerance, so the command (and CI) fails instead of only printing.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ProcessPoolExecutor

from simulator.cli_options import check_workers
from validation.published_cases import CASE_SETS, run_case


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="simulate the published measurements and report the error",
                              description="Run every published case set (Narayanan 2021 Table 1, Korthikanti "
                                          "2022 Tables 3/5) and report per-case and per-set error.")
    p.add_argument("--set", dest="case_sets", action="append", choices=sorted(CASE_SETS),
                   help="only this case set (repeatable)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel processes (default: all cores)")
    p.set_defaults(handler=run)


def _run(args_tuple):
    case, tolerance = args_tuple
    return run_case(case, tolerance)


def summarize(name: str, results) -> dict:
    case_set = CASE_SETS[name]
    errors = [abs(r.relative_error) for r in results]
    mean_abs = sum(errors) / len(errors) if errors else 0.0
    return {
        "case_set": name,
        "source": case_set.source,
        "tolerance_per_case": case_set.tolerance_per_case,
        "tolerance_mean_abs": case_set.tolerance_mean_abs,
        "mean_abs_error": mean_abs,
        "max_abs_error": max(errors, default=0.0),
        "passed": all(r.passed for r in results) and mean_abs <= case_set.tolerance_mean_abs,
        "cases": [
            {"name": r.name, "quantity": r.quantity, "unit": r.unit, "published": r.published,
             "simulated": r.simulated, "relative_error": r.relative_error, "passed": r.passed}
            for r in results
        ],
    }


def run(args) -> int:
    check_workers(args.workers)
    names = args.case_sets or list(CASE_SETS)
    jobs = [(name, case) for name in names for case in CASE_SETS[name].cases()]
    work = [(case, CASE_SETS[name].tolerance_per_case) for name, case in jobs]
    if args.workers == 1:
        results = [_run(w) for w in work]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(_run, work))
    report = [summarize(name, [r for (n, _), r in zip(jobs, results, strict=True) if n == name]) for name in names]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for block in report:
            print(f"{block['case_set']}: {block['source']}")
            print(f"  {'case':<34} {'quantity':<42} {'published':>10} {'simulated':>10} {'error':>8}")
            for c in block["cases"]:
                mark = "" if c["passed"] else "  FAIL"
                print(f"  {c['name']:<34} {c['quantity'] + ' [' + c['unit'] + ']':<42} {c['published']:>10.2f} "
                      f"{c['simulated']:>10.2f} {100 * c['relative_error']:>+7.1f}%{mark}")
            verdict = "PASS" if block["passed"] else "FAIL"
            print(f"  mean |error| {100 * block['mean_abs_error']:.1f}% (tolerance {100 * block['tolerance_mean_abs']:.0f}%), "
                  f"max {100 * block['max_abs_error']:.1f}% (tolerance {100 * block['tolerance_per_case']:.0f}% per case): {verdict}\n")
    return 0 if all(b["passed"] for b in report) else 1
