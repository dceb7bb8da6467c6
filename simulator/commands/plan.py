"""``clustersim plan SCENARIO --planner NAME``: a planner from the literature searches a parallel
plan with the simulator as its cost oracle and writes it as a scenario YAML."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simulator.cli_options import add_overrides
from simulator.errors import ConfigError


def planners_text(planners: dict[str, tuple[str, dict[str, str]]], width: int = 78) -> str:
    """Every planner, its summary and its options (``clustersim plan --help``), from the planner
    registry (:func:`simulator.explore.planners.planner_help`: read from the modules' source, not
    imported, so that ``clustersim --help`` stays light)."""
    import textwrap

    blocks = []
    for name, (summary, options) in sorted(planners.items()):
        lines = textwrap.wrap(f"{name}: {summary}", width, initial_indent="  ", subsequent_indent="    ",
                              break_on_hyphens=False, break_long_words=False)
        if options:
            lines.append("    options (--option KEY=VALUE):")
            for key, text in options.items():
                lines += textwrap.wrap(f"{key}: {text}", width, initial_indent="      ",
                                       subsequent_indent="        ", break_on_hyphens=False,
                                       break_long_words=False)
        else:
            lines.append("    options: none")
        blocks.append("\n".join(lines))
    return "planners (--planner NAME):\n" + "\n".join(blocks)


def register(subparsers) -> None:
    import argparse

    from simulator.explore.planners import planner_help

    planners = planner_help()
    p = subparsers.add_parser(
        "plan",
        help="search a parallel plan with a planner from the literature; print or write it as a scenario YAML",
        description="Run a planner on the scenario's model, cluster and global batch. The planner prices candidate\n"
        "plans (its own estimate) and simulates the best with the engine; the plan it returns is a scenario\n"
        "YAML that `clustersim simulate` runs, headed by what it cost to find.",
        epilog=planners_text(planners),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", help="scenario YAML (its model, cluster and parallelism.global_batch_size are read)")
    p.add_argument("--planner", required=True, help=f"one of: {', '.join(sorted(planners))} (each one below)")
    p.add_argument("--out", help="write the plan's scenario YAML here (default: print it)")
    p.add_argument("--gpus", type=int, help="number of GPUs (default: the scenario's cluster.num_gpus)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a planner option, e.g. max_stages=3 (repeatable; each planner's options below)")
    p.add_argument("--json", action="store_true", help="print the result (plan, step time, cost to find) as JSON")
    add_overrides(p)
    p.set_defaults(handler=run)


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its child processes that have ended and been
    waited for (a planner's search workers, once their pool is shut down): ``os.times``."""
    import os

    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run(args) -> int:
    import yaml

    from simulator.explore.planners import get_planner
    from simulator.explore.sweep import absolutize
    from simulator.scenario import apply_overrides, load_raw

    planner = get_planner(args.planner)
    options = {}
    for item in args.option:
        if "=" not in item:
            raise ConfigError("--option", f"expected key=value, got {item!r}")
        key, text = (part.strip() for part in item.split("=", 1))
        options[key] = yaml.safe_load(text)
    if args.out:  # checked before the planner runs, as simulate --trace is
        from simulator.report.output_path import check_output_path

        check_output_path(args.out, "--out")
    raw, base = load_raw(args.scenario)
    raw = absolutize(apply_overrides(raw, args.overrides), base)
    if raw.get("co_located_jobs"):
        # every planner returns a per_layer or replicated_pipeline plan (or compares with one), and co-location needs
        # every rank simulated (spmd, local_sgd, parameter_server): each plan printed "the plan cannot run", after
        # the planner's work (5.7 s for adaptive on examples/vgg16-with-background-8xa100.yaml)
        from simulator.colocation.spec import refuse_co_located

        refuse_co_located("plan")
    if args.gpus is not None:
        from simulator.scenario import check_gpu_count

        raw.setdefault("cluster", {})["num_gpus"] = check_gpu_count(args.gpus)
    started_cpu_s = _cpu_s()
    result = planner.run(raw, options)
    result.cpu_s = _cpu_s() - started_cpu_s
    _drop_unread_layout_fields(result.scenario)
    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data):  # write repeated splits out, not as YAML anchors
            return True

    text = result.header() + yaml.dump(result.scenario, Dumper=_NoAliases, sort_keys=False)
    warnings, notes = _plan_messages(result)
    if args.out:
        Path(args.out).write_text(text)
    if args.json:
        json.dump({"planner": result.planner, "step_time_s": result.step_time_s, "samples_per_s": result.samples_per_s,
                   "fits": result.step_time_s is not None, "reason": result.reason,
                   "wall_s": result.wall_s, "cpu_s": result.cpu_s, "plans_estimated": result.plans_estimated,
                   "plans_simulated": result.plans_simulated, "summary": result.summary, "notes": result.notes,
                   "scenario": result.scenario, "details": result.details,
                   "warnings": warnings, "scenario_notes": notes}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    elif args.out:
        sys.stdout.write(result.header())
        print(f"# written to {args.out}")
    else:
        sys.stdout.write(text)
    from simulator.report.messages import message_lines

    for line in message_lines(warnings, notes, indent=""):  # stdout holds the plan (YAML or JSON) alone
        print(line, file=sys.stderr)
    return 0


def _drop_unread_layout_fields(scenario: dict) -> None:
    """Remove from the plan's ``parallelism`` the layout fields its strategy kind does not read
    (``StrategyKind.searched_layout_fields``; :func:`simulator.strategies.registry.unread_layout_fields`): the run is
    the same whatever their values, so a plan stating them would only earn simulate's NOTE that they do nothing
    (the per_layer planners kept the input's ``micro_batch_size``). A plan whose scenario does not load is written
    as the planner gave it."""
    from simulator.scenario import load_scenario
    from simulator.strategies.registry import SEARCHED_LAYOUT_FIELDS, get_kind

    par = scenario.get("parallelism")
    if not par:
        return
    try:
        loaded = load_scenario(scenario)
    except ConfigError:
        return
    kind = get_kind(loaded.strategy_kind)
    if kind.searched_layout_fields is None:  # spmd and the kinds that read every field
        return
    read = set(kind.searched_layout_fields(loaded.strategy))
    for name in SEARCHED_LAYOUT_FIELDS:
        if name not in read:
            par.pop(name, None)


def _plan_messages(result) -> tuple[list[str], list[str]]:
    """The WARNINGs and NOTEs ``clustersim simulate`` prints for the plan's scenario
    (simulator/report/messages.py), for a plan that was simulated; none for one that cannot run."""
    if result.step_time_s is None:
        return [], []
    from simulator.report.messages import scenario_messages
    from simulator.scenario import load_scenario

    try:
        said = scenario_messages(load_scenario(result.scenario))
    except ConfigError:  # a planner's scenario that does not load as a file would: nothing to say of it
        return [], []
    return said["warnings"], said["notes"]
