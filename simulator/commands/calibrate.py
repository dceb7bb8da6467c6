"""``clustersim calibrate``: fit a hardware profile from real microbenchmarks.

Runs the harness's microbenchmarks on this machine (``torch.distributed``: gloo on CPU, NCCL
on GPUs; torch is the ``validation`` extra) or reads their files (``--from DIR``), and writes
a profile YAML that scenarios load with ``cluster: {profile: PROFILE.yaml, num_gpus: N}``.
Training runs are never used here (``clustersim validate-runs`` checks against them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simulator.errors import ConfigError

DEFAULT_DIR = Path(os.environ.get("CLUSTERSIM_CALIBRATION_DIR", "clustersim-calibration"))


#: The most processes ``calibrate`` starts to measure with (``--world-size``): a node holds at most 72 GPUs of one
#: NVLink domain; CPU runs use a few ranks per core.
MAX_WORLD_SIZE = 1024


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit a hardware profile from microbenchmarks (runs them, or reads --from DIR)",
        description="Fit a hardware profile (accelerator GEMM/memory efficiencies, per-collective "
                    "alpha-beta laws) from the harness's microbenchmarks. Without --from, runs them here "
                    f"(gloo on CPU, NCCL on GPUs) under --dir (default ./{DEFAULT_DIR}).")
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="read measurements from DIR (a harness output folder or its microbench/ folder)")
    p.add_argument("--out", metavar="PROFILE.yaml", help="profile to write (default: DIR/profile.yaml)")
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"work folder when measuring (default ./{DEFAULT_DIR})")
    p.add_argument("--world-size", type=int, default=2, help="processes to measure with (default 2)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repetitions")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if present, else cpu")
    p.add_argument("--intra-node-kind", choices=["shm", "pcie", "nvlink", "nvswitch", "xgmi"],
                   help="intra_node.kind to record (default: shm on CPU, nvlink on GPUs)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    import json

    from simulator.cost.calibration import build_profile, read_microbench, validate_profile, write_profile

    if args.world_size < 1:
        raise ConfigError("--world-size", "must be at least 1")
    if args.world_size > MAX_WORLD_SIZE:  # each rank is a process started here: 10**6 of them would not end
        raise ConfigError("--world-size", f"{args.world_size:,} is past the limit of {MAX_WORLD_SIZE:,} processes on "
                                          "this machine (one per GPU, or a few per core on a CPU)")
    if args.source is not None and not args.source.strip():  # `--from ""` measured this machine instead (minutes)
        raise ConfigError("--from", "empty: give the folder of the harness's measurements, or leave --from out "
                                    "to measure here")
    from simulator.report.output_path import check_output_folder, check_output_path

    if args.out:
        check_output_path(args.out, "--out")
    if args.source is not None:
        folder = Path(args.source)
        if folder.is_file():  # "folder not found" misled a user who had given a file that is there
            raise ConfigError("--from", f"{folder} is a file; give the folder that holds the harness's microbenchmark "
                                        "files (gemm.csv, memory.csv, collectives.csv, microbench.json; `python -m "
                                        "validation.harness --out DIR` writes them), or the DIR holding that microbench/")
        if not folder.is_dir():
            raise ConfigError("--from", f"folder not found: {folder}")
        if not args.out:  # the profile goes into the --from folder
            check_output_path(folder / "profile.yaml", "--out (default: --from DIR/profile.yaml)")
    else:
        check_output_folder(args.dir, "--dir")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError("calibrate", "measuring needs torch (pip install 'clustersim[validation]'), "
                                           "or pass --from DIR with measurements made elsewhere") from None
        from validation.harness.run import run_microbench_files

        folder = args.dir
        print(f"measuring microbenchmarks (world size {args.world_size}) into {folder}/microbench ...", flush=True)
        try:
            run_microbench_files(folder, args.world_size, args.quick, args.device)
        except RuntimeError as exc:
            raise ConfigError("calibrate", str(exc).splitlines()[0]) from None
    data = read_microbench(folder)
    profile = build_profile(data, source_label=str(Path(data["folder"])), intra_node_kind=args.intra_node_kind)
    validate_profile(profile)
    out = Path(args.out) if args.out else (Path(folder) / "profile.yaml")
    write_profile(profile, out)
    from simulator.cost.calibration import gemm_speed_dips

    dips = gemm_speed_dips(profile["node"]["accelerator"]["efficiency"]["gemm_curve"])
    if dips:  # stderr, so that --json stays one JSON document
        print(f"WARNING: {len(dips)} GEMM size(s) ran markedly slower than a smaller GEMM of the same sweep "
              f"({'; '.join(dips)}): the machine's speed likely changed while measuring (other work, throttling); "
              "the profile keeps these rows - measure again on a quiet machine", file=sys.stderr)
    from simulator.cost.calibration import warm_memory_rows

    warm = warm_memory_rows(data["memory"], data.get("settings"))
    if warm:
        print(f"WARNING: {warm} memory-bound row(s) were timed back to back on one warm operand set (harness "
              "files from before 2026-12-06, or cold_memory_operands off): a training step meets these kernels' "
              "operands out of cache, and on a CPU whose L2 holds them the fit over-rates them (2026-12-06: "
              "2.2x for GELU and LayerNorm; every training step predicted 16-33% short) - measure again with this harness",
              file=sys.stderr)
    if args.json:
        print(json.dumps(profile, indent=2))
        return 0
    acc = profile["node"]["accelerator"]
    eff = acc["efficiency"]
    print(f"wrote {out}")
    print(f"  peak TFLOP/s      {', '.join(f'{p} {v:.4g}' for p, v in acc['peak_tflops'].items())}")
    print(f"  GEMM efficiency   {len(eff['gemm_curve'])} points, "
          f"{min(p['efficiency'] for p in eff['gemm_curve']):.2f}..{max(p['efficiency'] for p in eff['gemm_curve']):.2f}")
    print(f"  memory            {acc['hbm_bandwidth_gb_per_s']:.4g} GB/s x {eff['memory_bound_efficiency']:.3f}; "
          f"launch {eff['kernel_launch_overhead_us']:.3g} us")
    loss_eff = ((eff.get("memory_kernels") or {}).get("by_kernel") or {}).get("cross_entropy")
    if loss_eff is not None:  # loss.csv (CPU): F.cross_entropy at its own rate (calibration.fit_loss_kernel)
        print(f"  loss kernel       {acc['hbm_bandwidth_gb_per_s'] * loss_eff:.4g} GB/s (cross-entropy, loss.csv)")
    if eff.get("zero3_gather_host_us") is not None:  # fsdp.csv (CPU): calibration.fit_fsdp_host
        print(f"  FSDP host         {eff['zero3_gather_host_us'] / 1e3:.3g} ms per gather, "
              f"{eff['zero3_reduce_host_us'] / 1e3:.3g} ms per reduce (fsdp.csv)")
    for name, law in (profile["node"]["intra_node"].get("collectives") or {}).items():
        wait = (f"; + {law['arrival_wait_us']:.1f} us waiting for the last rank after compute"
                if law.get("arrival_wait_us") else "")
        print(f"  {name:<16s}  {law['latency_us']:9.1f} us + bytes / {law['bus_bandwidth_gb_per_s']:.4g} GB/s{wait}")
    return 0
