"""``clustersim simulate``: one training step of a scenario (the built-in default if none)."""

from __future__ import annotations

import json

from simulator.cli_options import add_overrides
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser("simulate", help="simulate training steps of a scenario (one by default)",
                              description="Simulate one training step (or --steps N). Without SCENARIO, runs the built-in "
                                          "default (GPT-3 175B on 1024 A100s).")
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: built-in)")
    add_overrides(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace-event JSON of the step (Perfetto)")
    p.add_argument("--trace-ranks", metavar="I,J,...",
                   help="with --trace: only these rank classes (0-based, in the trace's order: pipeline stages in "
                        "symmetric mode), e.g. 0 or 0,15: a deep pipeline's full trace runs to tens of MB")
    p.add_argument("--trace-summary", action="store_true",
                   help="with --trace: one event per layer pass and stream instead of one per kernel (FLOPs, bytes "
                        "and busy time summed in its args): about 10x smaller")
    p.add_argument("--mode", choices=["symmetric", "full"], help="override simulation.mode")
    p.add_argument("--steps", type=int, metavar="N",
                   help="unroll N training steps back to back (simulation.steps): mean and per-step times")
    p.add_argument("--engine", choices=["full", "fast", "auto"], default="full",
                   help="full: the discrete-event engine (default, the reference); fast: the longest path over "
                   "the same task DAG (exact where no transfers share a link); auto: fast where exact, else full")
    p.set_defaults(handler=run)


def _trace_ranks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        ranks = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ConfigError("--trace-ranks", f"expected comma-separated integers, got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise ConfigError("--trace-ranks", f"expected rank-class indices >= 0, got {text!r}")
    return ranks


def memory_series(result) -> dict[str, list[list[float]]] | None:
    """The engine's memory over time per rank class, as ``[time_s, bytes]`` change points (the
    bytes held from that time on; the first point is the rank's base: weights, gradients, optimizer
    state). None where no series was simulated (a folded steady state, a plan that does not fit)."""
    if not result.memory_series_bytes:
        return None
    out = {}
    for actor, series in result.memory_series_bytes.items():
        points: list[list[float]] = []
        for t, held in series:
            point = [round(float(t), 12), round(float(held))]
            if points and points[-1][0] == point[0]:
                points[-1] = point   # several changes at one instant: the last holds
            elif not points or points[-1][1] != point[1]:
                points.append(point)
        out[actor] = points
    return out


def annotate(result, scenario) -> None:
    """What ``clustersim simulate`` adds to a result beside the step's figures (``result.extra``): each efficiency's
    provenance and state, the WARNINGs and NOTEs every command says of the scenario
    (simulator/report/messages.py), the no-framework block, the framework profile used, an MoE run's grouped
    kernels. The table and ``--json`` read them; ``clustersim.simulate`` (the notebook API) calls this too, so
    its ``to_dict()`` and notebook table say the same as the command line."""
    from simulator.cost.provenance import (
        assumed_components,
        efficiency_provenance,
        efficiency_states,
        grouped_gemm_kernels,
        network_fields_not_applied,
        runs_no_fp8_gemm,
    )
    from simulator.report.messages import scenario_messages

    provenance = efficiency_provenance(scenario)
    result.extra["efficiency_provenance"] = provenance
    result.extra["assumed_efficiencies"] = assumed_components(provenance)
    result.extra["efficiency_states"] = efficiency_states(provenance)
    # the WARNINGs and NOTEs every command that simulates this scenario says (simulator/report/messages.py)
    messages = scenario_messages(scenario)
    result.extra["warnings"] = messages["warnings"]
    if messages["default_framework"] is not None:  # no training.framework named: how far off
        result.extra["default_framework"] = messages["default_framework"]
    if not scenario.mixed and runs_no_fp8_gemm(scenario):  # fp8 asked, every GEMM priced in bf16: said
        result.extra["precision_priced"] = "bf16"
    if fields := network_fields_not_applied(scenario):  # a network's training fields not acted on as asked
        result.extra["training_fields_not_applied"] = fields
    from simulator.strategies.registry import unread_layout_fields, unread_layout_note

    notes = list(messages["notes"])
    if unread := unread_layout_fields(scenario):  # layout fields the kind never reads (per_layer's pp): said
        result.extra["unread_layout_fields"] = unread
        notes.append(unread_layout_note(scenario, unread))
    if notes:
        result.extra["notes"] = notes
    if grouped := grouped_gemm_kernels(scenario):  # MoE experts: the grouped kernel per part, measured or assumed
        result.extra["grouped_gemm"] = grouped
    if scenario.frameworks:  # training.framework: the entry used, its factors and the rows they were fitted on
        choices = [c.as_dict() for c in scenario.frameworks]
        result.extra["framework_profile"] = choices[0] if len(choices) == 1 else choices


def run(args) -> int:
    from simulator.startup import paused_gc

    with paused_gc():  # imports, validators, catalogs, the scenario: long-lived, no garbage
        import simulator.cost.provenance  # noqa: F401 - imported here with the collector paused; annotate's
        import simulator.report.messages  # noqa: F401
        from simulator.report.result import finite_json, render_table
        from simulator.scenario import load_scenario
        from simulator.simulate import simulate

        ranks = _trace_ranks(args.trace_ranks)
        if ranks is not None and args.trace is None:
            raise ConfigError("--trace-ranks", "needs --trace FILE")
        if args.trace_summary and args.trace is None:
            raise ConfigError("--trace-summary", "needs --trace FILE")
        if args.trace is not None:
            from simulator.report.output_path import check_output_path

            check_output_path(args.trace, "--trace")
        overrides = list(args.overrides)
        if args.steps is not None and args.steps < 1:  # the option the user typed, not simulation.steps
            raise ConfigError("--steps", f"must be at least 1, got {args.steps}")
        if args.steps is not None:
            overrides.append(f"simulation.steps={args.steps}")
        scenario = load_scenario(args.scenario, overrides)
    result = simulate(scenario, mode=args.mode, detail=bool(args.trace), engine=args.engine)
    annotate(result, scenario)
    if args.trace:
        from simulator.report.trace import write_chrome_trace

        write_chrome_trace(result, args.trace, ranks, summary=args.trace_summary)
    if args.json:
        doc = result.to_dict()
        doc["memory_series_bytes"] = memory_series(result)
        print(json.dumps(finite_json(doc), indent=2, default=str, allow_nan=False))
    else:
        print(render_table(result))
        if args.trace:
            print(f"\n  trace written to {args.trace}")
    return 0
