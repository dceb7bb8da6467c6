"""``clustersim search SCENARIO``: every valid layout on N GPUs, simulated and ranked."""

from __future__ import annotations

import json
import os
import sys

from simulator.cli_options import add_execution, add_overrides, check_workers
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "search",
        help="enumerate, prune and simulate parallel layouts; print the best first",
        description="Enumerate every layout of the scenario's model on N GPUs (tp, pp, dp, cp, ep for MoE, virtual stages, "
        "micro-batch, ZeRO stage, recompute, sequence parallel), prune invalid and out-of-memory ones "
        "(kept as rows with the reason), time the smallest step-time lower bounds with the engine, "
        "then the rest best bound first while a bound could still reach the top k (the others are skipped and counted), "
        "rank by the engine's samples/s (tokens/s for a fixed sequence), and time the top k by the fast path too "
        "(both shown). Finished points are cached on disk.",
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: the built-in default)")
    p.add_argument("--gpus", type=int, help="number of GPUs (default: the scenario's cluster.num_gpus)")
    add_overrides(p)
    p.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2",
                   help="candidate values of a layout field, e.g. tp=4,8 or recompute=full (repeatable); "
                   "keys: tp pp cp ep virtual_stages micro_batch_size zero_stage recompute sequence_parallel schedule "
                   "global_batch_size pp_split overlap_grad_reduce overlap_param_gather overlap_tp_grad_comm overlap_p2p_comm "
                   "tp_comm_overlap")
    p.add_argument("--constraint", action="append", default=[], metavar="KEY=VALUE",
                   help="a limit, e.g. max_memory_gib=70 or tp_within_node=false (repeatable); "
                   "keys: tp_within_node max_tp max_pp max_ep min_dp max_dp max_memory_gib")
    p.add_argument("--top", type=int, default=None, help="rows to show (table default 10; --json default all)")
    p.add_argument("--json", action="store_true", help="print a JSON list, best first")
    p.add_argument("--rank-by", default="tokens_per_s", choices=["tokens_per_s", "time_to_target_s"],
                   help="best first by tokens/s (default) or by time to target (needs a convergence: block; "
                   "its steps to target are the block's numbers, not a prediction)")
    p.add_argument("--top-k", type=int, default=20, dest="top_k",
                   help="layouts ranked by the engine and also timed by the fast path (default 20)")
    p.add_argument("--csv", metavar="FILE", help="also write every row to FILE as CSV, best first (columns as "
                   "`clustersim sweep` writes them; engine_step_time_s and fast_step_time_s name which path timed what)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the on-disk cache of finished points ($CLUSTERSIM_CACHE_DIR, "
                        "default ~/.cache/clustersim/points)")
    add_execution(p)
    p.set_defaults(handler=run)


def _finite(value):
    """JSON has no NaN/Infinity: non-finite numbers become null."""
    from simulator.report.result import finite_json

    return finite_json(value)


def layout_read(scenario, overrides):
    """The ``parallelism:`` fields the strategy kind of ``scenario`` (a path; None: the default) with ``--set``
    ``overrides`` reads: ``search``'s and ``scale``'s tables show those layout columns alone
    (:func:`simulator.strategies.registry.layout_fields_read`); None for spmd. Called after the search, which has
    checked the scenario, so its strategy block parses."""
    from simulator.scenario import apply_overrides, load_raw
    from simulator.strategies.registry import get_kind, layout_fields_read, parse_strategy

    raw, _ = load_raw(scenario)
    config = parse_strategy(apply_overrides(raw, overrides or []).get("strategy"))
    return layout_fields_read(get_kind(config.kind), config)


def run(args) -> int:
    from simulator.explore.search import SearchConstraints, SearchSpace, parse_assignments, search
    from simulator.report.search_table import render_table

    if args.top is not None and args.top < 1:
        raise ConfigError("--top", f"must be at least 1, got {args.top}")
    check_workers(args.workers)
    space = parse_assignments(args.space, SearchSpace, "--space", lists=True)
    constraints = parse_assignments(args.constraint, SearchConstraints, "--constraint", lists=False)
    notes: list[str] = []
    previous = os.environ.get("CLUSTERSIM_CACHE")
    if args.no_cache:
        os.environ["CLUSTERSIM_CACHE"] = "0"  # read by the workers too (they inherit the environment)
    try:
        rows = search(args.scenario, overrides=args.overrides, num_gpus=args.gpus, space=space,
                      constraints=constraints, workers=args.workers, dask=args.dask, rank_by=args.rank_by,
                      top_k=args.top_k, progress=sys.stderr.isatty(), notes=notes)
    finally:  # --no-cache is this run's: a caller's process (clustersim.cli.main in a notebook) keeps its cache
        if args.no_cache:
            if previous is None:
                os.environ.pop("CLUSTERSIM_CACHE", None)
            else:
                os.environ["CLUSTERSIM_CACHE"] = previous
    if args.csv:
        from simulator.report.search_table import write_csv

        write_csv(rows, args.csv)
    from simulator.report.messages import distinct_messages, message_lines

    # what `clustersim simulate` says of the layouts simulated, each distinct message once (each row's
    # warnings and notes, in --json and --csv, hold them per layout)
    said = distinct_messages(rows)
    if args.json:
        shown = rows if args.top is None else rows[: args.top]
        json.dump(_finite(shown), sys.stdout, indent=2, default=str, allow_nan=False)
        sys.stdout.write("\n")
        for note in notes:  # stdout holds the JSON list alone
            print(f"NOTE: {note}", file=sys.stderr)
        for line in message_lines(*said, indent=""):
            print(line, file=sys.stderr)
    else:
        print(render_table(rows, top=args.top or 10, read=layout_read(args.scenario, args.overrides)))
        for note in notes:
            print(f"  NOTE: {note}")
        for line in message_lines(*said):
            print(line)
        if args.rank_by == "time_to_target_s" and rows and rows[0].get("convergence_source"):
            best = rows[0]
            print(f"\nranked by time to target: best {best['time_to_target_s']:,.0f} s = "
                  f"{best['steps_to_target']:,.0f} steps at global batch {best['parallelism']['global_batch_size']} "
                  f"({best['convergence_source']})")
    return 0
