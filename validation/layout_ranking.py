"""Does the simulator rank parallel layouts, and predict out-of-memory, as real clusters did?

Two published sweeps (validation/data/README.md). Each run is mapped to a scenario; the
mapping and everything it assumes is listed here. Framework-specific constants (what the
framework holds in memory beyond the analytic breakdown; how fast its kernels run) are FITTED on
a declared half of each sweep and kept in a profile (``validation/profiles/*.yaml``, written by
``python -m validation.calibrate_frameworks --write``); the other half is the check.

**The split.** A run belongs to the *fit* half when the md5 of its layout key is even, to the
*held-out* half when odd (:func:`is_heldout`). The key is the layout as printed (Playbook:
model|gpus|tp|pp|dp|zero|micro-batch; Hagemann: model|gpus|tp|pp|micro-batch|sp|checkpointing|
seq|kernel), so repeated measurements of one layout fall on the same side. Reports give the
held-out figures (and, separately, the fit half and all rows); the tests check the held-out half.

**Hagemann et al. 2023** ("Efficient Parallelization Layouts for Large-Scale Distributed Model
Training", arXiv:2311.05610; 984 runs of LLaMA 13B/30B/65B, raw data from the authors' repo).

- model ``Llama 13B/30B/65B`` -> catalog ``llama-13b/30b/65b`` (LLaMA-1 shapes); ``seq_len`` 2048
  (file default, UNVERIFIED) or 8192;
- **no dropout** (the catalog's LLaMA ``dropout: false``: no 1-byte masks kept). The sweep's run
  configurations are not published; LLaMA was trained without dropout (Touvron 2023 names none; HF
  ``LlamaConfig`` has only ``attention_dropout`` 0.0) and the Aleph Alpha codebase's dropout
  probabilities default to 0 (as recalled: UNVERIFIED). The OOM labels barely tell the two apart: refitted
  without masks (2026-12-05) the fit half's accuracy goes 94.6% -> 95.0%, the held-out half's 95.4% -> 95.0%;
- cluster: ``dgx-a100-80g`` nodes (A100 80GB is UNVERIFIED in the source); the network is not
  published: the catalog's non-blocking ``fat-tree`` without a profile, with the profile a two-tier
  fat tree whose NIC efficiency and oversubscription above pods of 8 nodes are fitted (below);
- layout: tp, pp, micro-batch as printed, dp inferred; ``sequence_parallel`` 1 -> true (blank -> false;
  ignored at tp 1); schedule 1F1B, no interleaving; **ZeRO-1** (the Aleph Alpha codebase shards the
  optimizer state; LLaMA 13B at tp 1, pp 1, micro-batch 1 on 64 GPUs ran without checkpointing,
  which only fits if the optimizer state is sharded) and **bf16 gradients** (``grad_dtype: bf16``;
  inferred the same way, UNVERIFIED: that run, and 30B at tp 1 pp 2 on 256 GPUs, would need
  52 GB / 60 GB for fp32 gradients on top of the weights, more than an 80 GB GPU);
- global batch: ~4M tokens per step (inferred in the CSV from step time x MFU, UNVERIFIED):
  4,194,304 / seq, i.e. 2048 sequences at 2048 and 512 at 8192;
- ``activation_checkpointing_type`` every_layer -> ``recompute: full``, disabled -> ``none``; the
  FlashAttention kernels -> ``training.attention: flash`` (no s x s scores stored, the core recomputed
  in the backward pass), ``torch``/``fused`` -> ``standard``;
- memory variant: ``fused_rmsnorm`` for the ``... + RMS kernel`` runs, ``unfused_rmsnorm`` otherwise
  (an unfused RMSNorm saves fp32 intermediates for its backward), with ``+full_recompute`` when
  every layer is checkpointed (then only layer inputs are stored and the overhead falls on one
  recomputed layer); the profile fits one activation factor per variant on the fit half's OOM
  labels (this sweep has no memory readings);
- the kernel otherwise is not modelled (the simulator has one kernel library), so layouts are ranked
  within groups of the same **model x GPU count x sequence length x kernel** (a refinement of the
  issue's model x GPU-count groups: comparing a FlashAttention-2 run with a plain-torch run of the
  same layout measures the kernel, which the simulator cannot see);
- measured rows ``Kernel not available`` / ``Other Error`` are dropped; ``OOM Error`` is the OOM class.
- A100 compute, NVLink and network efficiencies: the catalog's (fitted on Korthikanti 2022 Table 4
  and NCCL busbw figures, for a DGX SuperPOD) reset for this codebase and cluster by the profile
  ``hagemann-a100.yaml``: the GEMM curve x s, the per-kernel overhead L, the intra-node collective
  efficiency x c, the NIC efficiency x n and the fabric's oversubscription o, (s, L, c, n, o) fitted on
  the fit half's tokens/s (validation/calibrate_frameworks.py fit_hagemann_compute). With the catalog
  constants the predicted rate is too high by a factor that grows with tp (the codebase's TP
  all-reduces cost several times what NCCL's bus bandwidth gives), which inverts the ranking of
  tp 4-8 against tp 1-2 layouts; with a non-blocking network the layouts whose data-parallel groups
  span many nodes are predicted too fast against their groups.

**HF Ultra-Scale Playbook** (nanotron benchmark sweep, 3,287 configs on 1-64 nodes of 8xH100):

- model ``1B/3B/8B/80B`` -> ``llama-1b`` (Llama 3.2 1B shape) / ``llama-3b`` (Llama 3.2 3B with 32
  heads instead of 24: the sweep ran it at tp 16 and 32; UNVERIFIED, see the catalog entry) /
  ``llama3-8b`` / ``llama3-70b`` (the Playbook's "80B" is taken to be the Llama-3-70B shape, 80 layers,
  h 8192: UNVERIFIED); seq 4096; no dropout (nanotron's ``LlamaConfig`` has no dropout field and its
  attention calls flash-attn with ``dropout_p`` 0; the catalog models say ``dropout: false``);
- cluster: ``p5-h100-efa`` (AWS p5, EFA, the Playbook's hardware), whose collective laws are fitted on
  the Playbook's own 256 MB collective microbenchmark and its DP scaling figure
  (validation/calibrate_efa.py), not on the sweep (the sweep's runs of the figure's layouts, 1B
  tp 1 pp 1 ZeRO-0, are kept out of the held-out half); dp, tp, pp, ZeRO stage, micro-batch and the
  256-sequence global batch as printed; the gradient all-reduce not overlapped with the backward
  pass (``NANOTRON_OVERLAP_GRAD_REDUCE``, chosen on the same figure);
- nanotron runs FlashAttention (-> ``attention: flash``), tensor parallel in reduce-scatter mode
  (-> ``sequence_parallel`` when tp > 1) and a 1F1B pipeline engine; no activation checkpointing;
  fp32 gradient accumulation (the simulator's default ``grad_dtype`` for bf16);
- pipeline partition: nanotron balances stages by block compute cost, the LM head counting as
  V·h (:func:`nanotron_stage_layers`); the simulator gets the nearest split it can express
  (``first_stage_layers``/``last_stage_layers``, :func:`first_last_stage_layers`). Where nanotron's
  partition leaves a rank without any block the layout cannot run: predicted infeasible (OOM class);
- the profile ``nanotron-p5-h100.yaml`` replaces the H100's *assumed* compute efficiencies by ones
  fitted on the fit half's single-node runs (no EFA in them), gives nanotron's inter-node
  all-reduce / all-gather / reduce-scatter a fixed latency per call (~0.73 ms, fitted on the fit
  half's 2-64 node runs without pipelining: it is what tensor parallelism across nodes pays),
  gives a stage whose pipeline neighbour is on another node a host-side floor per decoder layer
  and micro-batch (one value per tp degree, ~9 ms at tp 1-2 to 47 ms at tp 16, fitted on the fit
  half's pp > 1 runs on 2-16 nodes; below), and
  maps the memory breakdown to nanotron's reported memory (fitted on the fit half's
  ``gpu_memory_GB``, read as GiB: UNVERIFIED);
- a blank status (crashed or OOM per the heatmap legend) is the OOM class (so crashes that were not
  OOM count against the simulator).

A layout is predicted to run when it maps to a valid scenario and its framework peak (the
profile's overhead applied to ``simulator.memory.analytic``'s breakdown, ``simulator/memory/overhead.py``)
is at most HBM minus ``simulation.hbm_reserve_gib``.

Metrics: Spearman rank correlation of predicted vs measured throughput per group (mean over
groups with at least ``MIN_GROUP`` measured runs; runs predicted infeasible rank last; reported
beside it, the same with every run ranked by its simulated rate, the memory verdict set aside); OOM
classification accuracy and the confusion matrix; median absolute relative error of tokens/s per
GPU on the Playbook's ok rows. Targets (the issue): Spearman >= 0.8, >= 90% OOM classified right,
median abs error <= 15%. For the Playbook the report also gives the error per node count next to
the sweep's own consistency (:func:`ultrascale_measurement_consistency`): its repeated layouts
agree within 1% at 1-2 nodes and are often > 2x apart from 4 nodes on.

Refitted 2026-12-05 without dropout masks (above): held-out 95.0%, 14 runs that ran predicted OOM, 11 OOM
runs predicted to fit. The analysis that follows is of the 2026-12-04 fit, which counted the masks.

What Hagemann's misclassified rows have in common (held-out, measured 2026-12-04): of the 12 runs
that ran but are predicted OOM, 9 are without checkpointing at pp >= 2 (8 at pp >= 4), predicted at
82-122 GiB against 78 usable, and 5 are the fastest run of their group, which is what costs the
Spearman target (0.703; 0.876 with every run ranked by its simulated rate). Of the 11 OOM rows
predicted to fit, 7 are full-recompute runs (5 of 13B at sequence 8192 on 128 GPUs) and 4
sequence-parallel runs without checkpointing, predicted at 27-78 GiB. The data contradict
themselves in places: 7 pairs where a layout that needs no more memory by any count (same model,
sequence, memory variant, tp, pp, checkpointing; at least as many GPUs, no larger micro-batch,
sequence parallel if the other is) went OOM while the other ran, e.g. 65B tp 8 pp 4 / pp 8
micro-batch 4 ran on 64 GPUs (the ``seqpara`` files) and went OOM on 128 (the main files): two of
the 12 held-out misses, which no memory model monotone in those counts gets right. Other model
forms fitted the same way were no better held-out than the profile's (95.4% right, 12): a separate
factor for the recompute working set (95.0% right, 15 runs predicted OOM), plus a logits factor
(94.0%, 17), plus one layer's working memory (95.0%, 15), a free states factor (degenerate), a
power law in the micro-batches in flight (94.6%, 14), a cap on them (92.4%, 18); grouping by the
issue's model x GPU count instead gives 0.702, by model x GPU count x sequence 0.723.

Tried 2026-12-04, also no better held-out:
- A separate factor for standard attention's s² core: 94.6%, 14.
- Scaling that core down before the variant factor: 94.8% at κ = 0.5, 92.8% at κ = 0.
- One factor per kernel: 93.6%, 14.
- Sequence parallelism that stores the all-gathered GEMM inputs: 95.2%, 16. This was suggested
  by the seqpara files. In their 87 tp > 1 pairs, sequence parallelism rescues only 5 layouts
  from OOM, where Megatron's count would rescue many.
- ZeRO-2 instead of ZeRO-1: 94.8%, 15. It is the only variant whose fitted constant comes out
  positive (+25.8 GiB, factors 1.4 / 2.1 / 3.5); ZeRO-1's is −15.8 GiB.

A flexible classifier fitted on the same labels (``validation/memory_classifier_ceiling.py``)
gets 97.6% right, but the ranking reaches only 0.75, against 0.876 with every label known. The
labels alone do not carry the target.

What the multi-node rows show (measured on all finished rows, ``--split all --csv``): when
pipeline stages sit on different nodes, a step takes about a fixed time per decoder layer of a
stage and micro-batch, whatever the micro-batch size and the model (1B to 70B alike), until the
kernels take longer: 1B, pp 2, 4 nodes, tp 8, dp 2: 28.2 s at micro-batch 1 with 128
micro-batches, 14.0 s at 2, 6.9 s at 4, 3.5 s at 8; ~11 / 17 / 27 / 57 ms per layer at tp 2 / 4 /
8 / 16 on 2-16 nodes, where the kernels take 1-5 ms. The same layouts on one node, and pp 1 over
several nodes, run at kernel speed. It is a latency, not a bandwidth (it does not grow with the
message), and no mechanism in the published material explains it; it looks like a host-side stall
of nanotron's pipeline engine with EFA. The profile models it as such (simulator/cost/host_floor.py:
the layer's passes last the longer of their kernel time and a floor per tp degree), fitted on the
fit half's runs with pp > 1 on 2-16 nodes: held-out, those runs' median |error| fell from 81% to
8.3% (383 runs), all held-out runs' from 83% to 13.2% (15.4% with one line a + b·tp for all tp
degrees). Left unmodelled: from 32 nodes on a second slowdown,
~1.4 s per micro-batch whatever the model, tp or pp (pp >= 4; ~0.8-1.2 s at pp 2), in some runs
at 32 nodes and most at 64; and at 64 nodes pp 1 runs too fall into a fast mode and a 5-10x slower
one for the same layout (1B tp 2 dp 256 on 64 nodes: 697 tokens/s/GPU against 15,700 for tp 1
dp 256 on 32). Held-out median |error| at 32 / 64 nodes: 18% / 254%.

Run ``python -m validation.layout_ranking [--case-set both] [--sample N] [--workers N] [--uncalibrated]``.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from validation.case_set_option import add_case_set_option

DATA = Path(__file__).resolve().parent / "data"
PROFILES = Path(__file__).resolve().parent / "profiles"
HAGEMANN_CSV = DATA / "hagemann2023_parallel_layouts_all_runs.csv"
ULTRASCALE_CSV = DATA / "ultrascale_playbook_config_sweep.csv.gz"  # gzip of shared/published/ (2.2 MB)
HAGEMANN_PROFILE = PROFILES / "hagemann-a100.yaml"
ULTRASCALE_PROFILE = PROFILES / "nanotron-p5-h100.yaml"

TARGET_SPEARMAN = 0.8
TARGET_OOM_ACCURACY = 0.90
TARGET_MEDIAN_ABS_ERROR = 0.15
MIN_GROUP = 5
HAGEMANN_TOKENS_PER_STEP = 4 * 1024 * 1024

HAGEMANN_MODELS = {"Llama 13B": "llama-13b", "Llama 30B": "llama-30b", "Llama 65B": "llama-65b"}
ULTRASCALE_MODELS = {"1B": "llama-1b", "3B": "llama-3b", "8B": "llama3-8b", "80B": "llama3-70b"}
FLASH_KERNELS = ("flash_attention", "flash_attention2", "flash_attention2 + RMS kernel", "flash_attentionv1.0.8")
ULTRASCALE_NODE = "p5-h100-efa"
#: nanotron's data-parallel gradient all-reduce is timed as NOT hidden behind the backward pass: the
#: Playbook's DP scaling figure (1B, DP 16-256) is fitted within -3..+6% that way and is 10-35% too
#: fast with the overlap (validation/calibrate_efa.py fit_latency_on_dp_scaling, which chooses it).
NANOTRON_OVERLAP_GRAD_REDUCE = False
#: GPU counts of that figure's multi-node points (those fits use); the sweep's runs of their layouts
#: are kept out of the held-out half.
DP_FIGURE_GPUS = (16, 32, 64, 128, 256)
DP_FIGURE_GLOBAL_BATCH = 256  # sequences ("a global batch size of 1M tokens" at seq 4096)


def dp_figure_micro_batch(dp: int) -> int:
    """The DP figure's micro-batch: 2, or 1 where 256 sequences allow no more (DP 256)."""
    return 2 if dp * 2 <= DP_FIGURE_GLOBAL_BATCH else 1
HAGEMANN_NODE = "dgx-a100-80g"


@dataclass
class Case:
    """One measured run: the scenario mapping that reproduces it and what was measured."""

    source: str                    # "hagemann" | "ultrascale"
    case_id: str
    group: tuple
    raw: dict[str, Any]
    measured_oom: bool
    measured: dict[str, float] = field(default_factory=dict)  # step_time_s, mfu, tokens_per_s_per_gpu
    mapping_error: str | None = None   # the framework could not run this layout (predicted infeasible)
    memory_variant: str | None = None  # which activation factor of the profile's memory overhead applies
    split_key: str = ""                # the layout as printed; md5 parity decides fit / held-out
    used_in_calibration: bool = False  # the layout of a figure a node law was fitted on: never held out

    @property
    def heldout(self) -> bool:
        return is_heldout(self.split_key) and not self.used_in_calibration


def is_heldout(split_key: str) -> bool:
    """The declared split: odd md5 of the layout key = held-out, even = fit."""
    return int(hashlib.md5(split_key.encode()).hexdigest(), 16) % 2 == 1


def heldout(cases: list[Case]) -> list[Case]:
    return [c for c in cases if c.heldout]


def fit_half(cases: list[Case]) -> list[Case]:
    """The even-md5 half (a run of a calibration figure's layout with odd md5 is in neither half)."""
    return [c for c in cases if not is_heldout(c.split_key)]


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class FrameworkProfile:
    """Fitted framework constants (validation/profiles/*.yaml)."""

    name: str
    memory_overhead: Any = None             # simulator.memory_overhead.MemoryOverhead
    compute_efficiency: dict | None = None  # replaces the accelerator's ``efficiency`` block
    node_overrides: dict | None = None      # merged into the catalog node (e.g. intra_node.collective_efficiency)
    fabric: dict | None = None              # replaces the mapping's catalog fabric (a FatTree spec)
    source: str = ""
    path: Path | None = None


def load_profile(path: Path) -> FrameworkProfile | None:
    """The profile at ``path`` (None when it has not been written)."""
    from simulator.memory.overhead import MemoryOverhead

    if not path.exists():
        return None
    doc = yaml.safe_load(path.read_text())
    mem = doc.get("memory_overhead")
    return FrameworkProfile(name=doc["name"], memory_overhead=MemoryOverhead.model_validate(mem) if mem else None,
                            compute_efficiency=doc.get("compute_efficiency"), node_overrides=doc.get("node_overrides"),
                            fabric=doc.get("fabric"), source=doc.get("source", ""), path=path)


@cache
def _catalog_yaml(kind: str, name: str) -> dict:
    base = Path(__file__).resolve().parents[1] / "hardware_specs" / kind
    return yaml.safe_load((base / f"{name}.yaml").read_text())


def _merged(base: dict, overrides: dict) -> dict:
    """``base`` with ``overrides`` merged in, nested mappings key by key (keys such as
    ``source``/``fitted_on`` travel with the values they describe)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def profiled_node(node: str, compute_efficiency: dict | None, node_overrides: dict | None = None) -> str | dict:
    """The catalog node, or (with fitted framework constants) the node as a mapping: its
    accelerator the catalog accelerator with ``compute_efficiency`` as its efficiency block, and
    ``node_overrides`` merged into the node spec."""
    if not compute_efficiency and not node_overrides:
        return node
    spec = copy.deepcopy(_catalog_yaml("nodes", node))
    accelerator = copy.deepcopy(_catalog_yaml("accelerators", spec["accelerator"]))
    if compute_efficiency:
        accelerator["efficiency"] = copy.deepcopy(compute_efficiency)
    spec["accelerator"] = accelerator
    return _merged(spec, node_overrides or {})


def profile_node(node: str, profile: FrameworkProfile | None) -> str | dict:
    """:func:`profiled_node` with the constants of ``profile`` (the catalog node without one)."""
    if profile is None:
        return node
    return profiled_node(node, profile.compute_efficiency, profile.node_overrides)


# --------------------------------------------------------------------------- case mapping


def _seq_from(text: Any) -> int:
    return int(str(text).split()[0])


def hagemann_case(row: dict[str, Any], profile: FrameworkProfile | None = None) -> Case | None:
    """The scenario of one Hagemann CSV row (None for rows that are neither a run nor an OOM),
    on the catalog DGX A100 or, with ``profile``, on it with the profile's fitted constants."""
    status = str(row["avg_step_time_s"])
    oom = status == "OOM Error"
    if not oom:
        try:
            step = float(status)
        except ValueError:
            return None  # "Kernel not available", "Other Error"
    seq = _seq_from(row["seq_len_from_filename"])
    tp = int(row["tensor_parallel(model_parallel_size)"])
    pp = int(row["pipeline_parallel"])
    sp_cell = row.get("sequence_parallel")
    sp = bool(sp_cell == sp_cell and sp_cell not in (None, "") and float(sp_cell) == 1.0 and tp > 1)
    kernel = str(row["kernel"])
    recompute = "full" if row["activation_checkpointing_type"] == "every_layer" else "none"
    attention = "flash" if kernel in FLASH_KERNELS else "standard"
    n = int(row["world_size"])
    mbs = int(row["micro_batch_size"])
    raw = {
        "name": f"hagemann-{row['trial_id']}",
        "model": HAGEMANN_MODELS[row["model"]],
        "cluster": {"node": profile_node(HAGEMANN_NODE, profile),
                    "fabric": copy.deepcopy(profile.fabric) if profile and profile.fabric else "fat-tree", "num_gpus": n},
        "parallelism": {"tp": tp, "pp": pp, "dp": "auto", "virtual_stages": 1, "schedule": "1f1b",
                        "sequence_parallel": sp, "zero_stage": 1, "recompute": recompute,
                        "micro_batch_size": mbs, "global_batch_size": HAGEMANN_TOKENS_PER_STEP // seq},
        "training": {"seq_length": seq, "precision": "bf16", "attention": attention, "optimizer": "adamw",
                     "grad_dtype": "bf16"},
    }
    measured = {} if oom else {"step_time_s": step, "mfu": float(row["avg_mfu"]),
                               "tokens_per_s_per_gpu": HAGEMANN_TOKENS_PER_STEP / step / n}
    variant = ("fused_rmsnorm" if "RMS kernel" in kernel else "unfused_rmsnorm") + (
        "+full_recompute" if recompute == "full" else "")
    key = f"{row['model']}|{n}|{tp}|{pp}|{mbs}|{sp}|{recompute}|{seq}|{kernel}"
    return Case("hagemann", str(row["trial_id"]), (row["model"], n, seq, kernel), raw, oom, measured,
                memory_variant=variant, split_key=key)


def _layer_cost(model) -> float:
    """nanotron's ``get_block_compute_costs`` of a decoder layer: 4·heads·head_dim·h + 3·f·h."""
    return 4 * model.num_attention_heads * model.head_dim * model.hidden_size + 3 * model.ffn_size * model.hidden_size


def nanotron_stage_layers(model, pp: int) -> list[int] | None:
    """Decoder layers per pipeline rank as nanotron places them, or None when a rank gets no block.

    nanotron (``build_model``, the Playbook's framework) cuts the list of pipeline blocks
    ``[embedding, layer_1..layer_L, final norm, LM head, cast to fp32, loss]`` by cumulative
    compute cost (``get_block_compute_costs``: a decoder layer costs 4·heads·head_dim·h + 3·f·h,
    the LM head V·h, the rest 0): block i goes to the current rank, which moves on once the
    cumulative cost passes ``total·(rank+1)/pp``. Ranks left without any block cannot run
    (the sweep's 1B at pp 16/32 and 3B at pp 32 all but never finished)."""
    blocks = [("embedding", 0.0)] + [("layer", float(_layer_cost(model)))] * model.num_layers + [
        ("norm", 0.0), ("lm_head", float(model.vocab_size * model.hidden_size)), ("cast", 0.0), ("loss", 0.0)]
    total = sum(c for _, c in blocks)
    layers, held = [0] * pp, [0] * pp
    rank, cumulative = 0, 0.0
    for kind, cost in blocks:
        if rank >= pp:
            return None
        cumulative += cost
        held[rank] += 1
        layers[rank] += kind == "layer"
        if cumulative > total * (rank + 1) / pp:
            rank += 1
    return layers if min(held) > 0 else None


def first_last_stage_layers(model, pp: int, target: list[int]) -> tuple[int | None, int | None]:
    """The simulator's nearest expressible split of ``target`` (layers per rank): it takes
    ``first_stage_layers``/``last_stage_layers`` and splits the rest evenly. Chosen so that the
    busiest rank's compute cost (decoder layers + the LM head on the last rank) is as close as
    possible to that of ``target`` (the busiest rank sets a pipeline's pace), then by the
    distance to ``target``."""
    from simulator.errors import ConfigError
    from simulator.strategies.spmd.layout import Parallelism, chunk_layer_counts

    if pp == 1:
        return None, None
    layer, head = _layer_cost(model), model.vocab_size * model.hidden_size

    def busiest(counts: list[int]) -> float:
        return max(c * layer + (head if i == pp - 1 else 0) for i, c in enumerate(counts))

    pace = busiest(target)
    best = None
    options = [None, *range(model.num_layers + 1)]
    for first in options:
        for last in options:
            try:
                counts = chunk_layer_counts(Parallelism(pp=pp, first_stage_layers=first, last_stage_layers=last),
                                            model.num_layers)
            except (ConfigError, ValueError):
                continue
            key = (abs(busiest(counts) - pace), sum(abs(a - b) for a, b in zip(counts, target, strict=True)))
            if best is None or key < best[0]:
                best = (key, first, last)
    return (best[1], best[2]) if best else (None, None)


@cache
def _nanotron_split(model_name: str, pp: int) -> tuple[bool, int | None, int | None]:
    from workloads.catalog import MODELS

    model = MODELS.get(model_name)
    target = nanotron_stage_layers(model, pp)
    if target is None:
        return False, None, None
    return (True, *first_last_stage_layers(model, pp, target))


def ultrascale_case(index: int, row: dict[str, Any], profile: FrameworkProfile | None = None) -> Case:
    """The scenario of one Ultra-Scale Playbook CSV row (with ``profile``'s compute efficiency)."""
    tp, pp = int(row["tp"]), int(row["pp"])
    gpus = int(row["gpus"])
    model_name = ULTRASCALE_MODELS[str(row["model"])]
    parallelism: dict[str, Any] = {
        "tp": tp, "pp": pp, "dp": int(row["dp"]), "virtual_stages": 1, "schedule": "1f1b",
        "sequence_parallel": tp > 1, "zero_stage": int(row["zero_stage"]),
        "recompute": "none", "micro_batch_size": int(row["micro_batch_size"]),
        "global_batch_size": int(row["global_batch_size_seqs"]),
        "overlap_grad_reduce": NANOTRON_OVERLAP_GRAD_REDUCE}
    mapping_error = None
    runs, first, last = _nanotron_split(model_name, pp)
    if not runs:
        mapping_error = f"nanotron's cost-balanced partition leaves a pipeline rank of {pp} without blocks"
    if first is not None:
        parallelism["first_stage_layers"] = first
    if last is not None:
        parallelism["last_stage_layers"] = last
    node = profile_node(ULTRASCALE_NODE, profile)
    raw = {
        "name": f"ultrascale-{index}",
        "model": model_name,
        "cluster": {"node": node, "fabric": "fat-tree", "num_gpus": gpus},
        "parallelism": parallelism,
        "training": {"seq_length": int(row["seq_len"]), "precision": "bf16", "attention": "flash",
                     "optimizer": "adamw"},
    }
    ok = str(row["status"]) == "ok"
    measured = {"tokens_per_s_per_gpu": float(row["tokens_per_sec_per_gpu"]), "mfu": float(row["mfu_pct"]) / 100,
                "memory_gb": float(row["gpu_memory_GB"])} if ok else {}
    key = (f"{row['model']}|{gpus}|{tp}|{pp}|{int(row['dp'])}|{int(row['zero_stage'])}|"
           f"{int(row['micro_batch_size'])}")
    in_dp_figure = (str(row["model"]), tp, pp, int(row["zero_stage"]), gpus, int(row["micro_batch_size"])) in {
        ("1B", 1, 1, 0, dp, dp_figure_micro_batch(dp)) for dp in DP_FIGURE_GPUS}
    return Case("ultrascale", str(index), (str(row["model"]), int(row["nodes"])), raw, not ok, measured,
                mapping_error, split_key=key, used_in_calibration=in_dp_figure)


def hagemann_cases(profile: FrameworkProfile | None = None) -> list[Case]:
    frame = pd.read_csv(HAGEMANN_CSV)
    cases = [hagemann_case(r, profile) for r in frame.to_dict("records")]
    return [c for c in cases if c is not None]


def ultrascale_cases(profile: FrameworkProfile | None = None) -> list[Case]:
    frame = pd.read_csv(ULTRASCALE_CSV)
    return [ultrascale_case(i, r, profile) for i, r in enumerate(frame.to_dict("records"))]


def calibrated(source: str) -> tuple[list[Case], FrameworkProfile | None]:
    """The cases of ``source`` mapped with its fitted profile (if written), and the profile."""
    if source == "hagemann":
        profile = load_profile(HAGEMANN_PROFILE)
        return hagemann_cases(profile), profile
    profile = load_profile(ULTRASCALE_PROFILE)
    return ultrascale_cases(profile), profile


# --------------------------------------------------------------------------- prediction


def predict_memory(case: Case, overhead=None) -> dict[str, Any]:
    """Cheap prediction (memory model only): fits, peak GiB, or the invalid-layout reason.
    With ``overhead`` (a MemoryOverhead) the framework peak decides."""
    from simulator.errors import ConfigError
    from simulator.memory.analytic import fits, peak_rank_memory
    from simulator.memory.overhead import fits_with_overhead
    from simulator.scenario import build_scenario

    if case.mapping_error:
        return {"fits": False, "peak_memory_gib": None, "invalid": case.mapping_error}
    try:
        scenario = build_scenario(case.raw)
    except ConfigError as exc:
        return {"fits": False, "peak_memory_gib": None, "invalid": str(exc)}
    if overhead is not None:
        ok, peak_gib, reason = fits_with_overhead(scenario, overhead, case.memory_variant)
        return {"fits": ok, "peak_memory_gib": peak_gib, "invalid": None, "reason": reason}
    _, peak, _ = peak_rank_memory(scenario)
    ok, reason = fits(scenario, peak)
    return {"fits": ok, "peak_memory_gib": peak.total_gib, "invalid": None, "reason": reason}


def _simulate_case(job: tuple[dict[str, Any], dict | None, str | None]) -> dict[str, Any]:
    from simulator.errors import ConfigError
    from simulator.memory.overhead import MemoryOverhead, fits_with_overhead
    from simulator.scenario import build_scenario
    from simulator.simulate import simulate_point

    raw, overhead, variant = job
    result = simulate_point(raw, run_if_oom=True)  # timed even when predicted OOM (see predict_throughput)
    if overhead is None or result.get("step_time_s") is None:
        return result
    try:
        ok, _, reason = fits_with_overhead(build_scenario(raw), MemoryOverhead.model_validate(overhead), variant)
    except ConfigError as exc:
        return {"fits": False, "infeasible_reason": str(exc), "step_time_s": None}
    result["fits"], result["infeasible_reason"] = ok, reason
    return result


def predict_throughput(cases: list[Case], workers: int | None = None, overhead=None) -> list[dict[str, Any]]:
    """Simulate every case (in parallel); rows with the predicted tokens/s per GPU and MFU.
    Cases predicted infeasible (mapping error, OOM by ``overhead`` or the plain memory model) get no
    rate; those predicted OOM are still timed, as ``tokens_per_s_per_gpu_if_run``, so a report can
    tell the throughput model's ranking from the memory verdict's share in it."""
    from simulator.explore.sweep import parallel_map

    out: list[dict[str, Any]] = [{} for _ in cases]
    todo = [i for i, c in enumerate(cases) if not c.mapping_error]
    for i, c in enumerate(cases):
        if c.mapping_error:
            out[i] = {"fits": False, "infeasible_reason": c.mapping_error}
    dumped = overhead.model_dump() if overhead is not None else None
    jobs = [(cases[i].raw, dumped, cases[i].memory_variant) for i in todo]
    chunk = max(1, len(jobs) // ((workers or 2) * 4))
    for k, ok, result in parallel_map(_simulate_case, jobs, workers=workers, chunk_size=chunk):
        idx = todo[k]
        if not ok:
            out[idx] = {"fits": False, "error": str(result)}
            continue
        n = cases[idx].raw["cluster"]["num_gpus"]
        timed = result.get("tokens_per_s")
        rate = timed if result.get("fits") else None
        out[idx] = {"fits": bool(result.get("fits")),
                    "step_time_s": result.get("step_time_s") if rate else None, "mfu": result.get("mfu") if rate else None,
                    "tokens_per_s_per_gpu": rate / n if rate else None,
                    "tokens_per_s_per_gpu_if_run": timed / n if timed else None,
                    "infeasible_reason": result.get("infeasible_reason")}
    return out


# --------------------------------------------------------------------------- metrics


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties); NaN when either side is constant."""
    sx, sy = pd.Series(x, dtype=float).rank(), pd.Series(y, dtype=float).rank()
    if sx.nunique() < 2 or sy.nunique() < 2:
        return math.nan
    return float(sx.corr(sy))


def group_spearman(groups: dict[tuple, list[tuple[float, float]]]) -> dict[tuple, float]:
    """Spearman of (predicted, measured) pairs per group, for groups of at least ``MIN_GROUP`` runs."""
    return {g: spearman([p for p, _ in v], [m for _, m in v]) for g, v in groups.items() if len(v) >= MIN_GROUP}


def mean_finite(values) -> float:
    """Mean of the values that are not NaN (NaN when none are)."""
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def confusion(measured_oom: list[bool], predicted_oom: list[bool]) -> dict[str, int]:
    """Counts of (measured, predicted) OOM classes."""
    out = {"oom_predicted_oom": 0, "oom_predicted_fits": 0, "ok_predicted_oom": 0, "ok_predicted_fits": 0}
    for m, p in zip(measured_oom, predicted_oom, strict=True):
        out[f"{'oom' if m else 'ok'}_predicted_{'oom' if p else 'fits'}"] += 1
    return out


def accuracy(matrix: dict[str, int]) -> float:
    total = sum(matrix.values())
    return (matrix["oom_predicted_oom"] + matrix["ok_predicted_fits"]) / total if total else math.nan


def oom_report(cases: list[Case], overhead=None) -> dict[str, Any]:
    """OOM classification of every case by the memory model (with ``overhead``: the framework peak)."""
    preds = [predict_memory(c, overhead) for c in cases]
    matrix = confusion([c.measured_oom for c in cases], [not p["fits"] for p in preds])
    wrong = [(c, p) for c, p in zip(cases, preds, strict=True) if c.measured_oom == p["fits"]]
    return {"n": len(cases), "accuracy": accuracy(matrix), "confusion": matrix, "wrong": wrong,
            "invalid": sum(1 for p in preds if p["invalid"]), "predictions": preds}


def memory_error(report: dict[str, Any], cases: list[Case]) -> dict[str, float]:
    """|predicted / measured - 1| of the peak memory over the finished runs with a memory reading (the
    Playbook's ``gpu_memory_GB``, read as GiB) that map to a valid layout, from :func:`oom_report`'s
    predictions of ``cases``: n, median, 90th percentile, max (NaN without readings)."""
    errors = sorted(abs(p["peak_memory_gib"] / c.measured["memory_gb"] - 1)
                    for c, p in zip(cases, report["predictions"], strict=True)
                    if "memory_gb" in c.measured and p["peak_memory_gib"] is not None)
    if not errors:
        return {"n": 0, "median": math.nan, "p90": math.nan, "max": math.nan}
    series = pd.Series(errors)
    return {"n": len(errors), "median": float(series.median()), "p90": float(series.quantile(0.9)),
            "max": errors[-1]}


def ranking_report(cases: list[Case], workers: int | None = None, metric: str = "tokens_per_s_per_gpu",
                   overhead=None) -> dict[str, Any]:
    """Spearman per group over the measured runs (OOM rows excluded), and throughput errors.

    ``mean_spearman_if_run`` ranks the same runs by their simulated rate whatever the memory
    verdict (only invalid layouts last): the throughput model's own ranking, whose gap to
    ``mean_spearman`` is what the runs predicted OOM cost."""
    runs = [c for c in cases if not c.measured_oom]
    preds = predict_throughput(runs, workers, overhead)
    table = [{"source": c.source, "case_id": c.case_id, "group": str(c.group), "model": c.raw["model"],
              "num_gpus": c.raw["cluster"]["num_gpus"], "heldout": c.heldout,
              **{k: v for k, v in c.raw["parallelism"].items()},
              "seq": c.raw["training"]["seq_length"],
              **{f"measured_{k}": v for k, v in c.measured.items()},
              **{f"predicted_{k}": v for k, v in p.items()}} for c, p in zip(runs, preds, strict=True)]
    groups: dict[tuple, list[tuple[float, float]]] = {}
    groups_if_run: dict[tuple, list[tuple[float, float]]] = {}
    errors = []
    unpredicted = 0
    for case, pred in zip(runs, preds, strict=True):
        groups_if_run.setdefault(case.group, []).append((pred.get(f"{metric}_if_run") or 0.0, case.measured[metric]))
        value = pred.get(metric)
        if value is None:
            unpredicted += 1  # measured ran, predicted OOM/invalid: ranked last
            value = 0.0
        else:
            errors.append(abs(value - case.measured[metric]) / case.measured[metric])
        groups.setdefault(case.group, []).append((value, case.measured[metric]))
    rho = group_spearman(groups)
    finite = [r for r in rho.values() if not math.isnan(r)]
    return {"runs": len(runs), "groups": rho, "mean_spearman": mean_finite(rho.values()),
            "mean_spearman_if_run": mean_finite(group_spearman(groups_if_run).values()),
            "min_spearman": min(finite) if finite else math.nan, "unpredicted": unpredicted,
            "median_abs_error": float(pd.Series(errors).median()) if errors else math.nan,
            "errors": errors, "table": pd.DataFrame(table)}


def ultrascale_measurement_consistency() -> pd.DataFrame:
    """How well the Playbook sweep agrees with itself, per node count: the noise floor of any
    throughput comparison against it.

    Probes: (a) layouts measured twice with exactly the same settings, and (b) layouts measured
    at ZeRO stage 0 and 1 with everything else equal (ZeRO-1 moves the same gradient bytes,
    reduce-scatter + all-gather instead of all-reduce, and shards a small optimizer step: at these
    sizes the two should run within a few percent). Per node count: the number of pairs, the
    median relative difference ``max/min - 1`` of their tokens/s/GPU, and the share of pairs more
    than 2x apart. Measured (2026-12-03): within 1% at 1-2 nodes; from 4 nodes on, a quarter to
    a half of the pairs are > 2x apart (e.g. 8B, 2 nodes, tp 8 dp 2 micro-batch 1 ZeRO-1: 737
    and 3,449 tokens/s/GPU for one layout)."""
    frame = pd.read_csv(ULTRASCALE_CSV)
    ok = frame[frame["status"] == "ok"]
    layout = ["model", "nodes", "tp", "pp", "dp", "micro_batch_size"]
    rows = []
    for _, group in ok.groupby([*layout, "zero_stage"]):  # (a) exact repeats
        values = sorted(group["tokens_per_sec_per_gpu"])
        if len(values) > 1:
            rows.append({"nodes": int(group["nodes"].iloc[0]), "probe": "repeat", "ratio": values[-1] / values[0]})
    for _, group in ok.groupby(layout):  # (b) ZeRO-0 vs ZeRO-1
        by_stage = group.groupby("zero_stage")["tokens_per_sec_per_gpu"].median()
        if {0, 1} <= set(by_stage.index):
            a, b = by_stage[0], by_stage[1]
            rows.append({"nodes": int(group["nodes"].iloc[0]), "probe": "zero0_vs_zero1",
                         "ratio": max(a, b) / min(a, b)})
    pairs = pd.DataFrame(rows)
    return (pairs.groupby("nodes")["ratio"]
            .agg(pairs="count", median_rel_diff=lambda r: float((r - 1).median()),
                 share_over_2x=lambda r: float((r > 2).mean()))
            .reset_index())


def sample(cases: list[Case], n: int | None, seed: int = 0) -> list[Case]:
    """A deterministic sample of ``n`` cases stratified by group (all when n is None)."""
    if n is None or n >= len(cases):
        return cases
    frame = pd.DataFrame({"i": range(len(cases)), "g": [str(c.group) for c in cases]})
    frac = n / len(cases)
    picked = frame.groupby("g", group_keys=False).apply(
        lambda d: d.sample(max(1, round(len(d) * frac)), random_state=seed), include_groups=False)
    return [cases[i] for i in sorted(picked["i"])]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=None, help="simulate a stratified sample of N runs per set")
    parser.add_argument("--workers", type=int, default=None)
    add_case_set_option(parser, "set", ("hagemann", "ultrascale", "both"), repeatable=False, default="both")
    parser.add_argument("--split", choices=("heldout", "fit", "all"), default="heldout",
                        help="which half the ranking/throughput figures use (OOM is printed for all three)")
    parser.add_argument("--uncalibrated", action="store_true",
                        help="ignore validation/profiles/ (plain memory model, catalog efficiencies)")
    parser.add_argument("--csv", metavar="PREFIX", help="write PREFIX_<set>.csv: predicted vs measured per run")
    args = parser.parse_args(argv)
    misses = []   # judged on the held-out half with the fitted profiles (what the targets are set on)
    judged = args.split == "heldout" and not args.uncalibrated
    for name in ("hagemann", "ultrascale"):
        if args.set not in (name, "both"):
            continue
        if args.uncalibrated:
            cases, profile = (hagemann_cases() if name == "hagemann" else ultrascale_cases()), None
        else:
            cases, profile = calibrated(name)
        overhead = profile.memory_overhead if profile else None
        print(f"== {name}: {len(cases)} cases; profile: {profile.path.name if profile else 'none'}")
        for label, part in (("held-out", heldout(cases)), ("fit", fit_half(cases)), ("all", cases)):
            oom = oom_report(part, overhead)
            print(f"OOM classification, {label} ({oom['n']}): {100 * oom['accuracy']:.1f}% right "
                  f"(target {100 * TARGET_OOM_ACCURACY:.0f}%), confusion {oom['confusion']}, "
                  f"{oom['invalid']} invalid layouts")
            if judged and label == "held-out" and oom["accuracy"] < TARGET_OOM_ACCURACY:
                misses.append(f"{name} held-out OOM classification {100 * oom['accuracy']:.1f}% < "
                              f"{100 * TARGET_OOM_ACCURACY:.0f}%")
            mem = memory_error(oom, part)
            if mem["n"]:
                print(f"   peak memory vs measured, {label} ({mem['n']} runs): median |error| {100 * mem['median']:.1f}%, "
                      f"90th percentile {100 * mem['p90']:.1f}%, max {100 * mem['max']:.1f}%")
        part = {"heldout": heldout, "fit": fit_half, "all": lambda c: c}[args.split](cases)
        runs = sample([c for c in part if not c.measured_oom], args.sample)
        rank = ranking_report(runs, args.workers, "tokens_per_s_per_gpu", overhead)
        print(f"ranking over {rank['runs']} {args.split} runs: mean Spearman {rank['mean_spearman']:.3f} "
              f"(min {rank['min_spearman']:.3f}, target {TARGET_SPEARMAN}), "
              f"median |error| of tokens/s/GPU {100 * rank['median_abs_error']:.1f}%, "
              f"{rank['unpredicted']} measured runs predicted infeasible; ranked by their simulated rate whatever "
              f"the memory verdict: {rank['mean_spearman_if_run']:.3f}")
        if judged and not rank["mean_spearman"] >= TARGET_SPEARMAN:
            misses.append(f"{name} held-out mean Spearman {rank['mean_spearman']:.3f} < {TARGET_SPEARMAN}")
        for group, rho in sorted(rank["groups"].items(), key=lambda kv: str(kv[0])):
            print(f"   {group}: {rho:.3f}")
        if name == "ultrascale":
            errs = rank["table"].assign(nodes=lambda t: t["num_gpus"] // 8)
            errs = errs[errs["predicted_tokens_per_s_per_gpu"].notna()]
            errs = errs.assign(err=(errs["predicted_tokens_per_s_per_gpu"] / errs["measured_tokens_per_s_per_gpu"] - 1).abs())
            spread = ultrascale_measurement_consistency().set_index("nodes")
            print("   per node count: median |error| of tokens/s/GPU vs the sweep's own consistency "
                  "(repeat and ZeRO-0/1 pairs: median difference, share > 2x apart)")
            for nodes, part_errs in errs.groupby("nodes"):
                row = spread.loc[nodes] if nodes in spread.index else None
                floor = (f"{100 * row['median_rel_diff']:.1f}%, {100 * row['share_over_2x']:.0f}% over 2x "
                         f"({int(row['pairs'])} pairs)") if row is not None else "no pairs"
                print(f"   {nodes:3d} nodes: {len(part_errs):4d} runs, median |error| "
                      f"{100 * part_errs['err'].median():6.1f}%; sweep consistency {floor}")
        if args.csv:
            rank["table"].to_csv(f"{args.csv}_{name}.csv", index=False)
    for miss in misses:
        print(f"MISS: {miss}")
    if judged:
        print("FAIL" if misses else "PASS")
    return 1 if misses else 0


if __name__ == "__main__":
    raise SystemExit(_main())
