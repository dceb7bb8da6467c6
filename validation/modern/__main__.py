"""``python -m validation.modern [--case-set NAME] [--half heldout|fit|all] [--fit [--write]] [--json] [--override K=V]``.

Without ``--fit``: simulate the chosen half of each set with its fitted profile and print the
errors (overall, BF16/FP8 apart, per accelerator) against the targets, then the same cases with the
catalog constants alone (no profile: what an unseen run gets; ``--no-catalog-only`` skips it), and
as a user gets them: ``training.framework`` naming the row's framework, whose shipped profile
(hardware_specs/frameworks/) gives the factors, fitted, carried over or assumed as for any run
(the LLM framework sets; ``--no-user-profile`` skips it). A set with rows on boards none of its rows was fitted on
(the CNN sets: DGX-1 V100 32 GB, H100/A100 PCIe and GH200 hosts, whose efficiencies validation/derive_parts.py
derives from the SXM parts), or on a part and precision too few of its fit rows fitted (Lambda's A100 SXM fp16),
prints them on their own "derived parts" line, every row held out and judged against
the set's targets as a user naming the row's framework gets them; its figures never enter the set's. ``--framework-table``: that figure per
framework x accelerator x precision as a Markdown table, and the choice on parts no row ran on.
``--override key.path=value``, repeatable: every case with that change, a what-if that is not the
validation result. ``--fit``: fit the framework
constants of each set on its fit half (``--write`` saves them to validation/profiles/ and the shipped
framework profiles to hardware_specs/frameworks/; ``--ship`` writes the latter again from the former). Exit code 1
when a reported set, or its derived-parts line, misses its target. ``--by-accelerator``: the table per
catalog accelerator in docs/validation.md (validation/modern/by_accelerator.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from simulator.errors import ConfigError
from validation.case_set_option import add_case_set_option
from validation.modern.framework_table import FRAMEWORK_SETS
from validation.modern.new_scenarios import lambda_fp16_note
from validation.modern.registry import (
    SETS,
    board_ratio_check,
    built,
    catalog_only,
    derived_cases,
    derived_report,
    evaluate,
    evaluate_derived,
    fit,
    report,
    user_profile,
    write_fit,
)
from validation.modern.shipped import write_shipped


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _print_breakdown(block: dict, oom: bool, indent: str) -> None:
    """One line per summary (all cases, each precision, each accelerator) of a fitted, as-a-user or
    catalog-only block; ``oom`` adds the count of rows predicted out of memory. Under "all", the held-out
    rows whose simulated scenario no fit row has (validation/modern/new_scenarios.py), where the block has
    held-out rows."""
    for title, rows in (("all", [block["overall"]]), ("precision", block["by_precision"]),
                        ("accelerator", block["by_accelerator"])):
        for s in rows:
            print(f"{indent}{title:<11} {s['label']:<16} n={s['cases']:<4} median |error| "
                  f"{_pct(s['median_abs_error']):>7} max {_pct(s['max_abs_error']):>7} "
                  f"median error {_pct(s['median_error']):>7}"
                  f"{'  predicted OOM: ' + str(s['predicted_oom']) if oom and s.get('predicted_oom') else ''}")
            new = block.get("new_scenarios") if title == "all" else None
            if new is not None:
                print(f"{indent}{'new scen.':<11} {'only':<16} n={new['cases']:<4} median |error| "
                      f"{_pct(new['median_abs_error']):>7} max {_pct(new['max_abs_error']):>7} "
                      f"median error {_pct(new['median_error']):>7}"
                      f"{'  predicted OOM: ' + str(new['predicted_oom']) if oom and new.get('predicted_oom') else ''}"
                      f"  ({new['cases']} of {new['heldout']} held-out rows simulate a scenario no fit row has; "
                      f"{new['repeats']} repeat one; the new rows are {new['scenarios']} distinct scenarios, one "
                      f"figure each: median {_pct(new['per_scenario_median_abs_error'])} max "
                      f"{_pct(new['per_scenario_max_abs_error'])}, not judged)")


def _print_derived(block: dict, derived: dict) -> None:
    """The set's "derived parts" line: rows on boards none of its rows was fitted on (validation/derive_parts.py,
    hardware_specs/nodes/), every one held out, as a user naming the row's framework gets them."""
    o, c = derived["overall"], derived["catalog_only"]["overall"]
    verdict = "met" if derived["met"] else (
        f"NOT MET: on these boards, which no row calibrated, a user is told rates {_pct(o['median_abs_error'])} off "
        f"at the median and up to {_pct(o['max_abs_error'])} off")
    print(f"  derived parts (boards, or a part's precision, no row of this set was fitted on; never fitted on, not "
          f"counted above; as a user naming the row's framework gets them): target {verdict}")
    whys: dict[str, list[int]] = {}
    for r in derived["cases"]:
        whys.setdefault(r.get("why") or "", []).append(r["row"])
    for why, rows in whys.items():
        if why:
            listed = f": rows {', '.join(map(str, rows))}" if len(rows) <= 8 else ""
            print(f"    on this line, {len(rows)} row{'s' if len(rows) > 1 else ''}{listed}: {why}")
    _print_breakdown(derived, oom=True, indent="    ")
    print(f"    catalog constants only (not a target): median |error| {_pct(c['median_abs_error'])} max "
          f"{_pct(c['max_abs_error'])} over {c['cases']} rows")
    check = derived.get("board_ratio")
    if check is not None and (check["pairs"] or check["skipped"]):
        print(f"    the rule alone (rate over the same configuration's rate on the sibling board, measured vs simulated "
              f"with the catalog constants on both; not a target): {len(check['pairs'])} rows, median |error| "
              f"{_pct(check['median_abs_error'])}, max {_pct(check['max_abs_error'])}; {len(check['skipped'])} rows "
              f"skipped (the sibling board's rows of that configuration run a fitted or carried time outside the "
              f"catalog's kernels)")
        for p in check["pairs"]:
            print(f"      row {p['row']:>4} {p['accelerator']:<14} / {p['sibling']:<14} {p['precision']:<5} x{p['gpus']:<2} "
                  f"measured {p['measured_ratio']:.3f} simulated {p['simulated_ratio'] or 0:.3f} "
                  f"{_pct(p['relative_error']):>7}")
    for r in derived["cases"]:
        state = f"{r['framework']} {r['state']} ({r['entry']})"
        aside = f"  [set aside: {r['set_aside']}]" if r["set_aside"] else ""
        print(f"    row {r['row']:>4} {r['label'][:72]:<72} {r['node']:<16} measured {r['measured']:>8.1f} simulated "
              f"{r['simulated'] or 0:>8.1f} {_pct(r['relative_error']):>7}  {state:<46} catalog "
              f"{_pct(r['catalog_relative_error']):>7}{'' if r['fits'] else '  (predicted OOM)'}{aside}")


def _print_assumed(assumed: dict) -> None:
    """What the set's rows assume that their source does not state, the values, and the figures resting on it."""
    r, o = assumed["resting_on_it"], assumed["the_others"]
    values = ", ".join(f"{v['model'].replace('EfficientNet-', '')} {v['gpu']} {v['batch_size_per_gpu']}"
                       for v in assumed["batch_size_per_gpu"])
    halved = [f"row {x['row']} run at {m[1]} ({m[2]} does not fit)" for x in assumed["rows"]
              if (m := re.search(r" bs(\d+) \(assumed (\d+), halved to fit\)", x["label"]))]
    print(f"  assumed, not stated by the source: {assumed['what']}. Batch per GPU (TF32/FP32 and AMP alike): {values}"
          f"{'; ' + ', '.join(halved) if halved else ''}. What the source states: {assumed['source_states']}. Also "
          f"assumed: {assumed['image_size']}. {assumed['feeds'][0].upper() + assumed['feeds'][1:]}.")
    print(f"    {r['cases']} counted rows rest on it: median |error| {_pct(r['median_abs_error'])} max "
          f"{_pct(r['max_abs_error'])}; the other {o['cases']} (batch stated): median |error| "
          f"{_pct(o['median_abs_error'])} max {_pct(o['max_abs_error'])}")


def print_report(block: dict) -> None:
    o = block["overall"]
    target = f"median <= {100 * block['median_target']:.0f}%" + (
        f", every row <= {100 * block['max_target']:.0f}%" if block["max_target"] is not None else "")
    print(f"{block['case_set']}: {block['source']} ({block['csv']})")
    print(f"  {o['cases']} cases simulated, {block['unrepresentable']} rows not representable (listed by "
          f"--unrepresentable); fitted groups: {', '.join(block['profile_groups']) or 'none'}; catalog "
          f"constants: {', '.join(block['catalog_groups']) or 'none'}")
    _print_breakdown(block, oom=True, indent="  ")
    aside = block.get("set_aside", [])
    if aside:
        print(f"  {len(aside)} rows set aside (not counted above, not fitted on), each with its error and reason:")
        said: set[str] = set()
        for a in aside:
            why = "the same reason as above" if a["why"] in said else a["why"]
            said.add(a["why"])
            print(f"    row {a['row']:>4} {a['label'][:80]:<80} measured {a['measured']:>10.1f} simulated "
                  f"{a['simulated'] or 0:>10.1f} {_pct(a['relative_error']):>7}  [set aside: {why}]")
    new = block.get("new_scenarios")
    if new is not None:
        judged = (f"held-out {'met' if block['heldout_met'] else 'NOT MET'}, new scenarios only "
                  f"{'met' if new['met'] else 'NOT MET'}: the set meets it only if both do")
        print(f"  target ({target}): {'met' if block['met'] else 'NOT MET'} ({judged})")
    else:
        print(f"  target ({target}): {'met' if block['met'] else 'NOT MET'}")
    assumed = block.get("assumed")
    if assumed is not None:
        _print_assumed(assumed)
    if block["case_set"] == "cnn_lambda":
        note = lambda_fp16_note(block)
        if note:
            print(f"  {note}")
    user = block.get("user_profile")
    if user is not None:
        print(f"  as a user gets it (training.framework naming the row's framework, the shipped profile; "
              f"{user['resimulated']} of {user['overall']['cases']} cases re-simulated): target "
              f"{'met' if user['met'] else 'NOT MET'}")
        _print_breakdown(user, oom=True, indent="    ")
        for s in user["by_framework"]:
            print(f"    framework   {s['framework'] + ' ' + s['accelerator'] + ' ' + s['precision']:<44} "
                  f"{s['state']:<10} n={s['cases']:<4} median |error| {_pct(s['median_abs_error']):>7} "
                  f"max {_pct(s['max_abs_error']):>7}")
    derived = block.get("derived_parts")
    if derived is not None:
        _print_derived(block, derived)
    catalog = block.get("catalog_only")
    if catalog is not None:
        print(f"  catalog constants only (no fitted profile: what a run of a framework x accelerator x precision no "
              f"profile covers gets; {catalog['resimulated']} of {catalog['overall']['cases']} cases re-simulated; "
              f"not a target):")
        _print_breakdown(catalog, oom=False, indent="    ")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.modern", description=__doc__.split("\n\n")[1])
    add_case_set_option(parser, "sets", sorted(SETS), repeatable=True, help="only this set (repeatable)",
                        what_if=", or --override KEY=VALUE for a what-if")
    parser.add_argument("--half", choices=("heldout", "fit", "all"), default="heldout")
    parser.add_argument("--fit", action="store_true", help="fit the framework constants on the fit half")
    parser.add_argument("--write", action="store_true", help="with --fit: write validation/profiles/modern-*.yaml")
    parser.add_argument("--cases", action="store_true", help="print every case's error")
    parser.add_argument("--unrepresentable", action="store_true", help="list the rows that are not simulated")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="change every case's scenario (as clustersim simulate --set): a what-if, not validation")
    parser.add_argument("--no-catalog-only", dest="catalog_only", action="store_false",
                        help="skip the second pass with the catalog constants alone")
    parser.add_argument("--no-user-profile", dest="user_profile", action="store_false",
                        help="skip the pass with the shipped profile of each row's framework (training.framework)")
    parser.add_argument("--framework-table", action="store_true",
                        help="print the table of training.framework: held-out error per framework x "
                             "accelerator x precision as a user gets it, and the choice on unmeasured parts")
    parser.add_argument("--by-accelerator", action="store_true",
                        help="print the table per catalog accelerator (docs/validation.md): calibrated on what, held-out error end "
                             "to end and on microbenchmarks, what is still assumed (validation/modern/by_accelerator.py; "
                             "its end-to-end column from the cached per-row errors)")
    parser.add_argument("--ship", action="store_true",
                        help="write hardware_specs/frameworks/*.yaml again from validation/profiles/ (no refit)")
    args = parser.parse_args(argv)
    names = args.sets or list(SETS)
    if args.fit and args.override:
        parser.error("--override is a what-if; the fit uses the cases as mapped")
    if args.fit:
        done: set[str] = set()
        for name in names:
            spec = SETS[name]
            if not spec.fitted or spec.profile_name in done:
                continue
            done.add(spec.profile_name)
            groups = fit(name, args.workers)
            print(json.dumps({spec.profile_name: groups}, indent=2))
            if args.write:
                write_fit(name, groups)
        if args.write:
            for path in write_shipped():
                print(f"wrote {path}")
        return 0
    if args.by_accelerator:
        from validation.modern.by_accelerator import markdown as accelerator_table

        print(accelerator_table())
        return 0
    if args.ship:
        for path in write_shipped():
            print(f"wrote {path}")
        return 0
    if args.unrepresentable:
        for name in names:
            for item in built(name)[1]:
                print(f"{name}\trow {item.row}\t{item.label}\t{item.reason}")
        return 0
    if args.framework_table:
        from validation.modern.framework_table import (
            carry_over_markdown,
            leave_part_out,
            markdown,
            unmeasured_markdown,
        )

        blocks = []
        for name in args.sets or FRAMEWORK_SETS:
            outcomes = evaluate(name, "heldout", args.workers)
            blocks.append(report(name, outcomes, catalog_only(name, outcomes, args.workers),
                                 user_profile(name, outcomes, args.workers)))
        print(markdown(blocks))
        print()
        print(unmeasured_markdown())
        print()
        print(carry_over_markdown(blocks, {b["case_set"]: leave_part_out(b["case_set"], args.workers)
                                           for b in blocks}))
        return 0
    overrides = tuple(args.override)
    if overrides:
        print(f"what-if: every case with {', '.join(overrides)} (not the validation result)\n")
    try:
        blocks = []
        for name in names:
            outcomes = evaluate(name, args.half, args.workers, overrides)
            catalog = catalog_only(name, outcomes, args.workers, overrides) if args.catalog_only else None
            user = user_profile(name, outcomes, args.workers) \
                if args.user_profile and not overrides and name in FRAMEWORK_SETS else None
            block = report(name, outcomes, catalog, user)
            if derived_cases(name) and not overrides:
                block["derived_parts"] = derived_report(name, *evaluate_derived(name, args.workers))
                block["derived_parts"]["board_ratio"] = board_ratio_check(name, args.workers)
            blocks.append(block)
    except ConfigError as exc:
        print(f"python -m validation.modern: error: --override: {exc.reason}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(blocks, indent=2))
    else:
        for block in blocks:
            print_report(block)
            if args.cases:
                for c in block["cases"]:
                    print(f"    row {c['row']:>4} {c['label'][:90]:<90} {c['attention_kernel']:<6} measured "
                          f"{c['measured'] or 0:>10.1f} simulated {c['simulated'] or 0:>10.1f} {_pct(c['relative_error']):>8}"
                          f"{'' if c['fits'] else '  (predicted OOM)'}"
                          f"{'  [repeats fit row ' + c['repeats_fit_row'] + ']' if c.get('repeats_fit_row') else ''}")
    return 0 if all(b["met"] and b.get("derived_parts", {}).get("met", True) for b in blocks) else 1


if __name__ == "__main__":
    sys.exit(main())
