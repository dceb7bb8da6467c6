"""``clustersim compare --trace FILE [SCENARIO]``: a measured profiler trace beside a simulated step.

Reads a PyTorch profiler / Kineto Chrome trace (the harness's, or one from your own GPU job),
groups it into compute, optimizer, each kind of communication and idle (see
:mod:`simulator.report.compare`) and prints it beside the simulated step of SCENARIO, with the
relative error per category; ``--plot`` draws the measured lanes above the simulated ones.
For a harness trace (``DIR/training/traces/<strategy>_rank<r>.json``) SCENARIO may be left
out: the run's model and layout are read from ``DIR/training/runs.json`` and the hardware
from ``--profile`` (default ``DIR/profile.yaml``, then ``./clustersim-calibration/profile.yaml``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from simulator.cli_options import add_overrides
from simulator.commands.calibrate import DEFAULT_DIR
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "compare", help="compare a measured PyTorch profiler trace with the simulated step",
        description="Group a Kineto/PyTorch-profiler Chrome trace into compute, communication kinds and idle, "
                    "and set it beside the simulated step of the matching scenario.")
    p.add_argument("scenario", nargs="?", help="scenario YAML the trace was measured on (optional for harness traces)")
    p.add_argument("--trace", required=True, metavar="FILE", help="profiler trace (.json or .json.gz)")
    add_overrides(p)
    steps = p.add_mutually_exclusive_group()
    steps.add_argument("--step", type=int, metavar="N", help="use ProfilerStep#N only")
    steps.add_argument("--average", action="store_true", help="average every profiled step (the default)")
    p.add_argument("--rank-class", help="simulated rank class (default: the pipeline stage of the trace's rank)")
    p.add_argument("--profile", metavar="PROFILE.yaml", help="hardware profile for a harness trace without SCENARIO")
    p.add_argument("--plot", metavar="PNG", help="write the measured-above-simulated timeline")
    p.add_argument("--op-classes", action="store_true",
                   help="also split the step by op class (GEMM forward/backward, attention, cross-entropy, "
                        "elementwise/norm, optimizer, framework): a host (CPU) trace only")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


_HARNESS_TRACE = re.compile(r"^(?P<strategy>[a-z0-9_]+)_rank(?P<rank>\d+)\.json(\.gz)?$")


def _harness_scenario(trace: Path, profile: str | None) -> tuple[dict, str]:
    from simulator.cost.calibration import read_runs, scenario_for_run

    m = _HARNESS_TRACE.match(trace.name)
    runs_dir = trace.parent.parent  # DIR/training/traces/x.json -> DIR/training
    if not m or not (runs_dir / "runs.json").is_file():
        raise ConfigError("scenario", "give the scenario the trace was measured on (SCENARIO), "
                                      "or a harness trace next to its training/runs.json")
    doc = read_runs(runs_dir)
    match = [r for r in doc["runs"] if r["strategy"] == m["strategy"]]
    if not match:
        raise ConfigError("--trace", f"no run {m['strategy']!r} in {runs_dir / 'runs.json'}")
    candidates = [Path(profile)] if profile else [runs_dir.parent / "profile.yaml", DEFAULT_DIR / "profile.yaml"]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise ConfigError("--profile", "no hardware profile found (tried " + ", ".join(map(str, candidates))
                          + "); run `clustersim calibrate` or pass --profile")
    return scenario_for_run(match[0], found), f"harness run {m['strategy']} with {found}"


def run(args) -> int:
    from simulator.report.compare import (
        compare_rows,
        load_trace,
        measured_breakdown,
        model_mismatch,
        plot_timelines,
        simulated_breakdown,
        stage_of_rank,
        trace_rank,
        trace_world_size,
    )
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate

    trace = Path(args.trace)
    if args.plot:
        from simulator.report.output_path import check_output_path

        check_output_path(args.plot, "--plot")
    measured = measured_breakdown(trace, step=args.step)
    measured_classes = None
    if args.op_classes:  # read (and a device trace refused) before the scenario is simulated
        from simulator.report.op_classes import measured_op_classes

        measured_classes = measured_op_classes(trace, step=args.step)
    if args.scenario:
        scenario = load_scenario(args.scenario, args.overrides)
        described = str(args.scenario)
    else:
        raw, described = _harness_scenario(trace, args.profile)
        scenario = load_scenario(raw, args.overrides)
    doc = load_trace(trace)
    world = trace_world_size(doc)
    if world is not None and world != scenario.num_gpus:
        print(f"clustersim: warning: the trace was recorded on {world} ranks, the scenario has "
              f"{scenario.num_gpus} GPUs: the simulated step is not the traced run", file=sys.stderr)
    mismatch = model_mismatch(doc, scenario)
    if mismatch:
        print(f"clustersim: warning: {mismatch}", file=sys.stderr)
    result = simulate(scenario)
    from simulator.report.messages import message_lines, scenario_messages

    said = scenario_messages(scenario)  # what `clustersim simulate` says of the scenario
    par = scenario.parallelism
    rank_class = args.rank_class or stage_of_rank(trace_rank(doc), scenario.num_gpus, par.pp)
    classes = sorted({e.rank_class for e in result.timeline})
    if args.rank_class is None and rank_class is not None and classes and rank_class not in classes:
        # the default is the trace's pipeline stage; a kind whose ranks are named otherwise (swarm's peers,
        # co-located jobs' ranks) has none: say so, not "--rank-class: 'stage0' is not simulated" unasked
        shown = ", ".join(classes[:12]) + (f", ... ({len(classes)} in all)" if len(classes) > 12 else "")
        raise ConfigError("--rank-class", f"needed here: the trace's rank is pipeline stage {rank_class!r}, which this "
                                          f"scenario's ranks are not named by; give one of: {shown}")
    simulated = simulated_breakdown(result, rank_class, par.zero_stage)
    rows = compare_rows(measured, simulated)
    op_rows = None
    if measured_classes is not None:
        from simulator.report.op_classes import op_class_rows, simulated_op_classes

        detailed = simulate(scenario, detail=True)  # one timeline event per kernel (as `simulate --trace`)
        sim_class = rank_class or sorted({e.rank_class for e in detailed.timeline})[0]
        op_rows = op_class_rows(measured_classes, simulated_op_classes(detailed, sim_class))
    if args.plot:
        plot_timelines(measured, simulated, args.plot,
                       f"{trace.name} ({measured.step}) vs {scenario.name} ({simulated.step})")
    if args.json:
        from simulator.report.result import finite_json

        print(json.dumps(finite_json({"trace": str(trace), "scenario": described, "measured_step": measured.step,
                                      "simulated_rank_class": simulated.step, "rows": rows, "notes": measured.notes,
                                      **({"op_classes": op_rows} if op_rows is not None else {}),
                                      "warnings": said["warnings"], "scenario_notes": said["notes"]}),
                         indent=2, allow_nan=False))
        return 0
    print(f"trace     {trace} ({measured.step})")
    print(f"scenario  {described} -> {simulated.step}")
    print(f"{'category':<24s} {'measured':>11s} {'simulated':>11s} {'error':>8s}")
    for r in rows:
        err = "" if r["relative_error"] is None else f"{r['relative_error'] * 100:+7.1f}%"
        print(f"{r['category']:<24s} {r['measured_s'] * 1e3:9.2f}ms {r['simulated_s'] * 1e3:9.2f}ms {err:>8s}")
    if op_rows is not None:
        print(f"{'op class':<24s} {'measured':>11s} {'simulated':>11s} {'error':>8s}  (self times, main thread)")
        for r in op_rows:
            err = "" if r["relative_error"] is None else f"{r['relative_error'] * 100:+7.1f}%"
            print(f"{r['op_class']:<24s} {r['measured_s'] * 1e3:9.2f}ms {r['simulated_s'] * 1e3:9.2f}ms {err:>8s}")
    for note in measured.notes:
        print(f"  note: {note}")
    for line in message_lines(said["warnings"], said["notes"]):
        print(line)
    if args.plot:
        print(f"\n  timeline written to {args.plot}")
    return 0
