"""NeMo / Megatron-Bridge performance summary on DGX H100 (``nemo_perf_summary.csv``) as cases.

Each row gives the model, GPUs, precision, GBS/MBS, sequence, and TP/PP/CP/VP/EP/FSDP. Settings
the table does not print are NeMo's performance recipes for Megatron-Core with Transformer Engine
(:func:`validation.modern.mapping.megatron_layout`): Transformer Engine's cuDNN fused attention
(``attention_kernel: cudnn``, validation/data/modern/attention_kernel_by_run.csv; priced as the H100's
FlashAttention-2 fit: no row measures cuDNN's kernel),
sequence parallel and userbuffers TP overlap with tp > 1, the distributed optimizer (ZeRO-1), or
Megatron FSDP (ZeRO-3) where the FSDP column is above 0 (its parameters and gradients are views of
its communication buffers: no copy kernels; the next layer's gather prefetched), no activation recompute, interleaved 1F1B
with VP > 1, MoE routing force-balanced (the table's footnote), DeepSeek-V3's tokens dispatched with
DeepEP (NeMo's H100 performance recipe for it: the flex dispatcher; once per node over InfiniBand). FP8 in every flavour the table
names (delayed / current scaling, blockwise) is the simulator's FP8 (linear layers in FP8).
SFT and LoRA rows fine-tune on SQuAD packed to the sequence length (the 24.07 rows' notes: "fine-tuning on
SQuAD-v1.1 packed to 4096 tokens"; the 26.06 rows' layouts are megatron-bridge 0.6.2's
``perf_recipes/llama/h100/llama3.py`` ``llama3_70b_sft_32gpu_h100_fp8cs_config`` (tp 4 pp 4 vp 5) and
``llama3_70b_peft_8gpu_h100_fp8cs_config`` (tp 2 pp 4 vp 20), on ``recipes/common.py`` ``_sft_common`` /
``_peft_common``: ``default_squad_config(enable_offline_packing=True)``, packed to ``seq_length``). A packed
batch attends per document (``cu_seqlens``, the ``thd`` layout: NeMo 2.0.0rc1 ``MegatronGPTModel``, Megatron-Bridge
``training/gpt_step.py``), so these rows set ``training.packing`` (workloads/packing.py) with SQuAD's documents
(:data:`SQUAD_DOCUMENT_TOKENS`, assumed); otherwise an SFT row is the pre-training step. LoRA rows are that step
with the base frozen and adapters on it (``training.finetune``, workloads/lora.py) as the release's recipe sets
them (:func:`lora_recipe`); they are held out whatever their key's half (``ModernCase.added_after_fit``: made
representable after the profiles were fitted, never fitted on).
Every MoE row gives ``parallelism.etp: 1`` (Megatron-Bridge's expert tensor parallel 1), so its expert
groups fold over a stage's TP x DP ranks in Megatron-Core's order: Qwen3-235B's EP 32 over TP 2 x DP 16
is one group of a stage's 32 ranks; DeepSeek-V3's EP 64 over TP 2 x DP 64 spans 64 consecutive ranks (8
nodes), not every second rank of 16 nodes. Qwen3 MoE rows use the catalog's Qwen3 (head width 128 unlike
hidden/heads, per-head q/k norms); their "(tokendrop)" rows (capacity factor 1) are the same step as dropless once routing is
force-balanced, as every MoE row here is: no token is dropped or padded.
Dispatchers, read in the performance scripts that produced the 25.09 rows (nemo_toolkit 2.5.0 on PyPI,
``scripts/performance/llm/``): DeepSeek-V3 on H100 ``moe_token_dispatcher_type = "flex"`` with DeepEP
(``pretrain_deepseek_v3.py``: "For H100 we use deepEP"); Qwen3-30B-A3B and Qwen3-235B-A22B Megatron-Core's
``alltoall`` (the ``Qwen3MoEConfig`` default; no DeepEP callback), with ``MegatronTokenDropCallback`` (capacity
factor 1, padded: the same step once balanced) and no recompute (the scripts reset the recipes' full recompute).
The 25.11 and later rows (force-balanced and dropless: not those NeMo 2 scripts, which drop tokens) ran
Megatron-Bridge's performance scripts, which this project does not carry; Qwen3 MoE rows there are mapped to the flex
dispatcher with DeepEP (``moe_dispatch: deepep``, :data:`BRIDGE_DEEPEP_FROM`), on two grounds: (1) megatron-bridge
0.3.1's library recipe for both Qwen3 MoE models (PyPI, 2026-03; ``recipes/qwen/qwen3_moe.py``:
``moe_flex_dispatcher_backend = "deepep"``, applied as the flex dispatcher on Hopper by
``training/flex_dispatcher_backend.py``; 0.3.0 takes the backend as an argument of the recipe, set by its caller);
(2) a plain all-to-all cannot have run them: on every such cross-node row (all in the fit half) the InfiniBand
share of a plain all-to-all at the NIC's line rate plus the simulated kernels alone exceed the measured step
(Qwen3-30B ep16: 17.6 + 15.5 s against 29.3-29.7 s; Qwen3-235B ep32: 52.6 + 32.8 s against 76.6-81.4 s),
while the dense rows put those kernels within ~10%. ``python -m validation.modern.moe_audit`` prints, per MoE
row, the expert group as built, its link, the dispatcher, that floor and the time per MoE layer pass the
measurement leaves over. That time is about constant, 2.1-3.1 ms per MoE layer and micro-batch (forward and
backward) on every Qwen3 row, 30B and 235B, EP 8 to 32, in one node or four, micro-batch 1 or 2, plain or DeepEP
dispatch: Megatron-Core's MoE layer has a fixed cost beyond its GEMMs, all-to-alls and the memory-bound kernels
the layer graph prices (the router's and dispatcher's bookkeeping kernels, the token-count all-gather, the
host's wait for the counts). The profile fits it as ``moe_layer_fixed_us`` on the fit half
(validation/modern/registry.py ``NEMO_GRID``); DeepSeek-V3's rows (25.09, held out) are simulated with it too.
GPT-OSS-120B's BF16 rows (25.11 and later, the table's only BF16 rows) use the catalog's ``gpt-oss-120b``
(alternating 128-token sliding-window and full layers, attention sinks: workloads/models/gpt-oss-120b.yaml)
and DeepEP as the Qwen3 rows do: megatron-bridge 0.3.1's library recipe ``recipes/gpt_oss/gpt_oss.py`` sets
``moe_flex_dispatcher_backend = "deepep"``. Their profile group (``nemo|h100-sxm-80g|bf16``) has no fit row
(the BF16 rows' keys fall where md5 puts them; a group under ``MIN_FIT_CASES`` fit rows keeps the catalog
constants, as any group does), so they are judged with the catalog constants: nothing is fitted on them.
The recipe that produced rows 41-57 is megatron-bridge 0.6.2's (PyPI) ``perf_recipes/gpt_oss/h100/gpt_oss.py``
``gpt_oss_120b_pretrain_64gpu_h100_bf16_config`` ("64x H100, BF16, PP=4 EP=8, GBS=1280": tp 1, no sequence
parallelism, force-balanced routing, router fusion) on the library recipe (``recipes/gpt_oss/h100``: 9 layers a
stage, the embedding and loss not counted in the split, as simulated; DeepEP). The model's experts run
Megatron-Core's clamped quick-GELU GLU and biases (``models/gpt_oss/gpt_oss_bridge.py``: clamp 7.0, offset 1.0,
``add_bias_linear``, ``bias_activation_fusion``), whose extra kernels the layer graph prices (workloads/graph.py
``_expert_bias_and_clamp``). The recipe's selective recompute of ``["layernorm", "moe_act"]`` (Megatron-Core
``recompute_modules``: ``parallelism.recompute_modules``, :data:`GPT_OSS_RECOMPUTE_MODULES`) re-runs each MoE
block's pre-MLP norm and its experts' clamps and GLU before the backward and drops their outputs from memory
(workloads/transformer_graph.py ``_module_drops``). Row 63 (25.11: mbs 4, gbs 512) is not that recipe's layout
and no source for its own recipe is carried: it takes the same modules, said in its ``assumed``.
Recipes of the other rows (megatron-bridge 0.6.2 ``perf_recipes/*/h100/``): Qwen3-30B-A3B and Qwen3-235B-A22B
set no recompute (``qwen/h100/qwen3_moe.py``; only its BF16 ``_hybridep_dev`` config, a layout no row has, sets
``["moe_act", "layernorm"]``); DeepSeek-V3's 1,024-GPU configs set ``["mla_up_proj", "mlp"]``
(``deepseek/h100/deepseek_v3.py``), but rows 69/70 are 25.09, run by NeMo 2.5.0's
``scripts/performance/llm/pretrain_deepseek_v3.py``, which clears the recipe's recompute unless its recommended-
config CSV (not in the wheel) names modules: unknown, mapped without. Llama 3 (``llama/h100/llama3.py``,
``llama31.py``): no module list; the 70B pretrain/SFT, the 70B LoRA FP8 config (row 38) and 405B set no recompute.
Two configs set Megatron-Core's partial full recompute (``parallelism.recompute_method`` /
``recompute_num_layers``), for layouts no row has: ``llama3_8b_pretrain_8gpu_h100_fp8cs_config`` (block 5: the
first 5 of the 32 layers re-run; tp 1, pp 1, no FSDP, gbs 128) and ``llama3_70b_peft_8gpu_h100_bf16_config``
(block 1, pp 4 vp 20; BF16: row 38 is the FP8 config). Rows 60/66 (Llama 3 8B, FSDP over 8 GPUs) are 25.11/25.09
runs of other scripts: NeMo 2.5.0's ``scripts/performance/llm/pretrain_llama3_8b.py`` takes its
``recompute_layers`` (block) from the recommended-config CSV that is not in the wheel (``helpers.py``
``get_user_configs``, ``set_recompute_configs``; 0 when absent), and 25.11's Megatron-Bridge scripts are not
carried (megatron-bridge 0.2.0rc6 on PyPI has no performance recipes): unknown, mapped without.
Two Qwen3-30B-A3B pp2 ep8 rows (26.02, 25.11) are set aside (:data:`SET_ASIDE`): the same configuration
ran 1.8-2x faster in the neighbouring release, and the faster figures agree with the pp1 ep16 rows. A row whose
gradient-accumulation column disagrees with its batch columns is set aside too (:func:`batch_contradiction`: row 63).
"""

from __future__ import annotations

from validation.modern.case import ModernCase, Unrepresentable
from validation.modern.mapping import cell_float, cell_int, megatron_layout, read, scenario
from validation.modern.run_kernels import run_kernel, with_run_kernel

CSV = "nemo_perf_summary.csv"
NODE = "dgx-h100"
ACCELERATOR = "h100-sxm-80g"
FP8_PEAK_TFLOPS = 1979.0  # H100 SXM dense FP8 (datasheet; hardware_specs/accelerators/h100-sxm-80g.yaml)

MODELS = {
    "GPT3-5B": "gpt3-5b", "GPT3-20B": "gpt3-20b",
    "LLAMA2-7B": "llama2-7b", "LLAMA2-13B": "llama2-13b", "LLAMA2-70B": "llama2-70b",
    "LLAMA3-8B": "llama3-8b", "LLAMA3_8B": "llama3-8b", "LLAMA3-70B": "llama3-70b", "LLAMA3_70B": "llama3-70b",
    "LLAMA3.1_405B": "llama3-405b", "Nemotron-340B": "nemotron4-340b", "DeepSeekV3 (dropless)": "deepseek-v3",
    "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_30B_a3B (tokendrop)": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b", "Qwen3_235B_a22B (tokendrop)": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
}
UNREPRESENTABLE_MODELS = {
    "Nemotron-8B": "architecture not in any source this project carries (NeMo's nemotron 8B config not in "
                   "shared/); not added to the catalog without one",
    "Nemotron-22B": "architecture not in any source this project carries (NeMo's nemotron 22B config not in "
                    "shared/); not added to the catalog without one",
    "Nemotron_3_Nano": "hybrid Mamba-2 / attention / MoE model: state-space layers are not simulated",
}


#: Rows judged inconsistent with another measurement of the same GPU, model and precision: simulated and
#: listed with their error, neither fitted on nor counted (validation/modern/case.py ``set_aside``).
_QWEN3_30B_PP2_SLOW = (
    "Qwen3-30B-A3B tp1 pp2 ep8 at {measured:,} tokens/s in {release}: {twin}; pp1 ep16 on the same two nodes ran "
    "8,826-8,960 (rows 35/42/47) and AutoModel's BF16 EP 8 on one node 12,040 (other set, row 6). This figure implies "
    "{tflops} model TFLOP/s per GPU, {peak:.0%} of the FP8 peak: a slowdown of that release's run, not of the hardware")
SET_ASIDE = {
    ("Qwen3_30B_a3B", "NeMo 26.02 container"):
        "the identical configuration (vp12, gbs 1024, mbs 1) ran 9,058 in 26.02.01, the patch release of 26.02 (row "
        "52): 1.77x apart",
    ("Qwen3_30B_a3B", "NeMo 25.11 container"):
        "the identical layout and batch (vp24, gbs 512, mbs 2) ran 10,494 in 25.09 (row 71; token-drop, the same step "
        "once routing is force-balanced): 1.99x apart",
}


#: Megatron-Core ``recompute_modules`` of megatron-bridge 0.6.2's ``perf_recipes/gpt_oss/h100/gpt_oss.py``
#: ``gpt_oss_120b_pretrain_64gpu_h100_bf16_config`` (with ``recompute_granularity = "selective"``), and the
#: (micro, global) batch that recipe runs.
GPT_OSS_RECOMPUTE_MODULES = ("layernorm", "moe_act")
GPT_OSS_RECIPE_BATCH = (1, 1280)


#: The first release of the table whose rows ran NeMo 2's or Megatron-Bridge's performance scripts, which reduce
#: and keep gradients in bf16 (Megatron-Core ``grad_reduce_in_fp32 = False``: the DDP grad buffer, every
#: parameter's ``main_grad``, is the parameter dtype; megatron-core 0.16.1 ``distributed/distributed_data_parallel.py``
#: ``grad_dtype = torch.float if self.ddp_config.grad_reduce_in_fp32 else param.dtype``):
#: - 25.09 (nemo_toolkit 2.5.0 on PyPI): ``scripts/performance/helpers.py`` ``set_primary_perf_configs`` ->
#:   ``set_perf_optimization_configs`` -> ``set_precision_configs``: ``recipe.trainer.plugins.grad_reduce_in_fp32 =
#:   False`` whatever the compute dtype, for every ``scripts/performance/llm/pretrain_*.py``; the plugin's value
#:   overrides the DDP config (``nemo/lightning/pytorch/strategies/megatron_strategy.py``
#:   ``update_config_with_dtype_overrides(dtype_config, self.ddp_config)``).
#: - 26.xx (megatron-bridge 0.6.2 on PyPI): ``perf_recipes/_common.py`` ``_perf_precision`` ("Identical to
#:   ``scripts/performance/utils/precision.get_precision_config``": ``grad_reduce_in_fp32 = False``) and
#:   ``_benchmark_common`` (``cfg.ddp.grad_reduce_in_fp32 = False``), which every H100 recipe of a row's model
#:   calls (``perf_recipes/{llama,qwen,deepseek,gpt_oss}/h100``; the Llama 3 SFT / PEFT configs set it again).
#: - 25.11: Megatron-Bridge's performance scripts of that release are not carried (megatron-bridge 0.2.0rc6 has
#:   none); the releases on either side set it, so 25.11 is mapped the same way.
#: The same scripts fuse the loss into Transformer Engine's cross entropy (``cross_entropy_fusion_impl = "te"``:
#: nemo_toolkit 2.5.0 ``helpers.py`` ``set_perf_optimization_configs``, megatron-bridge 0.6.2 ``_benchmark_common``;
#: ``cross_entropy_loss_fusion`` defaults to True in both: ``GPTConfig``, ``GPTModelProvider``), which writes the
#: gradient into the 16-bit logits in place and keeps only them (``training.fused_cross_entropy``: 2 B per logit,
#: the last stage's memory only).
#: NeMo 24.07 and 24.03 ran NeMo 1 (NeMo-Framework-Launcher YAML, in no package): ``optim.grad_sync_dtype``
#: defaults to fp32 there (nemo_toolkit 2.0.0rc1 ``megatron_gpt_model.py`` ``setup_mcore_distributed_parallel``),
#: so those rows keep fp32 gradients.
BF16_GRADS_FROM = (25, 9)


#: The first release whose rows ran Megatron-Bridge's performance scripts with force-balanced dropless MoE routing
#: (the table's footnote): its Qwen3 MoE rows dispatch with DeepEP (module docstring).
BRIDGE_DEEPEP_FROM = (25, 11)


def release_number(release: str) -> tuple[int, ...]:
    """(25, 11) for "NeMo 25.11 container", (26, 2, 1) for "NeMo 26.02.01 container", (24, 3, 1) for
    "NeMo24.03.01.framework"."""
    text = str(release).replace("NeMo", "").split("container")[0].replace(".framework", "").strip()
    return tuple(int(part) for part in text.split("."))


#: A row whose gradient-accumulation column disagrees with its own batch columns: GA = GBS / (MBS x DP), DP =
#: GPUs / (TP x PP x CP) (expert parallelism shares the data-parallel ranks). Of the table's 13 rows that give GA,
#: one disagrees (row 63, GPT-OSS 120B in 25.11: GA 2 where GBS 512 / (MBS 4 x DP 16) = 8), so the step the figure
#: measured is not determined: GA 2 at MBS 4 is GBS 128 (fits, 67.2 GiB simulated), GBS 512 at MBS 4 is 8
#: micro-batches (96.0 GiB simulated: OOM on 80 GB; tests/test_nemo_recipe_grads.py).
_BATCH_CONTRADICTS = ("the row's own batch columns disagree: GA {ga} where GBS {gbs} / (MBS {mbs} x DP {dp}) = {calc:g} "
                      "micro-batches, so which step the figure measured is not known; simulated as GBS {gbs}, MBS {mbs}")


def batch_contradiction(row) -> str:
    """The :data:`_BATCH_CONTRADICTS` reason when the row gives GA and it is not GBS / (MBS x DP), else empty."""
    ga = cell_float(row["ga"])
    if ga is None:
        return ""
    gbs, mbs = int(row["gbs"]), int(row["mbs"])
    dp = int(row["num_gpus"]) // (int(row["tp"]) * int(row["pp"]) * (cell_int(row["cp"]) or 1))
    calc = gbs / (mbs * dp)
    if calc == ga:
        return ""
    return _BATCH_CONTRADICTS.format(ga=int(ga), gbs=gbs, mbs=mbs, dp=dp, calc=calc)


def set_aside(row) -> str:
    """Why a row is set aside (empty: counted); see :data:`SET_ASIDE` and :func:`batch_contradiction`."""
    contradiction = batch_contradiction(row)
    if contradiction:
        return contradiction
    twin = SET_ASIDE.get((str(row["model"]), str(row["release"])), "")
    if not twin:
        return ""
    tflops = float(row["model_tflops_per_gpu"])
    return _QWEN3_30B_PP2_SLOW.format(twin=twin, measured=int(row["tokens_per_s_per_gpu"]),
                                      release=str(row["release"]).split(" container")[0], tflops=int(tflops),
                                      peak=tflops / FP8_PEAK_TFLOPS)


def _precision(text: str) -> str:
    return "bf16" if str(text).upper().startswith("BF16") else "fp8"


def _model(name: str) -> str | None:
    if name in MODELS:
        return MODELS[name]
    return None


def cases() -> tuple[list[ModernCase], list[Unrepresentable]]:
    df = read(CSV)
    out: list[ModernCase] = []
    skipped: list[Unrepresentable] = []
    for index, row in df.iterrows():
        name = str(row["model"])
        n = int(row["num_gpus"])
        task = str(row["task"])
        label = f"{name} {task} {n} GPUs {row['release']}"
        base_name = name.split(" (")[0]
        if name in UNREPRESENTABLE_MODELS or base_name in UNREPRESENTABLE_MODELS:
            reason = UNREPRESENTABLE_MODELS.get(name) or UNREPRESENTABLE_MODELS[base_name]
            skipped.append(Unrepresentable("nemo", int(index), label, reason))
            continue
        tp, pp = cell_int(row["tp"]), cell_int(row["pp"])
        if tp is None or pp is None:
            skipped.append(Unrepresentable("nemo", int(index), label,
                                           "parallel layout not given (the best non-CP run of the long-context "
                                           "table)"))
            continue
        model = _model(name)
        if model is None:
            skipped.append(Unrepresentable("nemo", int(index), label, "model not in the catalog"))
            continue
        cp = cell_int(row["cp"]) or 1
        vp = cell_int(row["vp"]) or 1
        ep = cell_int(row["ep"]) or 1
        mbs = cell_int(row["mbs"]) or 1
        fsdp = cell_int(row["fsdp"]) or 0
        gbs, seq = int(row["gbs"]), int(row["seq_len"])
        precision = _precision(row["precision"])
        parallelism = megatron_layout(tp, pp, cp, vp, ep, mbs, gbs, zero_stage=3 if fsdp > 0 else 1)
        if fsdp > 0:  # Megatron-FSDP: parameters and gradients live in its communication buffers
            parallelism["zero_buffer_copies"] = False
        if ep > 1:  # Megatron-Bridge's MoE recipes: expert tensor parallel 1, expert groups folded over TP x DP
            parallelism["moe_load_imbalance"] = 1.0
            parallelism["etp"] = 1
        if model == "deepseek-v3":  # NeMo's DeepSeek-V3 H100 recipe: Megatron's flex dispatcher with DeepEP
            parallelism["moe_dispatch"] = "deepep"
        if (model.startswith("qwen3") or model == "gpt-oss-120b") and ep > 1 \
                and release_number(row["release"]) >= BRIDGE_DEEPEP_FROM:
            parallelism["moe_dispatch"] = "deepep"  # Megatron-Bridge's Qwen3 / GPT-OSS recipes on Hopper (docstring)
        assumed = ""
        if model == "gpt-oss-120b":  # Megatron-Bridge's GPT-OSS H100 recipe: selective recompute by module list
            parallelism["recompute"] = "selective"
            parallelism["recompute_modules"] = list(GPT_OSS_RECOMPUTE_MODULES)
            if (mbs, gbs) != GPT_OSS_RECIPE_BATCH:
                assumed = (f"recompute_modules {list(GPT_OSS_RECOMPUTE_MODULES)} of megatron-bridge 0.6.2's recipe for "
                           f"mbs {GPT_OSS_RECIPE_BATCH[0]} gbs {GPT_OSS_RECIPE_BATCH[1]}; this row's own recipe is "
                           "not carried")
        training = {"seq_length": seq, "precision": precision, "attention": "flash"}
        if release_number(row["release"]) >= BF16_GRADS_FROM:  # the performance scripts' bf16 gradients
            training["grad_dtype"] = "bf16"
            training["fused_cross_entropy"] = True
        if task in PACKED_TASKS:  # SQuAD packed to the sequence length, attention per document (docstring)
            training["packing"] = {"document_tokens": SQUAD_DOCUMENT_TOKENS}
        lora = lora_recipe(row["release"]) if task == "LoRA" else None
        if lora is not None:
            training["finetune"] = lora
        training = with_run_kernel(training, run_kernel("nemo", "nemo", "H100"))
        variant = "" if str(row["variant"]) in ("nan", "primary value") else f"|{row['variant']}"
        variant += "|tokendrop" if "tokendrop" in name else ""
        key = (f"nemo|{model}|{task}|{n}|{precision}|tp{tp}|pp{pp}|cp{cp}|vp{vp}|ep{ep}|fsdp{fsdp}|gbs{gbs}|"
               f"mbs{mbs}|s{seq}{variant}")
        tokens = cell_float(row["tokens_per_s_per_gpu"])
        out.append(ModernCase(
            "nemo", int(index), f"{label} tp{tp} pp{pp} cp{cp} vp{vp} ep{ep} {precision}", key,
            scenario(f"nemo-{index}", model, NODE, n, parallelism, training), precision, ACCELERATOR,
            f"nemo|{ACCELERATOR}|{precision}", tokens,
            None if tokens is not None else cell_float(row["model_tflops_per_gpu"]), set_aside=set_aside(row),
            added_after_fit=LORA_ADDED_AFTER_FIT if lora else "",
            assumed="; ".join(part for part in (assumed, _assumed(task, lora)) if part)))
    return out, skipped


def lora_recipe(release: str) -> dict:
    """``training.finetune`` for a LoRA row: the release's LoRA settings, which the table does not print.
    NeMo 24.07 (NeMo 1 PEFT): the fused QKV projection alone (nemo_toolkit 2.0.0rc1
    ``nemo/collections/nlp/parts/peft_config.py`` ``get_target_modules(lora_cfg, default=("attention_qkv",))``)
    at ``adapter_dim: 32`` (``megatron_gpt_finetuning_config.yaml``'s ``lora_tuning``, not carried: assumed);
    the 26.xx rows (Megatron-Bridge): megatron-bridge 0.6.2 ``perf_recipes/llama/h100/llama3.py``
    ``llama3_70b_peft_8gpu_h100_fp8cs_config`` sets ``cfg.peft.target_modules = ["linear_qkv"]`` on
    ``recipes/llama/h100/llama3.py`` ``llama3_70b_peft_8gpu_h100_bf16_config``'s ``dim = 16, alpha = 32``
    (``_peft_common``'s all-four default overridden)."""
    if release_number(release) < (25, 0):
        return {"method": "lora", "rank": 32, "alpha": 32, "target_modules": ["linear_qkv"]}
    return {"method": "lora", "rank": 16, "alpha": 32, "target_modules": ["linear_qkv"]}


#: Rows that fine-tune on packed SQuAD (module docstring).
PACKED_TASKS = ("SFT", "LoRA")
#: Tokens of one SQuAD v1.1 example as the recipes format it (``Context: {context} Question: {question} Answer:``
#: and the answer, megatron-bridge 0.6.2 ``data/sources/hf_adapters.py`` ``_squad_adapter``; NeMo 1's SQuAD
#: SFT template likewise), assumed: a Wikipedia paragraph of about 120 words, a question of about 10 and an answer
#: of about 3, at about 1.4 Llama tokens per word, plus the template, BOS and EOS: about 200. No SQuAD file is
#: carried to count it. The rows hardly depend on it: 100 to 400 tokens move every SFT and LoRA row by at most
#: 2.2 points (the attention core is 3-5% of their step at any such length, against 12-26% at a full 4,096).
SQUAD_DOCUMENT_TOKENS = 200


def _assumed(task: str, lora: dict | None) -> str:
    """What an SFT or LoRA row assumes that the table does not print."""
    parts = []
    if task in PACKED_TASKS:
        parts.append(f"SQuAD packed to the sequence, documents of {SQUAD_DOCUMENT_TOKENS} tokens (SQUAD_DOCUMENT_TOKENS)")
    if lora is not None and lora["rank"] == 32:
        parts.append("LoRA rank 32 (NeMo 1's adapter_dim default; the table does not say)")
    return "; ".join(parts)


LORA_ADDED_AFTER_FIT = ("a LoRA row, made representable (training.finetune) after this set's profiles were fitted: "
                        "held out whatever its key's half, never fitted on")
