"""``clustersim scale SCENARIO --gpus 64,128,...``: tokens/s and MFU against GPUs, with ideal scaling."""

from __future__ import annotations

import json
import sys

from simulator.cli_options import add_execution, add_overrides, check_workers
from simulator.errors import ConfigError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "scale",
        help="scaling curve: best (or fixed) layout per GPU count, CSV + PNG/SVG",
        description="For each GPU count, find the best layout (or keep the scenario's, --fixed) and plot "
        "tokens/s and MFU against GPUs with ideal scaling; writes scaling.csv, scaling.png, scaling.svg.",
    )
    p.add_argument("scenario", nargs="?", help="scenario YAML (default: the built-in default)")
    p.add_argument("--gpus", required=True, help="comma-separated GPU counts, e.g. 64,128,256 (run and listed "
                                                 "from the fewest GPUs, each count once)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--strong", action="store_true", help="keep the global batch (default)")
    mode.add_argument("--weak", action="store_true", help="keep the batch per GPU")
    p.add_argument("--fixed", action="store_true", help="keep the scenario's layout (dp inferred) instead of searching")
    p.add_argument("--out", default="scaling", help="output folder (default: ./scaling)")
    add_overrides(p)
    p.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2", help="search space (see search)")
    p.add_argument("--constraint", action="append", default=[], metavar="KEY=VALUE", help="search constraint")
    add_execution(p)
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    p.set_defaults(handler=run)


def run(args) -> int:
    from simulator.explore.scaling import parse_gpu_counts, render_table, scaling_curve, write_outputs
    from simulator.explore.search import SearchConstraints, SearchSpace, parse_assignments

    check_workers(args.workers)
    if args.fixed and (args.space or args.constraint):
        raise ConfigError("--fixed", "a fixed layout takes no --space or --constraint")
    from simulator.report.output_path import check_output_folder

    check_output_folder(args.out, "--out")
    counts = parse_gpu_counts(args.gpus)
    given = [int(t) for t in args.gpus.split(",")]
    if given != counts:  # the curve runs from the fewest GPUs: say so where the order given differs
        print(f"clustersim: note: --gpus {args.gpus} runs from the fewest GPUs, each count once: "
              f"{','.join(map(str, counts))}", file=sys.stderr)
    space = parse_assignments(args.space, SearchSpace, "--space", lists=True)
    constraints = parse_assignments(args.constraint, SearchConstraints, "--constraint", lists=False)
    rows = scaling_curve(args.scenario, counts, overrides=args.overrides, weak=args.weak,
                         layout="fixed" if args.fixed else "search", space=space, constraints=constraints,
                         workers=args.workers, dask=args.dask, progress=sys.stderr.isatty())
    mode = "weak" if args.weak else "strong"
    paths = write_outputs(rows, args.out, title=f"{args.scenario or 'default scenario'}: {mode} scaling, "
                          f"{'fixed layout' if args.fixed else 'best layout per GPU count'}")
    from simulator.report.messages import distinct_messages, message_lines

    # what `clustersim simulate` says of each GPU count's run, each distinct message once (the rows' warnings
    # and notes, in --json and scaling.csv, hold them per GPU count)
    said = distinct_messages(rows)
    if args.json:
        from simulator.commands.search import _finite

        json.dump(_finite(rows), sys.stdout, indent=2, default=str, allow_nan=False)
        sys.stdout.write("\n")
        for line in message_lines(*said, indent=""):  # stdout holds the JSON list alone
            print(line, file=sys.stderr)
    else:
        from simulator.commands.search import layout_read

        print(render_table(rows, read=layout_read(args.scenario, args.overrides)))
        for line in message_lines(*said):
            print(line)
    for path in paths:
        print(path, file=sys.stderr)
    return 0
