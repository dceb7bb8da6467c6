"""``clustersim plot SCENARIO --out DIR``: memory per stage, time breakdown and timeline figures."""

from __future__ import annotations

from simulator.cli_options import add_overrides
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plot",
        help="write figures of a simulated step: memory per stage and over time, time breakdown, timeline",
        description="Simulate one step of the scenario and write memory.{png,svg} (per pipeline stage, stacked "
        "against HBM), memory_over_time.{png,svg} (the simulated memory of each rank class over the run, "
        "analytic peaks dotted), time_breakdown.{png,svg} and timeline.{png,svg} (Gantt by rank class and "
        "stream). --set simulation.steps=N plots N steps.",
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: the built-in default)")
    p.add_argument("--out", required=True, help="output folder")
    add_overrides(p)
    p.add_argument("--format", default="png,svg", help="comma-separated: png, svg (default both)")
    p.set_defaults(handler=run)


def run(args) -> int:
    from simulator.report.plots import FORMATS, plot_scenario
    from simulator.scenario import load_scenario

    formats = [f.strip() for f in args.format.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if not formats or bad:
        raise ConfigError("--format", f"must be png and/or svg, got {args.format!r}")
    from simulator.report.output_path import check_output_folder

    check_output_folder(args.out, "--out")
    scenario = load_scenario(args.scenario, args.overrides)
    for path in plot_scenario(scenario, args.out, formats):
        print(path)
    return 0
