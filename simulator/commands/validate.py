"""``clustersim validate``: every published case set, simulated, with errors and tolerances.

Per case: published vs simulated and the relative error; per set: mean and max absolute
error against the set's stated tolerances. Then the sets of current hardware and frameworks
(validation/modern: NeMo, torchtitan, llm-foundry, other frameworks, vTrain, and the CNN sets of
DeepLearningExamples and Lambda) on their held-out
half, with their median / every-row targets, BF16 and FP8 apart and per accelerator; and DS3Lab's
transfers and GPT-3 XL pipelines under tc-shaped links (validation/ds3lab.py). Exit code 1
when any case or set is past its tolerance or target, so the command (and CI) fails instead of
only printing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from simulator.cli_options import check_workers
from simulator.errors import ConfigError

MODERN_SETS = ("nemo", "torchtitan", "llmfoundry", "other", "vtrain_single", "vtrain_multi", "cnn_dle", "cnn_lambda")
# DS3Lab Decentralized_FM_alpha under tc-shaped links (validation/ds3lab.py): fitted half, held-out median target.
DS3LAB_SETS = ("ds3lab_p2p", "ds3lab_gpt3xl_pipeline", "ds3lab_gpt3xl_parameter_server", "ds3lab_gpt3xl_megatron_dp",
               "ds3lab_gpt3xl_megatron_dp_p3_16xlarge")


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="simulate the published measurements and report the error",
                              description="Run every published case set (Narayanan 2021 Table 1, Korthikanti "
                                          "2022 Tables 3/5) and report per-case and per-set error; then the current "
                                          "hardware and framework sets (NeMo, torchtitan, llm-foundry, other "
                                          "frameworks, vTrain) and the CNN sets (DeepLearningExamples, Lambda) on "
                                          "their held-out half, and DS3Lab's runs under tc-shaped links. Exits 1 "
                                          "when a case or set misses its tolerance or target.")
    p.add_argument("--case-set", dest="case_sets", action="append", metavar="NAME",
                   help="only this case set (repeatable): the published sets (narayanan2021_table1, "
                        "korthikanti2022_table3_5) or " + ", ".join(MODERN_SETS + DS3LAB_SETS))
    # --set NAME was this option's name until session 11; every other command's --set is KEY.PATH=VALUE, so it is
    # --case-set now. The old spelling still works (scripts and notes use it), with a NOTE on stderr.
    p.add_argument("--set", dest="case_sets_old_flag", action="append", metavar="NAME", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel processes (default: all cores)")
    p.set_defaults(handler=run)


def _case_sets() -> dict:
    """The published case sets (imported when the command runs: ``--help`` stays fast)."""
    from validation.published_cases import CASE_SETS

    return CASE_SETS


def _run(args_tuple):
    from validation.published_cases import run_case

    case, tolerance = args_tuple
    return run_case(case, tolerance)


def summarize(name: str, results) -> dict:
    case_set = _case_sets()[name]
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


def _old_flag(args) -> str:
    """``--set NAME``, the old name of ``--case-set``: its values joined to ``--case-set``'s (said on stderr). A
    ``KEY=VALUE`` given to it (what ``--set`` means everywhere else) is refused: validate overrides no field."""
    given = args.case_sets_old_flag or []
    if not given:
        return "--case-set"
    if any("=" in value for value in given):
        raise ConfigError("--set", f"validate sets no scenario field (got {given[0]!r}): its cases are the "
                                   "published runs' own; to run only some case sets use --case-set NAME")
    args.case_sets = [*(args.case_sets or ()), *given]
    return "--set"


def run(args) -> int:
    check_workers(args.workers)
    flag = _old_flag(args)
    unknown = sorted(set(args.case_sets or ()) - set(_case_sets()) - set(MODERN_SETS) - set(DS3LAB_SETS))
    if unknown:
        raise ConfigError(flag, f"no case set {unknown[0]!r} (one of: "
                                f"{', '.join(sorted(_case_sets()) + sorted(MODERN_SETS) + sorted(DS3LAB_SETS))})")
    if flag == "--set":
        print("NOTE: validate --set NAME is now --case-set NAME (every other command's --set is KEY.PATH=VALUE); "
              "--set still works here", file=sys.stderr)
    selected = args.case_sets or list(_case_sets()) + list(MODERN_SETS) + list(DS3LAB_SETS)
    names = [n for n in selected if n in _case_sets()]
    modern = [n for n in selected if n in MODERN_SETS]
    published = _published(args, names)
    modern_blocks = _modern(args, modern) + _ds3lab([n for n in selected if n in DS3LAB_SETS])
    if args.json:  # one list: the published sets' blocks, then the modern sets' (without per-row detail)
        from simulator.report.result import finite_json

        def brief(block: dict) -> dict:
            out = {k: v for k, v in block.items() if k != "cases"}
            for part in ("catalog_only", "user_profile"):
                if part in out:
                    out[part] = {k: v for k, v in out[part].items() if k != "cases"}
            return out

        print(json.dumps(finite_json(published + [brief(b) for b in modern_blocks]),
                         allow_nan=False, default=str,
                         indent=2))
    else:
        _print_published(published)
        _print_modern(modern_blocks)
    ok = all(b["passed"] for b in published) and all(b["met"] for b in modern_blocks)
    return 0 if ok else 1


def _modern(args, names: list[str]) -> list[dict]:
    """The held-out half of each modern set, simulated with its fitted profile, with the catalog
    constants alone (validation.modern.registry.catalog_only: reported, not a target) and, for the
    framework sets, as a user naming the row's framework gets it (registry.user_profile)."""
    if not names:
        return []
    from validation.modern.framework_table import FRAMEWORK_SETS
    from validation.modern.registry import catalog_only, evaluate, report, user_profile

    blocks = []
    for name in names:
        outcomes = evaluate(name, "heldout", args.workers)
        user = user_profile(name, outcomes, args.workers) if name in FRAMEWORK_SETS else None
        blocks.append(report(name, outcomes, catalog_only(name, outcomes, args.workers), user))
    return blocks


def _ds3lab(names: list[str]) -> list[dict]:
    """DS3Lab's transfers and pipelines under shaped links: per row, and the held-out median against its target."""
    if not names:
        return []
    from validation.ds3lab import REPORTS

    return [{**REPORTS[name](), "kind": "ds3lab"} for name in names]


def _print_modern(blocks: list[dict]) -> None:
    from validation.ds3lab import print_report as print_ds3lab

    for block in [b for b in blocks if b.get("kind") == "ds3lab"]:
        print_ds3lab(block)
    blocks = [b for b in blocks if b.get("kind") != "ds3lab"]
    if not blocks:
        return
    from validation.modern.__main__ import print_report

    print("Current hardware and frameworks, held-out half (python -m validation.modern --cases for every row):\n")
    for block in blocks:
        print_report(block)


def _published(args, names: list[str]) -> list[dict]:
    jobs = [(name, case) for name in names for case in _case_sets()[name].cases()]
    work = [(case, _case_sets()[name].tolerance_per_case) for name, case in jobs]
    if args.workers == 1 or not work:
        results = [_run(w) for w in work]
    else:
        from concurrent.futures import ProcessPoolExecutor  # here: --help does not load multiprocessing

        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(_run, work))
    return [summarize(name, [r for (n, _), r in zip(jobs, results, strict=True) if n == name]) for name in names]


def _print_published(report: list[dict]) -> None:
    for block in report:
        print(f"{block['case_set']}: {block['source']}")
        print(f"  {'case':<34} {'quantity':<42} {'published':>10} {'simulated':>10} {'error':>8}")
        for c in block["cases"]:
            mark = "" if c["passed"] else "  FAIL"
            # the unit once: "TFLOP/s per GPU (incl. recompute)" already says it, "iteration time" does not
            quantity = c["quantity"] if c["quantity"].startswith(c["unit"]) else f"{c['quantity']} [{c['unit']}]"
            print(f"  {c['name']:<34} {quantity:<42} {c['published']:>10.2f} "
                  f"{c['simulated']:>10.2f} {100 * c['relative_error']:>+7.1f}%{mark}")
        verdict = "PASS" if block["passed"] else "FAIL"
        print(f"  mean |error| {100 * block['mean_abs_error']:.1f}% (tolerance {100 * block['tolerance_mean_abs']:.0f}%), "
              f"max {100 * block['max_abs_error']:.1f}% (tolerance {100 * block['tolerance_per_case']:.0f}% per case): {verdict}\n")
