"""torchtitan results (``torchtitan_perf.csv``) as cases.

Rows give the model (Llama 3 / 3.1 8B, 70B, 405B), GPUs, FSDP / TP / PP / CP degrees, PP schedule,
sequence length, local batch (per data-parallel rank), precision (bf16, or float8 linears with the
tensorwise or rowwise recipe), torch.compile, activation checkpointing, AsyncTP and tokens/s per GPU.

Settings (torchtitan's defaults where a row says nothing): FSDP2 = ZeRO-3 over the data-parallel
ranks with the next layer's all-gather prefetched; TP always with sequence parallel (torchtitan
shards the norms) and the input-gradient reduce-scatter exposed (``overlap_tp_grad_comm: false``:
DTensor's TP issues it once both projections' backward is done and the norm's backward waits for
it; no Megatron-style overlap with the weight gradient, and AsyncTP does not fuse it either, its
input being a sum of GEMMs); AsyncTP = the simulator's pipelined TP overlap (``tp_comm_overlap``
with ``tp_overlap: async_tp``: torch's ``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``
in tp chunks, workloads/graph.py ``_tp_overlap``);
FlashAttention-2 (SDPA's flash backend; ``attention_kernel`` per GPU from
validation/data/modern/attention_kernel_by_run.csv); CP exchanges K/V by all-gather (torchtitan's default
``allgather`` rotate method); PP micro-batch 1, interleaved 1F1B with 2 stages per rank; activation
checkpointing as :func:`_recompute` maps it (per-op selective = ``recompute: selective_op``).
Without torch.compile (and where the row does not state it: torchtitan's default then) the norms,
SwiGLU and RoPE run as PyTorch eager composite ops (``training.elementwise_kernels: eager``: more
bytes moved, workloads/graph.py ``eager_bytes_per_element``); compiled, each is one fused kernel.
A sequence length the file does not give is torchtitan's train_configs default,
8192 (the CSV's README). float8 rowwise is a separate fitted group (``training.fp8_recipe: rowwise``, its
amax and cast passes; the GEMMs on the per-tensor fp8 curve): it runs slower than tensorwise, more than
its scaling traffic says, and no rowwise GEMM kernel was measured.

Parameters (issue 23, twelfth session): ``training.param_dtype: fp32``. torchtitan builds the model in fp32
(``training.dtype`` float32 by default: 0.3.0 config/configs.py; 0.1.0 train.py ``to_empty`` +
``init_weights`` on the meta-built model) and gives fully_shard ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)`` (``training.mixed_precision_param`` / ``_reduce``: 0.1.0 models/llama3/infra/parallelize.py
``apply_fsdp``, 0.3.0 models/llama3/parallelize.py ``apply_fsdp_to_decoder``), so FSDP2 keeps the fp32 shard as
the only persistent parameter and casts it per gather (torch 2.13 _fully_shard/_fsdp_collectives.py
``_get_param_all_gather_inputs``: ``_foreach_copy_`` into a flat bf16 buffer, then ``all_gather_copy_in``; the
reduced fp32 gradient is already the parameter's dtype): 4 + 8 B of weights and Adam state per parameter over
the shard, no 16-bit copy beside the fp32 master. HSDP is the same fully_shard over a 2-D mesh. A run that
shards over nothing keeps fp32 parameters too: 0.1.0 runs DDP (``replicate``) under ``torch.autocast``
(distributed/utils.py ``maybe_enable_amp``), and TP/PP without FSDP or CP with mixed precision off (fp32
throughout, a logged warning); 0.3.0 applies fully_shard with shard degree 1 for its policy. Every row here
shards (FSDP over dp_shard x cp, CP alone included: ParallelDims ``fsdp_enabled`` = dp_shard or cp).

MI300X: no attention kernel of it was measured (the catalog prices SDPA's fused attention from the
GEMM curve, *assumed*), and torchao's four MI300X rows are one configuration (Llama 3 8B, FSDP2 on 8
GPUs, per-op SAC) in bf16 and in three float8 recipes: the recipes change the GEMMs only, so bf16 and
float8 rows together pin the attention rate. They form one group, :data:`ATTENTION_GROUPS`, fitted on
the attention factor alone (its GEMMs stay at the MAMF/MAF microbenchmark calibration); its two
fit-half rows are enough for one constant (validation/modern/profiles.py fit_attention_only).

Hardware: "Grand Teton" H100s are 96 GB HBM2e (2.4 TB/s) cards at a 500 W limit (catalog DGX H100
with those HBM values; the clock the cap allows is left to the fitted constant); H200 rows on HGX
H200; MI300X rows on the 8 x MI300X node; A100 rows on DGX A100 80GB.
"""

from __future__ import annotations

from validation.modern.case import ModernCase, Unrepresentable
from validation.modern.mapping import cell_int, node_variant, read, scenario
from validation.modern.run_kernels import run_kernel, with_run_kernel

CSV = "torchtitan_perf.csv"
MODELS = {"Llama 3.1 8B": "llama3-8b", "Llama 3 8B": "llama3-8b", "Llama 3.1 70B": "llama3-70b",
          "Llama 3 70B": "llama3-70b", "Llama 3.1 405B": "llama3-405b"}
#: The GPU of the CSV's gpu cell by its prefix, as attention_kernel_by_run.csv names it.
GPUS = ("H100", "H200", "MI300X", "A100")
GRAND_TETON = node_variant("dgx-h100", {"hbm_gib": 96, "hbm_bandwidth_gb_per_s": 2400, "tdp_watts": 500},
                           {"name": "grand-teton-h100"})  # = the catalog node hardware_specs/nodes/grand-teton-h100.yaml
DEFAULT_SEQ = 8192
INTERLEAVED_STAGES_PER_RANK = 2
MI300X_GROUP = "torchtitan|mi300x|bf16+fp8"
ATTENTION_GROUPS = (MI300X_GROUP,)


def _hardware(gpu: str) -> tuple[str | dict, str]:
    """(node, accelerator group label) of the CSV's gpu cell; None when not simulated."""
    if gpu.startswith("H100"):
        return GRAND_TETON, "h100-96g-500w"
    if gpu.startswith("H200"):
        return "hgx-h200", "h200-sxm-141g"
    if gpu.startswith("MI300X"):
        return "mi300x-8", "mi300x"
    if gpu.startswith("A100"):
        return "dgx-a100-80g", "a100-sxm-80g"
    raise KeyError(gpu)


def _recompute(text: str) -> str:
    """The simulator's recompute mode of the CSV's activation-checkpointing cell: "full" = full;
    per-op SAC ("per-op selective", "selective op", "selective (op)") and the unqualified
    "selective" of the Llama 3 8B rows (llama3_8b.toml sets ``selective_ac_option = "op"``) =
    ``selective_op``; "selective layer" (every second block fully recomputed) = selective (an
    approximation on the fast side: the simulator has no per-layer recompute mix)."""
    text = str(text).lower()
    if text.startswith("full"):
        return "full"
    if "layer" in text:
        return "selective"
    return "selective_op"


def cases() -> tuple[list[ModernCase], list[Unrepresentable]]:
    df = read(CSV)
    out: list[ModernCase] = []
    skipped: list[Unrepresentable] = []
    for index, row in df.iterrows():
        name = str(row["model"])
        label = f"{name} {row['gpu'][:5]} {row['num_gpus']} GPUs {row['parallelism']} {row['precision']}"
        n = cell_int(row["num_gpus"])
        if name not in MODELS:
            skipped.append(Unrepresentable("torchtitan", int(index), label,
                                           "'Llama3-architecture' model of the float8/FSDP2 blog: GPU count "
                                           "(128 or 256) or batch and checkpointing not given per row"))
            continue
        if n is None or str(row["num_gpus"]).strip() != str(n):
            skipped.append(Unrepresentable("torchtitan", int(index), label, "GPU count not given per row"))
            continue
        tp = cell_int(row["tp"]) or 1
        pp = cell_int(row["pp"]) or 1
        cp = cell_int(row["cp"]) or 1
        dp = n // (tp * pp * cp)
        local = cell_int(row["local_batch_size"])
        if local is None:
            skipped.append(Unrepresentable("torchtitan", int(index), label, "local batch size not given"))
            continue
        seq = cell_int(row["seq_len"]) or DEFAULT_SEQ
        node, accelerator = _hardware(str(row["gpu"]))
        float8 = "float8" in str(row["precision"])
        recipe = str(row["float8_recipe"]).lower()
        rowwise = float8 and "rowwise" in recipe
        precision = "fp8" if float8 else "bf16"
        interleaved = "interleaved" in str(row["pp_schedule"]).lower()
        async_tp = str(row["async_tp"]).lower() == "yes"
        # "yes (llama3_405b.toml at this commit)" is compiled too; the split key keeps the exact-"yes" test it
        # was drawn with (rows 39-41 read as not compiled there), so the fit / held-out halves do not move
        compiled = str(row["torch_compile"]).lower().startswith("yes")
        key_compiled = str(row["torch_compile"]).lower() == "yes"
        # "not stated" (the A100 rows of docs/performance.md, Apr-Dec 2024): torchtitan's default then,
        # training.compile = false: eager
        eager = not compiled
        parallelism = {
            "tp": tp, "pp": pp, "cp": cp, "dp": dp, "zero_stage": 3,
            "virtual_stages": INTERLEAVED_STAGES_PER_RANK if interleaved else 1,
            "schedule": "interleaved" if interleaved else "1f1b",
            "sequence_parallel": tp > 1, "tp_comm_overlap": async_tp and tp > 1, "tp_overlap": "async_tp",
            "cp_comm": "all_gather", "recompute": _recompute(row["activation_checkpointing"]),
            "overlap_tp_grad_comm": False,
            "micro_batch_size": 1 if pp > 1 else local, "global_batch_size": local * dp,
            "overlap_grad_reduce": True, "overlap_param_gather": True}
        training = {"seq_length": seq, "precision": precision, "attention": "flash",
                    "elementwise_kernels": "eager" if eager else "fused",
                    "fp8_saved_inputs": False,  # torchao Float8Linear keeps the bf16 input for its backward
                    "param_dtype": "fp32"}  # fully_shard keeps the fp32 shard only (module docstring)
        gpu = next(g for g in GPUS if str(row["gpu"]).startswith(g))
        training = with_run_kernel(training, run_kernel("torchtitan", "torchtitan", gpu))
        if rowwise:  # torchao's rowwise recipe: per-row scales from this step's amax (the tensorwise rows keep
            training["fp8_recipe"] = "rowwise"  # the default recipe their group was fitted with)
        group_precision = "fp8-rowwise" if rowwise else precision
        group = MI300X_GROUP if accelerator == "mi300x" else f"torchtitan|{accelerator}|{group_precision}"
        key = (f"torchtitan|{name}|{row['gpu']}|{n}|tp{tp}|pp{pp}|cp{cp}|{row['pp_schedule']}|s{seq}|b{local}|"
               f"{row['precision']}|{recipe}|{key_compiled}|{row['activation_checkpointing']}|{async_tp}")
        out.append(ModernCase("torchtitan", int(index), f"{label} tp{tp} pp{pp} cp{cp} s{seq}"
                              f"{' rowwise' if rowwise else ''}{' eager' if eager else ''}", key,
                              scenario(f"torchtitan-{index}", MODELS[name], node, n, parallelism, training),
                              precision, accelerator, group,
                              float(row["tokens_per_s_per_gpu"])))
    return out, skipped
