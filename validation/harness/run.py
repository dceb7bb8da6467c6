"""Run the whole harness and write what it measured as plain files.

Layout of the output folder::

    DIR/manifest.json             machine, library versions, settings, date, file list
    DIR/microbench/gemm.csv       one row per (rank, precision, shape)
    DIR/microbench/memory.csv     one row per (rank, kernel, size)
    DIR/microbench/collectives.csv one row per (collective, size)
    DIR/microbench/overlap.csv    one row per rank: a GEMM alone and beside all-reduces
    DIR/microbench/skew.csv       one row per segment length: how long ranks wait for the slowest
    DIR/microbench/dispatch.csv   one row per rank (CPU): the harness GPT's fwd+bwd at a tiny shape
    DIR/microbench/loss.csv       F.cross_entropy fwd+bwd at the harness's logits shapes, per rank (CPU)
    DIR/microbench/fsdp.csv       FSDP2's gather / reduce round trips beside the bare collectives (CPU)
    DIR/microbench/microbench.json the same rows + the settings and machine
    DIR/training/runs.json        one record per strategy (layout, model spec, step times, losses, memory)
    DIR/training/runs.csv         the headline numbers of runs.json
    DIR/training/traces/*.json    PyTorch profiler Chrome traces, one per strategy and rank

The files name everything needed to redo the prediction elsewhere (``clustersim
validate-runs --runs DIR``), so a user can run this on a GPU cluster and bring them back.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import os
import platform
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

MICRO_DIR = "microbench"
TRAIN_DIR = "training"
FORMAT_VERSION = 1


def machine_info() -> dict[str, Any]:
    """Host, CPU model and cores, memory, accelerators, library versions."""
    import torch

    cpu_model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_bytes = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_bytes = int(line.split()[1]) * 1024
    except OSError:
        pass
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                         "multiprocessors": getattr(p, "multi_processor_count", None)})
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "numpy": _version("numpy"), "platform": platform.platform()}
    if torch.cuda.is_available():
        versions["cuda"] = torch.version.cuda
        try:
            versions["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model,
        "cpu_cores": os.cpu_count(),
        "cpu_affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": mem_bytes,
        "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpus": gpus,
        "versions": versions,
    }


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


def now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        for k in row:
            if k not in fields:
                fields.append(k)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (json.dumps(v) if isinstance(v, list | dict) else v) for k, v in row.items()})


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def run_microbench_files(out: Path, world_size: int, quick: bool, device: str | None = None,
                         threads_per_rank: int = 1, config=None) -> dict:
    """Run the microbenchmarks in a ``world_size`` job and write ``out/microbench/*``."""
    from validation.harness.launcher import allocator_settings, choose_device, launch
    from validation.harness.microbench import MicrobenchConfig, run_microbenchmarks
    from validation.harness.probe import probe_summary

    cfg = config or (MicrobenchConfig.quick() if quick else MicrobenchConfig())
    choice = choose_device(world_size, device=device)
    started = now_iso()
    per_rank = launch(run_microbenchmarks, world_size, cfg, device=device, threads_per_rank=threads_per_rank)
    gemm = [row for r in per_rank for row in r["gemm"]]
    memory = [row for r in per_rank for row in r["memory"]]
    collectives = per_rank[0]["collectives"]
    overlap = [row for r in per_rank for row in r.get("overlap", [])]
    skew = per_rank[0].get("skew", [])
    dispatch = [row for r in per_rank for row in r.get("dispatch", [])]
    loss = [row for r in per_rank for row in r.get("loss", [])]
    fsdp = per_rank[0].get("fsdp", [])  # folded over the ranks already (each sample its slowest rank's)
    folder = out / MICRO_DIR
    write_csv(folder / "gemm.csv", gemm)
    write_csv(folder / "memory.csv", memory)
    write_csv(folder / "collectives.csv", collectives)
    if overlap:
        write_csv(folder / "overlap.csv", overlap)
    if skew:
        write_csv(folder / "skew.csv", skew)
    if dispatch:
        write_csv(folder / "dispatch.csv", dispatch)
    if loss:
        write_csv(folder / "loss.csv", loss)
    if fsdp:
        write_csv(folder / "fsdp.csv", fsdp)
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": "clustersim-harness-microbench",
        "started": started,
        "finished": now_iso(),
        "machine": machine_info(),
        "settings": {"world_size": world_size, "backend": choice.backend, "device_type": choice.device_type,
                     "threads_per_rank": threads_per_rank, "quick": quick, **cfg.to_dict(),
                     "allocator": allocator_settings(choice.device_type)},
        "files": {"gemm": "gemm.csv", "memory": "memory.csv", "collectives": "collectives.csv",
                  **({"overlap": "overlap.csv"} if overlap else {}), **({"skew": "skew.csv"} if skew else {}),
                  **({"dispatch": "dispatch.csv"} if dispatch else {}), **({"loss": "loss.csv"} if loss else {}),
                  **({"fsdp": "fsdp.csv"} if fsdp else {})},
        "gemm": gemm, "memory": memory, "collectives": collectives, "overlap": overlap, "skew": skew,
        "dispatch": dispatch, "loss": loss, "fsdp": fsdp,
        "speed_probe": probe_summary([x for r in per_rank for x in r["probe_samples_s"]], per_rank[0]["probe_shape"]),
    }
    write_json(folder / "microbench.json", meta)
    return meta


def run_training_files(out: Path, world_size: int, quick: bool, device: str | None = None,
                       threads_per_rank: int = 1, config=None, strategies: list[str] | None = None) -> dict:
    """Run the training strategies in a ``world_size`` job and write ``out/training/*``.

    ``strategies`` (default: the default loop, ``layouts.STRATEGIES``) may name the extra ones too
    (``layouts.EXTRA_STRATEGIES``); a given ``config`` carries its own list instead."""
    from validation.harness.launcher import allocator_settings, choose_device, launch
    from validation.harness.model import default_spec
    from validation.harness.training import TrainingConfig, merge_ranks, run_training

    folder = out / TRAIN_DIR
    if config is None:
        spec = default_spec(quick=False).model_dump(exclude_none=True)
        config = TrainingConfig(spec=spec, **({"strategies": list(strategies)} if strategies else {}))
        if quick:
            config = replace(config, warmup_steps=2, steps=8, profile_steps=2)
    config = replace(config, trace_dir=str(folder / "traces"))
    choice = choose_device(world_size, device=device)
    started = now_iso()
    per_rank = launch(run_training, world_size, config, device=device, threads_per_rank=threads_per_rank)
    runs = merge_ranks(per_rank, config, world_size)
    precision = "fp32"
    for run in runs:
        run["model"] = config.spec
        run["precision"] = precision
        run["optimizer"] = "adam"
        run["backend"] = choice.backend
        run["device_type"] = choice.device_type
        run["traces"] = [os.path.relpath(t, folder) for t in run["traces"]]
    doc = {
        "format_version": FORMAT_VERSION,
        "kind": "clustersim-harness-training",
        "started": started,
        "finished": now_iso(),
        "machine": machine_info(),
        "settings": {"world_size": world_size, "backend": choice.backend, "device_type": choice.device_type,
                     "threads_per_rank": threads_per_rank, "quick": quick,
                     **{k: v for k, v in config.to_dict().items() if k != "trace_dir"},
                     "allocator": allocator_settings(choice.device_type)},
        "runs": runs,
    }
    write_json(folder / "runs.json", doc)
    write_csv(folder / "runs.csv", [
        {k: r[k] for k in ("strategy", "world_size", "step_time_s", "step_time_p10_s", "step_time_p90_s",
                           "steps_timed", "loss_step0", "peak_memory_kind")}
        | {"peak_memory_bytes_max": max((m or 0) for m in r["peak_memory_bytes_per_rank"]) or None,
           **{f"layout_{k}": v for k, v in r["layout"].items()}}
        for r in runs
    ])
    return doc


def run_all(out: Path, world_size: int = 2, quick: bool = False, device: str | None = None,
            threads_per_rank: int = 1, skip_training: bool = False, skip_microbench: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"format_version": FORMAT_VERSION, "kind": "clustersim-harness",
                                "started": now_iso(), "command": " ".join(sys.argv),
                                "world_size": world_size, "quick": quick}
    if not skip_microbench:
        run_microbench_files(out, world_size, quick, device, threads_per_rank)
    if not skip_training:
        run_training_files(out, world_size, quick, device, threads_per_rank)
    manifest["finished"] = now_iso()
    manifest["machine"] = machine_info()
    manifest["files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    write_json(out / "manifest.json", manifest)
    return manifest
