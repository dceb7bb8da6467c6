"""``python -m validation.harness --out DIR [--world-size 2] [--quick]``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m validation.harness",
        description="Run real torch.distributed microbenchmarks and training runs; write the measurements.",
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder (created)")
    parser.add_argument("--world-size", type=int, default=2, help="processes (one per GPU on CUDA; default 2)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, repetitions and steps (seconds, not minutes)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if present, else cpu")
    parser.add_argument("--threads-per-rank", type=int, default=1, help="CPU intra-op threads per process (default 1)")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--skip-microbench", action="store_true")
    args = parser.parse_args(argv)
    if args.world_size < 1:
        parser.error("--world-size must be at least 1")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("validation.harness: needs torch (pip install 'clustersim[validation]')", file=sys.stderr)
        return 2
    from validation.harness.run import run_all

    t0 = time.perf_counter()
    manifest = run_all(args.out, args.world_size, args.quick, args.device, args.threads_per_rank,
                       skip_training=args.skip_training, skip_microbench=args.skip_microbench)
    print(f"wrote {len(manifest['files'])} files under {args.out} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
