"""The other framework rows (``other_llm_training_throughput.csv``) as cases.

- **NeMo AutoModel** (PyTorch FSDP2 with Transformer Engine kernels) on DGX H100: the dense Llama 3
  70B pre-training row and DeepSeek-V3 (FSDP + EP 64 + PP 4, VP 8) are simulated: FSDP = ZeRO-3
  over the data-parallel ranks, FlashAttention, MoE routing balanced, DeepEP dispatch where the row
  names it. No activation checkpointing is stated: the least recompute (none, selective, full) under
  which the layout fits in 80 GB, as the run did fit (Llama 3 70B: full, 114 GiB without; DeepSeek-V3
  on 1,024 and on 256 GPUs: full; on 1,024, selective needs 79.9 GiB with the routed experts' permuted
  inputs counted, 55.4 without them. AutoModel's grouped experts keep that input too: nemo-automodel 0.7.0
  ``components/moe/experts.py`` GroupedExpertsDeepEP runs torch._grouped_mm on the permuted tokens. The row's
  benchmark recipe is in neither the 0.7.0 wheel nor its sdist, so its checkpointing stays unknown).
  Qwen3 MoE 30B (FSDP 8 x EP 8) too, since models carry `head_dim`: it fits only under full recompute
  (76.8 of 78 GiB usable) and is counted with its time error like any row.
  Its LoRA rows (Llama 3 8B and 70B, Qwen2.5 7B) are the same FSDP2 step with the base frozen and adapters of
  rank 8 on every block linear (``training.finetune``; AutoModel's PEFT recipes, assumed: the rows do not say),
  held out whatever their key's half (made representable after the fit, never fitted on); Qwen2.5-32B's are
  not (no config of it is carried). Its hybrid Mamba (Nemotron V3), Kimi K2 and GPT-OSS models are not
  (GPT-OSS-120B is in the catalog now; its rows here are not mapped yet: the reason says why).
- **IBM fms-fsdp** (PyTorch FSDP1, FlashAttention-2 through SDPA): Llama 2 7B/13B/70B and the
  34B (Code Llama shape) at 2 sequences of 4096 per GPU; FSDP = ZeRO-3 with prefetch and FSDP1's own
  kernels (``zero_buffer_copies: fsdp1``, simulator/strategies/spmd/layout.py: the fp32 shard cast to bf16
  before each gather, no copy-out, the views' gradients concatenated, cast and predivided before each
  reduce-scatter) over fp32 parameters (``param_dtype: fp32``). fms-fsdp's trainer is not on PyPI; the same
  team's ibm-fms (1.13.1, fms/models/__init__.py ``_fsdp_wrap``, what ``get_model(distributed_strategy=
  "fsdp")`` runs) wraps its models in FSDP1 ``FullyShardedDataParallel`` (FULL_SHARD, ``limit_all_gathers``)
  with ``MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16)`` over parameters created in
  fp32, and the CSV's rows say FSDP1 (the gradient reduction dtype stays the default fp32 here: the
  trainer's own policy is not in any source read); AC "No" =
  none, "Selective"/"selective" = selective, "Yes" = full. A100 cluster: DGX A100 80GB with 400 Gb/s
  per node (2 NICs); the 96-H100 cluster 800 Gb/s per node (2 NICs); the 464-H100 cluster 3.2 Tb/s
  (8 NICs, the catalog DGX H100). MFU-only rows are converted with the model FLOPs per token and
  the dense peak (the post's nanoGPT/PaLM MFU). torch.compile rows are their own fitted group.
  fms-fsdp's "selective" AC checkpoints a share p of the blocks whole (``selective_checkpointing``,
  policies/ac_handler.py), not Megatron's attention core: simulated as no recompute where that fits
  (7B, 13B) and as every block recomputed where it does not (34B, 70B: 93.7 / 179.3 GiB of
  activations without), since the runs fit; the split key keeps the published word.
- **DeepSpeed + HF transformers** on one 8 x H200 node: the ZeRO-2 row (1 sequence of 8192 per GPU, no
  recompute, one micro-batch per step: the batch is not stated), FlashAttention-3 as its source's step
  decomposition names (flash-attn-3 3.0.0; attention_kernels.csv row 421). Its TFLOP/s count the causal half
  of the attention core (the source's convention, stated on the same source's rows 16-21 and row 421), so
  the conversion to tokens/s takes the other half off the simulated count (:func:`causal_half_of_attention_core`). The ZeRO-3 rows offload the AdamW
  step to the CPU, which is not simulated.
- **FlashAttention-2 paper** (Table 1): GPT3-1.3B/2.7B-style models on 8 x A100 80GB, materialised
  attention ("baseline") or FlashAttention-2; the FlashAttention-1 rows are not simulated (one fused
  kernel model). The batch is not stated: the largest micro-batch of at most 16,384 tokens per GPU
  that fits the GPU without activation checkpointing (none is stated; FlashAttention: 16,384 tokens;
  the 2K baselines: 4 and 2 sequences of the 1.3B and 2.7B models), data parallel with ZeRO-1, one
  micro-batch per step (assumed). The 8K baseline rows are not representable: one sequence's
  materialised scores of every layer need 144 / 242 GiB (1.3B / 2.7B) of the 80 GB, so the paper's
  run used a batch and checkpointing it does not state. The paper's TFLOP/s use its own count,
  6·s·params + 12·L·h·s² per sequence, which converts them to tokens/s here.
"""

from __future__ import annotations

from validation.modern.case import ModernCase, Unrepresentable
from validation.modern.mapping import analytic_peak_fits, cell_float, cell_int, node_variant, read, scenario
from validation.modern.run_kernels import run_kernel, with_run_kernel
from workloads.catalog import resolve_model
from workloads.counting import total_params

CSV = "other_llm_training_throughput.csv"
LLAMA2 = {"7B": "llama2-7b", "13B": "llama2-13b", "34B": "codellama-34b", "70B": "llama2-70b"}
FA2_MODELS = {"GPT3-1.3B-style": "fa2-gpt3-1.3b", "GPT3-2.7B-style": "fa2-gpt3-2.7b"}
FA2_TOKENS_PER_GPU = 16384
PEAK_BF16 = {"a100-sxm-80g": 312.0, "h100-sxm-80g": 989.0}


def _skip(index: int, label: str, reason: str) -> Unrepresentable:
    return Unrepresentable("other", index, label, reason)


def _fms_node(system: str) -> tuple[str | dict, str]:
    if "A100" in system:
        return node_variant("dgx-a100-80g", node_overrides={"nics_per_node": 2}), "a100-sxm-80g"
    if "800 Gbps" in system:
        return node_variant("dgx-h100", node_overrides={"nics_per_node": 2}), "h100-sxm-80g"
    return "dgx-h100", "h100-sxm-80g"


def _fms(index: int, row, label: str) -> ModernCase | Unrepresentable:
    size = str(row["model"]).split()[-1]
    model = LLAMA2[size]
    node, accelerator = _fms_node(str(row["system"]))
    n, local = int(row["num_gpus"]), int(row["local_batch_size"])
    ac = str(row["activation_checkpointing"]).lower()
    published = {"no": "none", "selective": "selective", "yes": "full"}[ac]  # the split key keeps the row's own word
    compiled = "torch.compile" in str(row["framework"])
    training = with_run_kernel({"seq_length": 4096, "precision": "bf16", "attention": "flash", "param_dtype": "fp32"},
                               run_kernel("other", "fms-fsdp", "A100" if "a100" in accelerator else "H100"))

    def build(recompute: str, node=node) -> dict:
        parallelism = {"tp": 1, "pp": 1, "dp": n, "zero_stage": 3, "recompute": recompute, "micro_batch_size": local,
                       "global_batch_size": local * n, "overlap_grad_reduce": True, "overlap_param_gather": True,
                       "zero_buffer_copies": "fsdp1"}  # FSDP1's FlatParameter kernels (module docstring)
        return scenario(f"other-{index}", model, node, n, parallelism, training)

    # fms-fsdp's "selective" AC checkpoints a share p of the blocks whole (fms-fsdp policies/ac_handler.py
    # apply_fsdp_checkpointing: p = 1/2 wraps every other block); the simulator recomputes all blocks or none:
    # none where that fits the GPU (p = 0), else every block (p = 1), since the run did fit
    recompute = published
    if published == "selective":
        catalog_node = "dgx-a100-80g" if "a100" in accelerator else "dgx-h100"  # memory: the GPU alone matters
        recompute = "none" if analytic_peak_fits(build("none", catalog_node))[0] else "full"
    tokens = cell_float(row["tokens_per_s_per_gpu"])
    mfu = cell_float(row["mfu_pct"])
    flavour = "fms-fsdp-compile" if compiled else "fms-fsdp"
    key = f"other|{flavour}|{model}|{row['system']}|{n}|{local}|{published}"
    shown = recompute if recompute == published else f"{published} (simulated {recompute})"
    return ModernCase("other", index, f"{label} {shown}{' compile' if compiled else ''}", key,
                      build(recompute), "bf16", accelerator,
                      f"{flavour}|{accelerator}|bf16", tokens,
                      None if tokens is not None else mfu / 100 * PEAK_BF16[accelerator])


def _fa2(index: int, row, label: str) -> ModernCase | Unrepresentable:
    framework = str(row["framework"])
    if "(v1)" in framework:
        return _skip(index, label, "FlashAttention-1: the simulator has one fused attention kernel model")
    flash = "FlashAttention-2" in framework.split("attention = ")[-1]
    model = FA2_MODELS[str(row["model"])]
    seq = int(row["seq_len"])
    spec = resolve_model(model).model_copy(update={"seq_length": seq})
    flops_per_token = 6 * total_params(spec) + 12 * spec.num_layers * spec.hidden_size * seq
    tokens = float(row["model_tflops_per_gpu"]) * 1e12 / flops_per_token
    training = with_run_kernel({"seq_length": seq, "precision": "bf16", "attention": "flash" if flash else "standard"},
                               run_kernel("other", "fa2-paper", "A100"))

    def build(mbs: int) -> dict:
        parallelism = {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1, "micro_batch_size": mbs,
                       "global_batch_size": 8 * mbs}
        return scenario(f"other-{index}", model, "dgx-a100-80g", 8, parallelism, training)

    mbs, needs_gib = _largest_fitting_micro_batch(build, FA2_TOKENS_PER_GPU // seq)
    if mbs is None:
        return _skip(index, label, f"materialised softmax at {seq} tokens: one sequence per GPU needs "
                                   f"{needs_gib:.0f} GiB (the s x s scores, softmax and dropout mask of every "
                                   f"layer) of the A100's 80 GB; the paper ran it with a batch and an activation "
                                   f"checkpointing it does not state")
    key = f"other|fa2-paper|{model}|{seq}|{flash}"
    return ModernCase("other", index, f"{label} {'flash' if flash else 'standard'} mbs{mbs}", key, build(mbs),
                      "bf16", "a100-sxm-80g", "fa2-paper|a100-sxm-80g|bf16", tokens)


def _largest_fitting_micro_batch(build, most: int) -> tuple[int | None, float]:
    """The batch is not published: the largest micro-batch (a power of two, at most ``most``
    sequences, the 16,384 tokens per GPU a FlashAttention run holds) whose analytic peak fits the
    GPU, as a run without activation checkpointing would have to choose; (None, GiB that one
    sequence needs) when not even one fits."""
    mbs, needs = most, 0.0
    while mbs >= 1:
        ok, needs = analytic_peak_fits(build(mbs))
        if ok:
            return mbs, needs
        mbs //= 2
    return None, needs


def _least_recompute_that_fits(build) -> str:
    """No activation checkpointing is stated: the least recompute (none, selective, full) under which
    the layout fits the GPU, since the run did fit; full when none does (the row is then reported as a
    predicted OOM)."""
    for policy in ("none", "selective"):
        if analytic_peak_fits(build(policy))[0]:
            return policy
    return "full"


#: NeMo AutoModel's LoRA (``training.finetune``): its PEFT recipes' settings, which the rows do not print (assumed):
#: ``peft: match_all_linear: True, dim: 8, alpha: 32, use_triton: True`` (the rows' "kernels: TE + triton"), i.e.
#: an adapter of rank 8 on every linear layer of a block (the LM head has none).
AUTOMODEL_LORA = {"method": "lora", "rank": 8, "alpha": 32,
                  "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]}
AUTOMODEL_LORA_MODELS = {"Llama3 8B": "llama3-8b", "Llama3 70B": "llama3-70b", "Llama3 70B 2-node": "llama3-70b",
                         "Qwen2.5 7B": "qwen2.5-7b"}
ADDED_AFTER_FIT = ("a LoRA row, made representable (training.finetune) after this set's profiles were fitted: held "
                   "out whatever its key's half, never fitted on")


def _automodel_lora(index: int, row, label: str) -> ModernCase | Unrepresentable:
    """A LoRA fine-tuning row of NeMo AutoModel: the pre-training rows' FSDP2 mapping (:func:`_automodel`) with the
    base frozen and :data:`AUTOMODEL_LORA`'s adapters (workloads/lora.py)."""
    model = str(row["model"])
    name = AUTOMODEL_LORA_MODELS.get(model)
    if name is None:
        return _skip(index, label, f"LoRA on {model}: the model is not in the catalog (no config of Qwen2.5-32B is "
                                   "carried; Qwen2.5-7B's shape is tests/data/hf/qwen2-7b.json's)")
    n = int(row["num_gpus"])
    tp = cell_int(row["tp"]) or 1
    mbs, gbs, seq = int(row["mbs"]), int(row["gbs"]), int(row["seq_len"])
    training = with_run_kernel({"seq_length": seq, "precision": "bf16", "attention": "flash", "param_dtype": "fp32",
                                "finetune": AUTOMODEL_LORA}, run_kernel("other", "automodel", "H100"))

    def build(recompute: str) -> dict:
        parallelism = {"tp": tp, "pp": 1, "dp": "auto", "zero_stage": 3, "micro_batch_size": mbs,
                       "global_batch_size": gbs, "recompute": recompute, "overlap_grad_reduce": True,
                       "overlap_param_gather": True}
        return scenario(f"other-{index}", name, "dgx-h100", n, parallelism, training)

    recompute = _least_recompute_that_fits(build)
    key = f"other|automodel|lora|{name}|{n}|tp{tp}|{mbs}|{gbs}|{seq}"
    return ModernCase("other", index, f"{label} tp{tp} LoRA r{AUTOMODEL_LORA['rank']} {recompute}", key,
                      build(recompute), "bf16", "h100-sxm-80g", "automodel|h100-sxm-80g|bf16",
                      float(row["tokens_per_s_per_gpu"]), added_after_fit=ADDED_AFTER_FIT,
                      assumed=f"LoRA rank {AUTOMODEL_LORA['rank']} on every block linear (AutoModel's PEFT recipes; "
                              "the row does not say)")


def _automodel(index: int, row, label: str) -> ModernCase | Unrepresentable:
    model = str(row["model"])
    if "LoRA" in str(row["parallelism"]):
        return _automodel_lora(index, row, label)
    if model == "Llama3 70B":
        name = "llama3-70b"
    elif model == "DeepSeek V3 671B":
        name = "deepseek-v3"
    elif model == "Qwen3 MoE 30B":
        name = "qwen3-30b-a3b"
    else:
        reasons = {"Nemotron": "hybrid Mamba-2 / attention / MoE model: state-space layers are not simulated",
                   "Kimi": "Kimi K2 (384 experts, DeepSeek-V3 shape) is not in the catalog",
                   "GPT-OSS": "not mapped yet: GPT-OSS-120B is in the catalog (sliding window and sinks, "
                              "workloads/models/gpt-oss-120b.yaml) but a row added here moves this set's split and "
                              "fit, left to a change that refits it; GPT-OSS-20B is not in the catalog"}
        return _skip(index, label, next(v for k, v in reasons.items() if model.startswith(k)))
    n = int(row["num_gpus"])
    tp, pp, cp = (cell_int(row[c]) or 1 for c in ("tp", "pp", "cp"))
    ep = cell_int(row["ep"]) or 1
    vp = cell_int(row["vp"]) or 1
    mbs, gbs, seq = int(row["mbs"]), int(row["gbs"]), int(row["seq_len"])
    training = with_run_kernel({"seq_length": seq, "precision": "bf16", "attention": "flash", "param_dtype": "fp32"},
                               run_kernel("other", "automodel", "H100"))

    def build(recompute: str) -> dict:
        parallelism = {"tp": tp, "pp": pp, "cp": cp, "dp": "auto", "ep": ep, "zero_stage": 3,
                       "virtual_stages": vp, "schedule": "interleaved" if vp > 1 else "1f1b",
                       "micro_batch_size": mbs, "global_batch_size": gbs, "recompute": recompute,
                       "overlap_grad_reduce": True, "overlap_param_gather": True}
        if ep > 1:
            parallelism["moe_load_imbalance"] = 1.0
        if "DeepEP" in str(row["software"]):  # "kernels: TE + DeepEP": tokens cross each node once
            parallelism["moe_dispatch"] = "deepep"
        return scenario(f"other-{index}", name, "dgx-h100", n, parallelism, training)

    recompute = _least_recompute_that_fits(build)
    key = f"other|automodel|{name}|{n}|tp{tp}|pp{pp}|cp{cp}|ep{ep}|vp{vp}|{mbs}|{gbs}|{seq}"
    return ModernCase("other", index, f"{label} pp{pp} cp{cp} ep{ep} vp{vp} {recompute}", key, build(recompute),
                      "bf16", "h100-sxm-80g", "automodel|h100-sxm-80g|bf16", float(row["tokens_per_s_per_gpu"]))


def _deepspeed(index: int, row, label: str) -> ModernCase | Unrepresentable:
    if "offload" in str(row["parallelism"]).lower() and "no offload" not in str(row["parallelism"]).lower():
        return _skip(index, label, "ZeRO-3 with the AdamW step offloaded to the CPU: CPU offload is not simulated")
    seq = int(row["seq_len"])
    parallelism = {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 2, "micro_batch_size": 1, "global_batch_size": 8}
    training = with_run_kernel({"seq_length": seq, "precision": "bf16", "attention": "flash"},
                               run_kernel("other", "deepspeed-hf", "H200"))
    key = f"other|deepspeed-zero2|llama3-8b|{seq}"
    return ModernCase("other", index, f"{label} s{seq}", key,
                      scenario(f"other-{index}", "llama3-8b", "hgx-h200", 8, parallelism, training), "bf16",
                      "h200-sxm-141g", "deepspeed|h200-sxm-141g|bf16", None, float(row["model_tflops_per_gpu"]),
                      uncounted_flops_per_token=causal_half_of_attention_core("llama3-8b", seq))


def causal_half_of_attention_core(model: str, seq: int) -> float:
    """Model FLOPs per token of the attention core's causal half: the simulator counts the whole s x s score
    and context products (forward 2 x 2·s·d per query and head, backward twice that: 12·L·s·heads·d per token),
    ml-engineering's count ("model FLOPs with causal attention counted": forward 4·s²·d·h halved) half of it."""
    spec = resolve_model(model)
    return 6.0 * spec.num_layers * seq * spec.num_attention_heads * spec.head_dim


def cases() -> tuple[list[ModernCase], list[Unrepresentable]]:
    df = read(CSV)
    out: list[ModernCase] = []
    skipped: list[Unrepresentable] = []
    for index, row in df.iterrows():
        framework = str(row["framework"])
        label = f"{framework.split(' (')[0]} {row['model']} {row['gpu']} {row['num_gpus']} GPUs"
        if framework.startswith("NeMo AutoModel"):
            item = _automodel(int(index), row, label)
        elif framework.startswith("IBM fms-fsdp"):
            item = _fms(int(index), row, label)
        elif framework.startswith("FlashAttention-2 paper"):
            item = _fa2(int(index), row, label)
        elif framework.startswith("DeepSpeed"):
            item = _deepspeed(int(index), row, label)
        else:
            item = _skip(int(index), label, "framework not mapped")
        (out if isinstance(item, ModernCase) else skipped).append(item)
    return out, skipped
