"""MosaicML llm-foundry MPT throughput (``llmfoundry_throughput.csv``) as cases.

Each row gives the MPT size, GPUs (8-512), sequence length, micro and global batch, FSDP sharding
(FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2), FSDP mixed-precision mode (PURE: gradients reduced
in bf16; DEFAULT: in fp32), activation checkpointing (= full recompute of each block), precision
(amp_bf16 / bf16 / amp_fp8 with Transformer Engine) and the measured tokens/s per GPU.

Settings the README does not print are llm-foundry's benchmark configs: FlashAttention, PyTorch
FSDP with forward/backward prefetch (parameter all-gathers and gradient reduce-scatters overlapped),
pure data parallelism (no TP/PP). Hardware: A100 rows on DGX A100 40GB/80GB nodes (the README's
8 x 200 Gb/s RoCE, taken as the catalog's 8 x 200 Gb/s fabric); H100 rows on DGX H100 (the README
does not state the network).

The attention kernel: ``fa2`` on H100, ``auto`` (the GEMM-curve estimate) on A100
(validation/data/modern/attention_kernel_by_run.csv: the README states no ``attn_impl``),
with the profile's attention factor on top. MPT's configs ran llm-foundry's Triton FlashAttention
(``attn_impl: triton``, llm-foundry 0.3.0's default, read in its wheel's configuration_mpt.py; without ALiBi,
whose default is off and which would drop the learned positions these rows' parameter counts carry), and the
A100 specs hold the FlashAttention-2 paper's Triton kernel
(``attention_kernel: triton``, Dao 2023 Figs 4-6), but that kernel describes these rows worse: with it
on the A100 rows and the profile refitted (attention factor 0.85 on both A100s), the held-out
A100 80 GB median |error| goes 4.3% -> 6.6% (A100 40 GB 2.6% -> 2.4%, the set 3.7% -> 3.8%, max
37.1% either way). Its rate saturates by 2K tokens, where these rows keep gaining to 64K (1B-13B at
32K-64K: -3..-6% -> -10..-13%), and its head-size-64 rows run faster than its 128 ones (MPT-125M/350M
+10-13%). MPT-30B's 64 heads of 112 run the 128 kernel, zero-padded (FlashAttention-2, FlashAttention-3 and
the Triton kernel alike: hardware_specs.schema.KERNEL_HEAD_DIMS), so its attention costs 128/112 of its counted
FLOPs (the catalog had 56 heads of 128 until the seventh session). The worst row, MPT-30B at 8K on A100 80 GB
(+35.3% with FSDP1's own copy kernels and the profile refitted; +32.2% with FSDP2's, +32.5% before the ZeRO-3
root gather and FSDP2's full copy kernels, +37.1% before the padding), is priced with 84 TFLOP/s of causal attention on the padded FLOPs (73 on
the counted ones), the Triton kernel's own benchmark rate at 8K (83 TFLOP/s at head size 128), and its H100
twin (fit half) is +17.9% (+18.0% before the fp32 shard, +16.0% with FSDP2's copies). Neither is an attention-rate
gap: fitted on the same model's 512-4K rows, one factor on fused attention and one on the other kernels predict the
8K rows 25% (A100 80 GB) and 20% (H100) fast
(30% and 28% with FSDP2's copy kernels priced),
where the same fit on MPT-13B's 1K-8K rows predicts its 16K rows within 0.6% on both GPUs
(``python -m validation.modern.row_breakdown --case-set llmfoundry --trend 83,82,81,80 --predict 79``).

**What the released packages say** (looked for in the eighth session, issue 23). The benchmark's own configs
(``scripts/train/benchmarking/submit_benchmarks.py``, its yaml template, ``scripts/train/yamls/pretrain/mpt-30b.yaml``)
are in no release on PyPI: the llm-foundry sdists 0.2.0, 0.3.0, 0.4.0, 0.5.0, 0.10.0, 0.22.0 and the wheels
0.2.0-0.4.0 hold ``llmfoundry/`` and tests only, so what the 8K rows ran beyond the table's columns is not known.
What the 2023 releases do fix: ``attn_impl: flash`` is FlashAttention-1 (the ``gpu`` extra pins flash-attn
v1.0.3.post0 in 0.2.0 of 2023-07-04 and 1.0.9 in 0.3.0 of 2023-09-27 and 0.4.0 of 2023-11-22; ``flash_attn_fn``
calls FA1's unpadded interface after ``bert_padding.unpad_input``), FlashAttention-2 only from 0.4.0 (``gpu-flash2``
extra, flash-attn 2.3.2; ``is_flash_v2_installed``); ``fc_type: te``, which the amp_fp8 rows need, asks for
flash-attn 1.0.6 beside Transformer Engine commit 144e488 (configuration_mpt.py, 0.3.0 and 0.4.0); ``attn_impl:
triton`` is HazyResearch's flash_attn_triton.py at eff9fe6 on ``triton_pre_mlir`` (head size padded to the next
power of two, backward autotuned with and without sequence parallelism), "tested on A100" only. So the H100 rows'
``fa2`` holds only if the table was measured with 0.4.0 or later and FlashAttention-2 installed, which the README
does not say; it is kept, marked assumed (no FlashAttention-1 H100 fit is in the specs). None of this explains
the 8K cliff: the published kernel rates at head size 128 do not fall from 4K to 8K (causal forward+backward,
FlashAttention-2 paper Figs 4-7: A100 FlashAttention-1 87 -> 91, Triton 80 -> 83, H100 FlashAttention-1 104 -> 135
TFLOP/s), and the trend fit above already absorbs any rate that is constant in sequence length. The
measurements localise it (``python -m validation.modern.row_breakdown --case-set llmfoundry --marginal 82,81,80,79``):
the time per token each longer sequence adds, against the attention FLOPs per token it adds, is one rate for
every head-128 MPT at every doubling from 4K to 64K (87-119 TFLOP/s counted on A100, close to the Triton
kernel's 94-98 for the same passes and far below FlashAttention-2's 162-166, which supports ``attn_impl:
triton`` on A100; 160-186 on H100), and MPT-30B's is that rate from 1K to 2K (92 on A100, 161 on H100, as its
padded heads predict) but falls to 46 and 25 (A100), 114 and 76 (H100) at 2K -> 4K and 4K -> 8K: about 3.1 s
(A100) and 0.7 s (H100) per 8K micro-batch beyond any attention rate its own shorter rows show. The drop is
already there at 2K -> 4K (where the micro-batch also goes from 3 to 1 sequences), and the 4K row's simulated
peak (62.1 GiB; 68.8 with a bf16 shard counted) is below the 2K rows' (64.1; 70.8), so running near full
memory alone does not fit it; what MPT-30b alone of these models has is its head size of 112.

**FSDP1, and what Composer sets** (issue 23, twelfth session; the mosaicml wheels 0.15.1, 0.16.3, 0.16.4 and
0.17.0 read; llm-foundry 0.3.0 and 0.4.0 pin ``mosaicml<0.17,>=0.16.3``). Composer wraps the model in PyTorch FSDP1
(FlatParameter), so the rows run ``zero_buffer_copies: fsdp1`` (simulator/strategies/spmd/layout.py): the
shard's low-precision cast before each gather, no copy-out (the layer's parameters are views of the gathered
flat parameter), and per reduce-scatter the views' gradients concatenated into the flat gradient (split's
backward), its cast to the reduce dtype where that differs and the predivide (torch fsdp/_flat_param.py,
_runtime_utils.py ``_reduce_grad``). Held-out median / max |error| (``python -m validation.modern
--case-set llmfoundry``), FSDP2's copies -> FSDP1's with the profile refitted on its fit half (only the H100
GEMM factors move, 0.9315 -> 0.906 BF16, 0.9666 -> 0.9315 FP8): A100 40 GB 2.9 / 12.9% -> 4.0 / 15.7%, A100 80 GB
4.2 / 32.2% -> 4.1 / 35.3%, H100 4.4 / 17.0% -> 4.0 / 16.0%, the set 3.6 / 32.2% -> 4.1 / 35.3% (no copy kernels
at all, ``false``, before a refit: 4.6 / 35.5%). The rows that move most are the small micro-batches of large models, whose gathers repeat per
micro-batch (MPT-13b s2048 mbs 2 without checkpointing: A100 80 GB row 88 +9.5 -> +17.0%, H100 row 31 +7.6 ->
+16.0%; MPT-70b 32 A100 mbs 2 row 78 +10.5 -> +15.4%): a cost per FSDP unit and micro-batch that FSDP2's copy-out
stood in for is not priced. Composer gives an FSDP model no ``no_sync`` (trainer.py ``_train_microbatch``: the
sync context is a nullcontext unless the model is DistributedDataParallel), so every micro-batch gathers and
reduce-scatters, as simulated (SHARD_GRAD_OP frees its parameters after each backward then, but all six
SHARD_GRAD_OP rows run one micro-batch per step). ``set_fsdp_default`` (dist_strategy.py): BACKWARD_POST
(simulated), ``forward_prefetch`` off, ``limit_all_gathers`` off (PyTorch's rate limiter, which its docstring
says to turn off only "for specific CPU-bound workloads with low memory pressure"), reentrant activation
checkpointing, ``use_orig_params``. ``get_mixed_precision``: DEFAULT sets param and buffer dtype to the
precision and, up to 0.16.3, no ``reduce_dtype``, which FSDP1 then takes from ``param_dtype`` (bf16
reductions, as PURE); ``reduce_dtype: float32`` only from 0.16.4. The rows keep DEFAULT -> fp32 reductions;
which Composer ran them the table does not say.

**Parameter dtype** (issue 23, twelfth session). MPT is built in fp32 (llm-foundry 0.4.0 modeling_mpt.py: no
dtype on any module, nothing casts the model), and Composer's FSDP mixed precision (mosaicml 0.16.3
mosaic_fsdp_utils.py ``get_mixed_precision``: DEFAULT and PURE set ``MixedPrecision(param_dtype=bf16)``) makes
FSDP1 keep the fp32 FlatParameter shard as the only persistent parameter and cast it to the bf16 ``_mp_shard``
per gather, freed after it (torch 2.13 fsdp/_flat_param.py ``pre_unshard`` -> ``_use_low_precision_shard``,
``_free_low_precision_sharded_param``); the reduced gradient shard is cast back to fp32
(_runtime_utils.py ``_cast_grad_to_param_dtype``). So the FULL_SHARD rows run ``training.param_dtype: fp32``
(4 + 8 B of weights and Adam state per parameter over the shard, no 16-bit weight copy beside the fp32 master:
row 79, MPT-30B on 8 A100 80 GB, 72.8 -> 66.1 GiB: weights 7.0 -> 14.0, optimizer state 41.9 -> 28.0, the gathered
layers' buffers 2.1 -> 2.3) and their copy-in casts a 4-byte shard
(spmd/plan.py ``zero3_copy_in_s``). The SHARD_GRAD_OP rows keep the default: the simulator's ZeRO-2 holds the
weights whole, and 2 B whole + 12 B / n (16-bit weights, fp32 master and moments sharded) is what FSDP1's
SHARD_GRAD_OP holds between forward and backward (the gathered bf16 parameters kept, the fp32 shard, the
moments), where ``fp32`` would count 4 B whole. PURE FULL_SHARD rows reduce in bf16 (``grad_dtype: bf16``, the
reduce-scatter's bytes) and hold the sharded gradient in fp32 after that cast, 4 B / n (simulator/memory/analytic.py
``held_gradient_bytes``: MPT-13B on 8 A100 40 GB, rows 142-150, 27.4 -> 30.4 GiB); no row is PURE SHARD_GRAD_OP
(the default ``param_dtype`` would count that gradient at 2 B / n).

**Set aside** (:data:`SET_ASIDE`): MPT-760m on 8 A100 80 GB at s1024 / s512 (rows 119, 120). The same model
at the same sequences on 8 A100 40 GB (rows 192, 193: half the micro-batch, slower HBM) ran 11-16% faster,
and the A100 80 GB table's own s2048 row (118) ran 9-12 MFU points above them, where every other model of that
table keeps its MFU within -2.2..+1.6 points from s2048 to s1024 / s512 (MPT-7b's s1024 row, mbs 64, -6.2).
Both rows are in the held-out half: setting them aside changes no fitted constant.
"""

from __future__ import annotations

from validation.modern.case import ModernCase, Unrepresentable
from validation.modern.mapping import read, scenario
from validation.modern.run_kernels import run_kernel, with_run_kernel

CSV = "llmfoundry_throughput.csv"
#: Rows judged inconsistent with another measurement of the same model, sequence and precision on the same
#: GPU family: simulated and listed with their error, neither fitted on nor counted (validation/modern/case.py
#: ``set_aside``). Keyed by (model, gpu, seq_len, micro_batch_size).
_MPT_760M_A100_80GB_SLOW = (
    "MPT-760m on 8 A100 80 GB at s{seq} mbs{mbs}: {measured:,} tokens/s per GPU (MFU {mfu}%), where the A100 40 GB "
    "table ran the same model and sequence at {twin:,} (row {twin_row}, mbs {twin_mbs}, MFU {twin_mfu}%): the same "
    "compute on the part with faster HBM (2.04 vs 1.56 TB/s) {slower:.0%} slower; this table's own s2048 row 118 "
    "ran 32,434 (MFU 56.85%), and its other models keep their MFU within -2.2..+1.6 points from s2048 to "
    "s1024 / s512 (MPT-7b s1024 -6.2) where this row drops {drop:.1f} points")
SET_ASIDE = {
    ("MPT-760m", "a100_80gb", 1024, 48): {"twin": 33422, "twin_row": 192, "twin_mbs": 24, "twin_mfu": 53.63},
    ("MPT-760m", "a100_80gb", 512, 96): {"twin": 34938, "twin_row": 193, "twin_mbs": 48, "twin_mfu": 53.47},
}
S2048_MFU = 56.85  # row 118: MPT-760m, 8 A100 80 GB, s2048 mbs 24


def set_aside(row) -> str:
    """Why a row is set aside (empty: counted); see :data:`SET_ASIDE`."""
    twin = SET_ASIDE.get((str(row["model"]), str(row["gpu"]), int(row["seq_len"]), int(row["micro_batch_size"])))
    if twin is None:
        return ""
    measured, mfu = int(row["tokens_per_s_per_gpu"]), float(row["mfu_pct"])
    return _MPT_760M_A100_80GB_SLOW.format(seq=int(row["seq_len"]), mbs=int(row["micro_batch_size"]),
                                          measured=measured, mfu=mfu, slower=1 - measured / twin["twin"],
                                          drop=S2048_MFU - mfu, **twin)


NODES = {"h100_80gb": ("dgx-h100", "h100-sxm-80g"), "a100_80gb": ("dgx-a100-80g", "a100-sxm-80g"),
         "a100_40gb": ("dgx-a100-40g", "a100-sxm-40g")}


def cases() -> tuple[list[ModernCase], list[Unrepresentable]]:
    df = read(CSV)
    out: list[ModernCase] = []
    skipped: list[Unrepresentable] = []
    for index, row in df.iterrows():
        model = str(row["model"]).lower()
        n, seq = int(row["num_gpus"]), int(row["seq_len"])
        mbs, gbs = int(row["micro_batch_size"]), int(row["global_batch_size_seqs"])
        label = f"{row['model']} {row['gpu']} {n} GPUs s{seq} mbs{mbs} gbs{gbs} {row['precision']}"
        if bool(row["activation_cpu_offload"]):
            skipped.append(Unrepresentable("llmfoundry", int(index), label, "activation CPU offload is not simulated"))
            continue
        node, accelerator = NODES[str(row["gpu"])]
        precision = "fp8" if "fp8" in str(row["precision"]) else "bf16"
        zero = 3 if row["sharding_strategy"] == "FULL_SHARD" else 2
        recompute = "full" if bool(row["activation_checkpointing"]) else "none"
        parallelism = {"tp": 1, "pp": 1, "dp": n, "zero_stage": zero, "recompute": recompute,
                       "micro_batch_size": mbs, "global_batch_size": gbs,
                       "overlap_grad_reduce": True, "overlap_param_gather": True,
                       "zero3_backward_prefetch": "post",  # Composer's FSDP default: BACKWARD_POST
                       "zero_buffer_copies": "fsdp1"}  # Composer runs FSDP1 (FlatParameter)
        training = {"seq_length": seq, "precision": precision, "attention": "flash",
                    "grad_dtype": "bf16" if row["mp_mode"] == "PURE" else "fp32",
                    "fused_cross_entropy": True}  # MPT's loss_fn default: fused_crossentropy (flash-attn Triton)
        if zero == 3:  # FSDP1 keeps the fp32 shard only and casts it per gather (see "Parameter dtype" above)
            training["param_dtype"] = "fp32"
        training = with_run_kernel(training, run_kernel("llmfoundry", "llmfoundry", str(row["gpu"])[:4].upper()))
        key = (f"llmfoundry|{model}|{row['gpu']}|{n}|{seq}|{mbs}|{gbs}|{row['precision']}|{row['mp_mode']}|"
               f"{row['sharding_strategy']}|{recompute}")
        out.append(ModernCase("llmfoundry", int(index), label, key,
                              scenario(f"llmfoundry-{index}", model, node, n, parallelism, training),
                              precision, accelerator, f"llmfoundry|{accelerator}|{precision}",
                              float(row["tokens_per_s_per_gpu"]), set_aside=set_aside(row)))
    return out, skipped
