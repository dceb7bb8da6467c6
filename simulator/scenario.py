"""The scenario contract: model + cluster + parallelism + training, read from YAML.

A scenario file holds *references* (catalog names, paths, inline mappings); loading it
resolves them to specs and checks the layout, so everything downstream works on values.
``--set key.path=value`` overrides are applied to the raw mapping before validation.
Three independent inputs (model, system, execution) are joined only here (Calculon's habit).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hardware_specs.catalog import FABRICS, NODES, node_accelerator
from hardware_specs.framework import DEFAULT_FRAMEWORK
from hardware_specs.schema import Accelerator, Fabric, Node
from hardware_specs.yaml_io import read_yaml
from simulator.colocation.spec import CoLocatedJob, CoLocatedJobSpec
from simulator.cost.attention_kernel import framework_kernel, with_attention_kernel
from simulator.cost.framework import (
    FrameworkChoice,
    choose,
    precision_key,
    with_framework,
    with_framework_settings,
    with_grouped_gemm_kernels,
)
from simulator.cost.stragglers import StragglerSpec
from simulator.economics.convergence import ConvergenceSpec
from simulator.economics.cost import EconomicsSpec
from simulator.economics.reliability import ReliabilitySpec, resolve_processes
from simulator.errors import ConfigError, from_pydantic, no_bool_numbers
from simulator.strategies.registry import DEFAULT_KIND, get_kind, load_kinds, parse_strategy
from simulator.strategies.spmd.layout import Parallelism, resolve_layout
from workloads.catalog import resolve_model
from workloads.graph import ShardShape
from workloads.layer_graph import LayerGraph
from workloads.lora import TARGET_OPS, LoraShape
from workloads.lora import check_model as check_lora_model
from workloads.packing import check as check_packing
from workloads.schema import TransformerSpec

DEFAULT_SCENARIO = Path(__file__).parent / "scenarios" / "default.yaml"

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
GemmClass = Literal["attention_proj", "mlp", "experts", "router", "lm_head"]


#: The most GPUs a command's ``--gpus`` may name: 5-10x the largest clusters trained on (~100,000-200,000 GPUs, 2025).
#: Past it the layout search's divisor walk and the planners' loops over GPU counts would not end (``search``,
#: ``plan --gpus 10**30`` ran for ever; ``scale`` raised a numpy TypeError).
MAX_GPUS = 1_000_000


def check_gpu_count(count: int, field: str = "--gpus") -> int:
    """``count`` when it is a positive GPU count no larger than :data:`MAX_GPUS`; else a ConfigError naming ``field``."""
    if count < 1:
        raise ConfigError(field, f"must be a positive integer, got {count}")
    if count > MAX_GPUS:
        raise ConfigError(field, f"{count:,} GPUs is past the limit of {MAX_GPUS:,} (the largest clusters trained on "
                                 "hold ~100,000-200,000 GPUs; a larger count is likely a typo, and searching or "
                                 "planning over it would not end)")
    return count


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    _no_bool_numbers = field_validator("*", mode="before")(no_bool_numbers)


class NodeGroupSpec(_Strict):
    """One group of a mixed cluster: ``nodes`` whole nodes of one node spec."""

    node: str | dict[str, Any]
    nodes: int = Field(gt=0, le=1_000_000)


class ClusterSpec(_Strict):
    """Which hardware and how much. ``profile`` is a calibrated hardware profile YAML
    (with ``node`` and ``fabric`` inside); when given, ``node``/``fabric`` come from it.
    A mixed cluster is ``groups`` of whole nodes instead of ``node`` (ranks fill the groups in
    order); ``num_gpus`` is then their sum (may be given, must agree)."""

    node: str | dict[str, Any] | None = None
    fabric: str | dict[str, Any] = "fat-tree"
    profile: str | None = None
    num_gpus: int | None = Field(default=None, gt=0)
    groups: list[NodeGroupSpec] | None = Field(
        default=None, min_length=1, description="node groups of a mixed cluster, in rank order (instead of node)")
    gpus_used_per_nvlink_domain: int | None = Field(
        default=None, gt=0,
        description="GPUs of each NVLink domain the job uses, where the node's domain spans several nodes (GB200/GB300 "
                    "NVL72: 72 GPUs in 18 trays of 4): ranks fill this many GPUs of one rack, then the next rack, so "
                    "a layout's TP/CP/EP groups can stay inside one rack (64: 16 trays per rack, the rest idle). Whole "
                    "nodes; at most the domain. None: ranks fill each domain whole, in order")


@dataclass(frozen=True)
class NodeGroup:
    """A resolved node group: ``num_gpus`` ranks from ``first_rank`` on, on ``node`` (whole nodes,
    or a part of one node in the one-group form)."""

    node: Node
    accelerator: Accelerator
    num_gpus: int
    first_rank: int

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.node.gpus_per_node)

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.num_gpus)

    @property
    def label(self) -> str:
        return f"{self.num_nodes}x {self.node.name}"


class FinetuneSpec(_Strict):
    """``training.finetune``: fine-tune a frozen base with LoRA adapters (workloads/lora.py)."""

    method: Literal["lora"] = Field(
        description="lora: low-rank adapters on a frozen base (Hu et al. 2021, arXiv:2106.09685); the only method "
                    "priced (QLoRA's 4-bit base is not)")
    rank: int = Field(gt=0, le=65536, description="the adapters' rank r (NeMo/PEFT 'dim' / 'r')")
    alpha: float | None = Field(
        default=None, gt=0, description="the adapters' scale numerator (alpha / r scales B's output); recorded, no "
                                        "effect on time or memory (folded into B's epilogue)")
    target_modules: list[Literal["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]] = Field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], min_length=1,
        description="the linear layers that get an adapter, in NeMo / Megatron-Bridge's names: linear_qkv (the "
                    "fused QKV projection), linear_proj (the attention output projection), linear_fc1 (the MLP's "
                    "first, gate and up, linear), linear_fc2; default all four (Megatron-Bridge's LoRA default)")


class PackingSpec(_Strict):
    """``training.packing``: several documents packed into each sequence, attention per document
    (workloads/packing.py)."""

    document_tokens: int = Field(
        gt=0, description="tokens of each document in a packed sequence (the length-weighted mean, sum of d^2 / sum "
                          "of d, where lengths vary): a sequence of seq_length tokens holds seq_length // "
                          "document_tokens documents and one of the rest; attention runs per document")


class TrainingSpec(_Strict):
    seq_length: int | None = Field(default=None, gt=0, description="overrides the model's")
    precision: Precision = "bf16"
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    tokens: float | None = Field(default=None, gt=0, description="tokens to train, for time to train")
    grad_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        default="auto",
        description="gradient accumulation/reduction dtype; auto: fp32 for bf16/fp8 training (Megatron-LM "
                    "sets accumulate_allreduce_grads_in_fp32 for bf16; nanotron likewise), fp16 for fp16, fp32 for fp32. "
                    "With param_dtype fp32 it is only the reduce dtype (FSDP's reduce_dtype): the gradient held "
                    "for the optimizer is cast back to the fp32 parameter's dtype (simulator/memory/analytic.py "
                    "held_gradient_bytes)")
    param_dtype: Literal["auto", "fp32"] = Field(
        default="auto",
        description="dtype the (sharded) parameters are held in, spmd kind: auto = 16-bit weights beside the fp32 "
                    "master copy in the optimizer state with mixed precision (Megatron-LM, DeepSpeed: 2 + 12 B per "
                    "parameter with Adam; ZeRO Sec. 3); fp32 = the parameters are the fp32 master weights and are "
                    "cast to 16 bits only for the forward and backward (PyTorch FSDP/FSDP2 MixedPrecisionPolicy("
                    "param_dtype=bf16), torch.autocast: 4 + 8 B with Adam, the 16-bit copies gathered per module)")
    attention: Literal["standard", "flash"] = Field(
        default="flash",
        description="flash (the default, as every current framework: FlashAttention-2/3, cuDNN or CK fused "
                    "attention; the s x s scores are never stored and causal tiles are skipped) or standard "
                    "(softmax materialised, Megatron-LM 2021-22). On an accelerator without a fused attention "
                    "kernel (no bf16 tensor cores: V100) the default falls back to standard and an explicit "
                    "flash is an error")
    attention_kernel: Literal["auto", "fa2", "fa3", "triton", "cudnn"] = Field(
        default="auto",
        description="with attention flash, the fused kernel: auto = the accelerator's default (FlashAttention-2 on "
                    "Hopper, as torchtitan and llm-foundry run it; elsewhere the GEMM-curve estimate), fa2 = "
                    "FlashAttention-2 (measured on A100 and Hopper), fa3 = FlashAttention-3 (Hopper only; elsewhere an "
                    "error), triton = Triton FlashAttention (llm-foundry's MPT attn_impl: triton; measured on A100), cudnn = "
                    "cuDNN fused attention (Transformer Engine's choice on Hopper and later: Megatron-Core, NeMo; "
                    "NVIDIA parts only, elsewhere an error; measured nowhere, priced as the accelerator's default "
                    "kernel, assumed). "
                    "simulator/cost/attention_kernel.py")
    unfused_eager_kernels: bool = Field(
        default=False,
        description="the separate kernels of a framework that runs PyTorch eager ops (the harness): each biased "
                    "linear's bias gradient as its own reduction of the output gradient, and gradient accumulation "
                    "as an add into the gradients after every micro-batch but the first, and under TP the hand-written "
                    "vocab-parallel cross-entropy as its eager ops (validation/harness/model.py: 7 kernels, 12 passes "
                    "over the logits; workloads/graph.py EAGER_VOCAB_CE_PASSES). Off (Megatron-LM, "
                    "Transformer Engine): the wgrad GEMM's epilogue gives the bias gradient and accumulates into "
                    "main_grad (gradient_accumulation_fusion)")
    elementwise_kernels: Literal["fused", "eager"] = Field(
        default="fused",
        description="a block's norms, activation and rotary embedding: fused (one kernel each, reading and writing "
                    "each tensor once: torch.compile, Transformer Engine, apex) or eager (PyTorch eager composite ops, "
                    "torchtitan's Llama without torch.compile: RMSNorm as upcast, square, mean, rsqrt, multiply, "
                    "downcast and weight multiply, SwiGLU as SiLU then multiply, RoPE as upcast, complex multiply and "
                    "downcast, each a kernel over the whole tensor; workloads/graph.py EAGER_BYTES_PER_ELEMENT)")
    optimizer_fusion: Literal["none", "backward", "forward"] = Field(
        default="none",
        description="optimizer fusion (Jiang et al. 2021, arXiv:2104.00237): backward: each model chunk's update "
                    "right after its last backward (and its gradient reduction), its gradients freed there; with one "
                    "micro-batch only one module's gradients are alive at a time (PyTorch's optimizer step in "
                    "backward); forward: each chunk's update just before its first forward of the next step. "
                    "Needs zero_stage 0 and a schedule other than zb-h1; modelled by the kinds spmd, local_sgd, "
                    "async_pipeline, local_learning and cyclic_dp (simulator/strategies/optimizer_fusion.py), "
                    "refused by the others")
    tf32: bool = Field(
        default=False,
        description="with precision fp32: GEMMs and convolutions run on the tensor cores in TF32 (10-bit mantissa "
                    "inputs, fp32 accumulate) at the accelerator's tf32 peak; weights, activations and gradients stay "
                    "fp32. PyTorch: torch.backends.cudnn.allow_tf32 (on by default, so convolutions of 'fp32' CNN "
                    "training on Ampere and later run in TF32) and torch.backends.cuda.matmul.allow_tf32 (off by "
                    "default since 1.12); NVIDIA DeepLearningExamples' 'TF32' rows. Memory-bound kernels are unchanged")
    fp8_recipe: Literal["delayed", "current", "rowwise", "blockwise", "mxfp8", "nvfp4"] = Field(
        default="delayed",
        description="with precision fp8, how the FP8 GEMMs are scaled (Transformer Engine recipes): delayed = "
                    "per-tensor scale from the amax history (DelayedScaling); current = per-tensor scale from this "
                    "step's amax, an extra read pass (Float8CurrentScaling); rowwise = one scale per row of each GEMM "
                    "operand from this step's amax (torchao Float8Linear's rowwise recipe, torchtitan's "
                    "float8.recipe_name = rowwise): current scaling's passes on the per-tensor fp8 curve (no rowwise "
                    "GEMM was measured: gemm_rowwise is assumed); blockwise = 1x128 activation / 128x128 "
                    "weight blocks (DeepSeek-V3 arXiv:2412.19437 Sec. 3.3; Float8BlockScaling, Hopper); mxfp8 = "
                    "32-element blocks with E8M0 scales in the tensor cores (OCP MX v1.0; Blackwell, CDNA4); nvfp4 = "
                    "the same GEMMs in FP4 with 16-element blocks and E4M3 scales (NVIDIA NVFP4, Blackwell)")
    fp8_gemms: list[GemmClass] = Field(
        default_factory=lambda: ["attention_proj", "mlp", "experts"],
        description="with precision fp8, the GEMM classes that run in FP8; the others run in bf16. Default as "
                    "Transformer Engine / DeepSeek-V3 (arXiv:2412.19437 Sec. 3.3.1): the linear layers of attention, "
                    "MLP and experts in FP8; the LM head and the MoE router in higher precision")
    fp8_saved_inputs: bool = Field(
        default=True,
        description="with precision fp8, the FP8 linear layers keep their inputs for the backward in FP8 (1 B per "
                    "element plus the recipe's block scales) instead of 16 bits: Transformer Engine's Linear, "
                    "LayerNormLinear and LayerNormMLP save the quantized input (Megatron-Core, NeMo, llm-foundry "
                    "amp_fp8). False: the 16-bit input is kept (torchao Float8Linear, torchtitan, saves the "
                    "high-precision input and re-quantizes it in the backward). Memory only")
    finetune: FinetuneSpec | None = Field(
        default=None,
        description="fine-tune a frozen base with LoRA adapters (workloads/lora.py): the base's weight-gradient "
                    "GEMMs, gradients and optimizer state vanish (its weights held in 16 bits), the adapters' GEMMs, "
                    "parameters and optimizer state are added, and data parallelism reduces the adapters' gradients "
                    "alone. Decoder transformers with dense MLPs, spmd kind; None: every parameter is trained")
    packing: PackingSpec | None = Field(
        default=None,
        description="packed sequences (fine-tuning recipes pack short examples to the sequence length: NeMo's and "
                    "Megatron-Bridge's SFT and LoRA recipes pack SQuAD): the attention core runs per document "
                    "(FlashAttention varlen / Transformer Engine's thd layout with cu_seqlens), its FLOPs and time "
                    "scale with the sum of the documents' squared lengths instead of seq_length^2; the GEMMs, memory "
                    "kernels and activations are per token as unpacked. Decoder transformers without MLA, attention "
                    "flash, cp 1 (workloads/packing.py). None: one document per sequence")
    fused_cross_entropy: bool = Field(
        default=False,
        description="the loss is one fused kernel that keeps the 16-bit logits and a log-sum-exp per token (2 B "
                    "per logit: flash-attn's Triton cross entropy, llm-foundry's default loss_fn fused_crossentropy) "
                    "instead of an fp32 copy beside them (6 B: Megatron's vocab-parallel cross entropy, "
                    "torch.nn.functional.cross_entropy under autocast). Memory only")
    framework: str = Field(
        default=DEFAULT_FRAMEWORK,
        description="the training framework whose fitted profile scales the accelerator's kernel rates "
                    "(hardware_specs/frameworks/*.yaml, fitted on the fit half of its published runs; "
                    "simulator/cost/framework.py): megatron-core (the default: the catalog constants, the rates "
                    "Megatron-Core with Transformer Engine reaches), nemo, torchtitan, llm-foundry, fms-fsdp, "
                    "fms-fsdp-compile, megatron-deepspeed; for CNNs dle-pytorch, dle-mxnet (NVIDIA "
                    "DeepLearningExamples) and lambda-pytorch (Lambda's ResNet-50 benchmark, its input pipeline). "
                    "The framework's own settings its fitted runs used (the "
                    "profile's fitted_with, e.g. torchtitan's fp8_saved_inputs: false) fill what the scenario leaves "
                    "out; given ones are kept and warned about where they differ. Where the framework was not "
                    "measured on the accelerator or precision, the output says what is used instead (another "
                    "precision's or part's factors, derived; or the catalog's, assumed)")


#: Bytes per element of a linear layer's input kept for the backward in the FP8 recipe's format: one
#: byte per FP8 element plus its scales -- per tensor (delayed, current): none; blockwise: one fp32
#: scale per 1x128 block (DeepSeek-V3 arXiv:2412.19437 Sec. 3.3.1): 4/128; MXFP8: one E8M0 byte per 32
#: elements (OCP MX v1.0): 1/32; NVFP4: half a byte plus one E4M3 byte per 16 elements.
FP8_SAVED_ELEMENT_BYTES = {"delayed": 1.0, "current": 1.0, "rowwise": 1.0, "blockwise": 1.0 + 4 / 128, "mxfp8": 1.0 + 1 / 32,
                           "nvfp4": 0.5 + 1 / 16}


def lora_shape(finetune: FinetuneSpec | None) -> LoraShape | None:
    """The layer graph's view of ``training.finetune`` (workloads/lora.py), None without one."""
    if finetune is None:
        return None
    return LoraShape(finetune.rank, frozenset(TARGET_OPS[m] for m in finetune.target_modules))


def gradient_bytes(training: TrainingSpec) -> int:
    """Bytes per gradient element held and reduced (see ``TrainingSpec.grad_dtype``)."""
    if training.grad_dtype != "auto":
        return 4 if training.grad_dtype == "fp32" else 2
    return 2 if training.precision == "fp16" else 4


class SimulationSpec(_Strict):
    mode: Literal["symmetric", "full"] = "symmetric"
    hbm_reserve_gib: float = Field(default=2.0, ge=0, description="kept free: CUDA context, allocator slack")
    steps: int = Field(default=1, ge=1, le=10_000,
                       description="training steps unrolled back to back; results give the mean and each step's time")
    stragglers: StragglerSpec | None = Field(
        default=None, description="per-device speed drawn from a seeded distribution, once or every step, in full "
                                  "mode (simulator/cost/stragglers.py); None: every device at its priced speed")


class ScenarioFile(_Strict):
    """The YAML document as written by a user (references unresolved)."""

    name: str | None = None
    description: str | None = None
    model: str | dict[str, Any]
    cluster: ClusterSpec
    strategy: dict[str, Any] | None = Field(
        default=None, description="the strategy kind and its settings ({kind: spmd} when absent); see "
                                  "simulator/strategies/registry.py")
    parallelism: Parallelism = Parallelism()
    training: TrainingSpec = TrainingSpec()
    simulation: SimulationSpec = SimulationSpec()
    economics: EconomicsSpec = EconomicsSpec()
    convergence: ConvergenceSpec | None = Field(
        default=None, description="steps to a target as a function of batch, staleness and local steps (the user's "
                                  "or a paper's numbers): gives steps_to_target and time_to_target_s")
    co_located_jobs: list[CoLocatedJobSpec] = Field(
        default_factory=list, max_length=8,
        description="other training jobs on the same GPUs, each a scenario of its own at a lower priority; this "
                    "scenario is the foreground (simulator/colocation/spec.py)")
    reliability: ReliabilitySpec | None = Field(
        default=None, description="failures, checkpoints and restarts simulated over many steps: gives the "
                                  "simulated goodput (simulator/economics/simulated_goodput.py)")


@dataclass(frozen=True)
class Scenario:
    """A resolved scenario: specs, not references; layout checked and ``dp`` inferred."""

    name: str
    model: Any  # a TransformerSpec, or any spec with name, seq_length, sample and layer_graph(shard)
    node: Node
    accelerator: Accelerator
    fabric: Fabric
    num_gpus: int
    parallelism: Parallelism
    training: TrainingSpec
    simulation: SimulationSpec
    economics: EconomicsSpec = EconomicsSpec()
    strategy: BaseModel | None = None  # the kind's config; None: the default kind (spmd)
    convergence: ConvergenceSpec | None = None
    co_located: tuple[CoLocatedJob, ...] = ()  # background jobs on the same GPUs (simulator/colocation/)
    reliability: ReliabilitySpec | None = None
    node_groups: tuple[NodeGroup, ...] = ()  # a mixed cluster's groups in rank order; () = one group (node)
    frameworks: tuple[FrameworkChoice, ...] = ()  # training.framework resolved per node group (simulator/cost/framework.py)
    # pipelined layers per global chunk, fixed by the caller (simulator/strategies/spmd/split.py ``chunk_counts``):
    # the engine fold and the fast path run a ``balanced`` plan at fewer micro-batches with the whole step's cut
    pipeline_cut: tuple[int, ...] | None = None
    # cluster.gpus_used_per_nvlink_domain where set: (GPUs used of each domain, the node's own domain size); ``node``'s
    # nvlink_domain_gpus is then the GPUs used, so ranks fill that many per domain (simulator/cost/topology.py)
    nvlink_domain_use: tuple[int, int] | None = None

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        """The cluster's node groups in rank order (one for a homogeneous cluster)."""
        return self.node_groups or (NodeGroup(self.node, self.accelerator, self.num_gpus, 0),)

    @property
    def mixed(self) -> bool:
        """Whether the cluster has more than one node group."""
        return len(self.node_groups) > 1

    def rank_group(self, rank: int) -> NodeGroup:
        """The node group ``rank`` sits in (ranks fill the groups in order)."""
        for group in self.groups:
            if rank < group.first_rank + group.num_gpus:
                return group
        raise IndexError(f"rank {rank} is outside the cluster's {self.num_gpus} GPUs")

    def rank_accelerator(self, rank: int) -> Accelerator:
        return self.rank_group(rank).accelerator

    def rank_node(self, rank: int) -> Node:
        return self.rank_group(rank).node

    @property
    def cluster_label(self) -> str:
        """The groups, as a report names them: "32x dgx-a100-80g + 64x g4dn-12xlarge"."""
        return " + ".join(g.label for g in self.groups) if self.mixed else self.node.name

    @property
    def strategy_kind(self) -> str:
        return getattr(self.strategy, "kind", DEFAULT_KIND)

    @property
    def seq_length(self) -> int:
        return self.training.seq_length or self.model.seq_length

    @property
    def num_nodes(self) -> int:
        return sum(g.num_nodes for g in self.groups)

    @property
    def shard(self) -> ShardShape:
        """What one rank computes of one micro-batch under the layout (a model without a sequence
        gets ``seq_length`` 1, which its builder ignores)."""
        par, tr = self.parallelism, self.training
        return ShardShape(
            micro_batch=par.micro_batch_size, seq_length=self.seq_length or 1, tp=par.tp, cp=par.cp,
            sequence_parallel=par.sequence_parallel, precision=tr.precision,
            flash_attention=tr.attention == "flash", ep=par.ep, etp=par.etp_degree, moe_load_imbalance=par.moe_load_imbalance,
            cp_comm=par.cp_comm, cp_load_balance=par.cp_load_balance, tp_comm_overlap=par.tp_comm_overlap,
            tp_overlap=par.tp_overlap, unfused_eager_kernels=tr.unfused_eager_kernels,
            eager_elementwise=tr.elementwise_kernels == "eager",
            fp8_saved_inputs=frozenset(tr.fp8_gemms) if tr.precision == "fp8" and tr.fp8_saved_inputs else frozenset(),
            fp8_saved_element_bytes=FP8_SAVED_ELEMENT_BYTES[tr.fp8_recipe],
            fused_cross_entropy=tr.fused_cross_entropy, lora=lora_shape(tr.finetune),
            document_tokens=tr.packing.document_tokens if tr.packing is not None else None)

    def layer_graph(self) -> LayerGraph:
        """The model's layer graph for one micro-batch on one rank (the one description memory,
        compute and the planner read; built once per model and shard)."""
        return layer_graph_of(self.model, self.shard)


@lru_cache(maxsize=256)
def _cached_graph(model: Any, shard: ShardShape) -> LayerGraph:
    return model.layer_graph(shard)


def layer_graph_of(model: Any, shard: ShardShape) -> LayerGraph:
    """``model.layer_graph(shard)``, cached for hashable (frozen) specs."""
    try:
        return _cached_graph(model, shard)
    except TypeError:  # an unhashable spec: build it each time
        return model.layer_graph(shard)


def _parse_value(text: str) -> Any:
    """A ``--set`` value: YAML scalar syntax (numbers, true/false, null, lists, strings)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def set_path(raw: dict[str, Any], path: str, value: Any, field: str | None = None) -> None:
    """Set ``a.b.c`` in a nested mapping in place, creating mappings on the way. A key that is a whole
    number picks an existing item of a list (``co_located_jobs.0.priority``)."""
    keys = [k for k in str(path).strip().split(".") if k]
    field = field or path
    if not keys:
        raise ConfigError(field, "empty key path")
    node: Any = raw
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise ConfigError(field, f"{'.'.join(keys[:depth]) or key} is a list of {len(node)}: "
                                         f"{key!r} is not an index into it")
            if last:
                node[int(key)] = copy.deepcopy(value)
                return
            node = node[int(key)]
            continue
        if last:
            node[key] = copy.deepcopy(value)
            return
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, (dict, list)):
            raise ConfigError(field, f"{key} is not a mapping")
        node = child


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides to a raw scenario mapping (returns a copy)."""
    data = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", f"expected key.path=value, got {item!r}")
        path, value = item.split("=", 1)
        if not path.strip(".").strip():
            raise ConfigError("--set", f"empty key in {item!r}")
        parsed = _parse_value(value)
        if parsed is None and not _accepts_null(path):
            unset_path(data, path)  # null/~/empty on a field that cannot be null: its default, as if not written
        else:
            set_path(data, path, parsed, path.strip())
    return data


def _accepts_null(path: str) -> bool:
    """Whether the scenario field at dotted ``path`` accepts null (YAML ``null``/``~``). A ``--set`` of null on
    a field that does not (``training.framework``) unsets it: the field takes its default, as if the file did
    not write it. A path the schema does not reach by model fields (a mapping, a list item, an unknown key)
    counts as accepting null, so the value is set and validation names what is wrong."""
    import types
    import typing

    from pydantic import BaseModel

    model: Any = ScenarioFile
    keys = [k for k in path.strip().split(".") if k]
    for depth, key in enumerate(keys):
        field = model.model_fields.get(key) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return True
        options = typing.get_args(field.annotation) if isinstance(field.annotation, types.UnionType) or \
            typing.get_origin(field.annotation) is typing.Union else (field.annotation,)
        if depth == len(keys) - 1:
            return type(None) in options or Any in options
        models = [o for o in options if isinstance(o, type) and issubclass(o, BaseModel)]
        if len(models) != 1:
            return True
        model = models[0]
    return True


def unset_path(raw: dict[str, Any], path: str) -> None:
    """Remove ``a.b.c`` from a nested mapping in place (nothing when it is not there)."""
    keys = [k for k in str(path).strip().split(".") if k]
    node: Any = raw
    for key in keys[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(keys[-1], None)


def load_raw(source: str | Path | dict[str, Any] | None) -> tuple[dict[str, Any], Path | None]:
    """The raw mapping of a scenario file (or the default), and the folder paths are relative to."""
    if isinstance(source, dict):
        return copy.deepcopy(source), None
    path = Path(source) if source is not None else DEFAULT_SCENARIO
    data = read_yaml(path, "scenario", catalog=source is None)  # the package's own default: libyaml's parser
    if not isinstance(data, dict):
        raise ConfigError("scenario", f"{path} must hold a mapping at the top level")
    if looks_like_sweep(data):
        raise ConfigError("scenario", f"{path} is a sweep file (it has {', '.join(k + ':' for k in SWEEP_ONLY_KEYS if k in data)}"
                                      f" and no model: or cluster:), not a scenario: run it with `clustersim sweep {path}`")
    return data, path.parent


#: Top-level keys only a sweep file has (simulator/explore/sweep.py ``SweepFile``) and only a scenario has.
SWEEP_ONLY_KEYS: tuple[str, ...] = ("base", "set", "grid", "zip", "show")
SCENARIO_ONLY_KEYS: tuple[str, ...] = ("model", "cluster", "strategy", "parallelism", "training", "simulation",
                                       "economics", "convergence", "co_located_jobs", "reliability")


def looks_like_sweep(data: dict[str, Any]) -> bool:
    """A mapping with a sweep file's keys and none of a scenario's: given where a scenario is expected."""
    return any(k in data for k in SWEEP_ONLY_KEYS) and not any(k in data for k in SCENARIO_ONLY_KEYS)


def looks_like_scenario(data: dict[str, Any]) -> bool:
    """A mapping with a scenario's keys and none of a sweep file's: given where a sweep file is expected."""
    return any(k in data for k in SCENARIO_ONLY_KEYS) and not any(k in data for k in SWEEP_ONLY_KEYS)


def _relative(ref: Any, base: Path | None) -> Any:
    """Resolve relative file references against the scenario file's folder."""
    if isinstance(ref, str) and base is not None and (ref.endswith((".yaml", ".yml", ".json"))):
        candidate = base / ref
        if candidate.exists():
            return str(candidate)
    return ref


def relative_profile(ref: Any, base: Path | None) -> Any:
    """A measured per-layer profile named inline (``model: {family: profile, path: ...}``) with its relative
    ``path`` read from the scenario file's folder, as the scenario's other file references are
    (:func:`_relative`); where that folder holds no such file the path stays as written (the current
    directory's: a ``--set model.path=...`` given on the command line, say)."""
    if not (isinstance(ref, dict) and ref.get("family") == "profile" and isinstance(ref.get("path"), str)
            and ref["path"] and base is not None):
        return ref
    path = Path(ref["path"])
    if path.is_absolute() or not (base / path).is_file():
        return ref
    return {**ref, "path": str((base / path).resolve())}


def has_fused_attention(accelerator: Accelerator) -> bool:
    """Whether FlashAttention (or a vendor fused attention kernel) runs on the accelerator: it needs
    the bf16 tensor cores of NVIDIA Ampere / AMD CDNA2 and later (FlashAttention-2 README: Ampere,
    Ada, Hopper; ROCm/flash-attention: MI200, MI300); V100 has none."""
    return "bf16" in accelerator.peak_tflops


def _resolved_attention(training: TrainingSpec, accelerator: Accelerator) -> TrainingSpec:
    """The attention kernel the run uses: the flash default falls back to standard where no fused
    kernel exists; an explicit flash there is a ConfigError."""
    if training.attention != "flash" or has_fused_attention(accelerator):
        return training
    if training.attention_kernel != "auto":
        raise ConfigError("training.attention_kernel", f"{training.attention_kernel} is a fused attention kernel, "
                                                       f"which {accelerator.name} cannot run (no bf16 tensor cores); "
                                                       "leave it auto (the run falls back to standard attention)")
    if "attention" in training.model_fields_set:
        raise ConfigError("training.attention", f"flash needs a fused attention kernel, which {accelerator.name} "
                                                "lacks (no bf16 tensor cores); use standard")
    return training.model_copy(update={"attention": "standard"})


# keys users put in a scenario that live elsewhere (the unknown-key error says where)
UNKNOWN_KEY_HINTS = {
    "efficiency": "efficiency constants belong to the accelerator spec (hardware_specs/accelerators/*.yaml, "
                  "or an inline cluster.node mapping) or to a calibrated profile (cluster.profile), not the scenario",
}

# a file with no cluster: most often a co-located job's file run on its own (examples/jobs/), which said only
# "cluster: required field is missing" until the tenth session
MISSING_CLUSTER_HINT = (": the GPUs the run uses, e.g. cluster: {node: dgx-a100-80g, num_gpus: 8} (a file without "
                        "one is a co-located job, as examples/jobs/ holds: it runs only inside a scenario's "
                        "co_located_jobs:)")



def build_scenario(raw: dict[str, Any], base: Path | None = None) -> Scenario:
    """Validate a raw mapping and resolve every reference."""
    raw, settings = with_framework_settings(raw)  # training.framework's own settings where the file leaves them out
    try:
        doc = ScenarioFile.model_validate(raw)
    except ValidationError as exc:
        error = from_pydantic(exc, schema=ScenarioFile, hints=UNKNOWN_KEY_HINTS)
        if error.field == "cluster" and error.reason.startswith(MISSING := "required field is missing"):
            error = ConfigError("cluster", error.reason.replace(MISSING, MISSING + MISSING_CLUSTER_HINT, 1))
        raise error from None
    model = resolve_model(relative_profile(_relative(doc.model, base), base), "model")
    if doc.training.seq_length:
        if not isinstance(model, TransformerSpec):
            raise ConfigError("training.seq_length", f"{model.name}: only a decoder transformer's sequence length "
                                                     "can be set here")
        model = model.model_copy(update={"seq_length": doc.training.seq_length})
    node_ref: Any = doc.cluster.node
    fabric_ref: Any = _relative(doc.cluster.fabric, base)
    if doc.cluster.groups is not None:
        return _build_mixed(doc, model, base, fabric_ref, raw, settings)
    if doc.cluster.num_gpus is None:
        raise ConfigError("cluster.num_gpus", "required (or cluster.groups for a mixed cluster)")
    if doc.cluster.profile:
        profile = read_yaml(Path(_relative(doc.cluster.profile, base)), "cluster.profile")
        if not isinstance(profile, dict) or "node" not in profile:
            raise ConfigError("cluster.profile", "a profile must hold a 'node' mapping (and optionally 'fabric')")
        node_ref = profile["node"]
        fabric_ref = profile.get("fabric", fabric_ref)
    if node_ref is None:
        raise ConfigError("cluster.node", "required (a catalog name, a YAML path or a mapping)")
    node = NODES.get(_relative(node_ref, base), "cluster.node")
    accelerator = node_accelerator(node)
    fabric = FABRICS.get(fabric_ref, "cluster.fabric")
    _check_precision(doc.training, accelerator)
    choice = replace(_framework(doc.training, accelerator, model, node), settings=settings)
    accelerator, node = with_framework(choice, accelerator, node)
    accelerator = with_grouped_gemm_kernels(accelerator, doc.training.framework)
    training = doc.training.model_copy(update={"attention_kernel": framework_kernel(
        doc.training.attention_kernel, settings, accelerator)})
    training = _resolved_attention(training, accelerator)
    accelerator = with_attention_kernel(accelerator, training.attention_kernel, training.attention)
    n = doc.cluster.num_gpus
    node, use = _used_per_domain(node, doc.cluster.gpus_used_per_nvlink_domain)
    scenario = _resolved(doc, raw, base, model, fabric, training, [NodeGroup(node, accelerator, n, 0)], (choice,))
    return replace(scenario, nvlink_domain_use=use) if use else scenario


def _used_per_domain(node: Node, used: int | None) -> tuple[Node, tuple[int, int] | None]:
    """``cluster.gpus_used_per_nvlink_domain``: the node with its NVLink domain cut to the GPUs used of each (ranks
    then fill ``used`` GPUs of a rack before the next, :meth:`simulator.cost.topology.Topology.node_of`), and
    (used, the node's own domain). Refused where the node's domain is one node (nothing to choose), where it is
    not whole nodes, or more than the domain holds."""
    if used is None:
        return node, None
    field, domain, per_node = "cluster.gpus_used_per_nvlink_domain", node.domain_gpus, node.gpus_per_node
    if domain <= per_node:
        raise ConfigError(field, f"{node.name}'s NVLink domain is one node of {per_node} GPUs, so ranks already fill "
                                 "whole domains: the field chooses how many GPUs of an NVLink domain that spans "
                                 "several nodes a job uses (gb200-nvl72, gb300-nvl72: 72 GPUs in 18 trays of 4); "
                                 "leave it out here")
    if used > domain:
        raise ConfigError(field, f"{used} is more than the {domain} GPUs of one {node.name} NVLink domain")
    if used % per_node:
        raise ConfigError(field, f"{used} is not whole {node.name} nodes of {per_node} GPUs (a node's GPUs share one "
                                 f"tray and its NICs): use a multiple of {per_node}, e.g. "
                                 f"{max(per_node, used - used % per_node)}")
    return node.model_copy(update={"nvlink_domain_gpus": used}), (used, domain)


def _framework(training: TrainingSpec, accelerator: Accelerator, model=None, node: Node | None = None) -> FrameworkChoice:
    """``training.framework``'s profile entry on the accelerator in the run's precision (for ``model``: a
    network is told which profiles apply to it; on ``node``: an entry fitted on that very board is calibrated)."""
    return choose(training.framework, accelerator, precision_key(training.precision, training.tf32),
                  training.fp8_recipe if training.precision == "fp8" else None, model=model,
                  node=node.name if node is not None else None)


def _check_whole_nodes(node: Node, n: int) -> None:
    """More than one node must be whole nodes (a part of one node may have any GPU count)."""
    if n > node.gpus_per_node and n % node.gpus_per_node:
        raise ConfigError("cluster.num_gpus", f"{n} is not a whole number of {node.name} nodes ({node.gpus_per_node} "
                                              "GPUs each) nor a part of one node")


def _resolved(doc: ScenarioFile, raw: dict[str, Any], base: Path | None, model, fabric: Fabric,
              training: TrainingSpec, groups: list[NodeGroup], frameworks: tuple[FrameworkChoice, ...]) -> Scenario:
    """What one kind of node and a mixed cluster resolve alike: the strategy, the layout over the
    groups' GPUs (its errors before a partial node's), the reliability block's names, the co-located jobs."""
    num_gpus = sum(g.num_gpus for g in groups)
    strategy = parse_strategy(doc.strategy)
    parallelism = _layout(doc, model, num_gpus, strategy)
    if training.packing is not None:  # attention per document (workloads/packing.py); refused where not priced
        check_packing(training.packing.document_tokens, getattr(model, "seq_length", None), model,
                      training.attention, parallelism.cp)
    if doc.reliability is not None:
        resolve_processes(doc.reliability)  # names an unknown failure component (ConfigError)
    if len(groups) == 1:
        _check_whole_nodes(groups[0].node, num_gpus)
    return Scenario(
        name=doc.name or model.name,
        model=model,
        node=groups[0].node,
        accelerator=groups[0].accelerator,
        fabric=fabric,
        num_gpus=num_gpus,
        parallelism=parallelism,
        training=training,
        simulation=doc.simulation,
        economics=doc.economics,
        strategy=strategy,
        convergence=doc.convergence,
        co_located=_co_located_jobs(doc.co_located_jobs, raw.get("cluster"), base),
        reliability=doc.reliability,
        node_groups=tuple(groups) if len(groups) > 1 else (),
        frameworks=frameworks,
    )


def _absolute_refs(cluster: dict[str, Any], base: Path | None) -> dict[str, Any]:
    """The foreground's ``cluster:`` mapping with its file references made absolute, for a background
    scenario that lives in another folder."""
    return {k: _relative(v, base) if k in ("node", "fabric", "profile") else v for k, v in cluster.items()}


def _co_located_jobs(specs: list[CoLocatedJobSpec], cluster: Any, base: Path | None) -> tuple[CoLocatedJob, ...]:
    """Resolve each background job's scenario on the foreground's cluster (simulator/colocation/spec.py)."""
    jobs: list[CoLocatedJob] = []
    seen: dict[int, int] = {}
    for i, spec in enumerate(specs):
        field = f"co_located_jobs.{i}"
        if spec.priority in seen:
            raise ConfigError(f"{field}.priority", f"{spec.priority} is also job {seen[spec.priority]}'s: priorities "
                                                   "must differ (the lower number runs first)")
        seen[spec.priority] = i
        ref = _relative(spec.scenario, base) if isinstance(spec.scenario, str) else spec.scenario
        try:
            job_raw, job_base = load_raw(ref) if isinstance(ref, str) else (copy.deepcopy(ref), base)
        except ConfigError as exc:
            raise ConfigError(f"{field}.scenario", exc.reason) from None
        if "co_located_jobs" in job_raw:
            raise ConfigError(f"{field}.scenario.co_located_jobs", "a background job cannot hold jobs of its own")
        shared = _absolute_refs(dict(cluster), base)
        if "cluster" in job_raw and job_raw["cluster"] != cluster and job_raw["cluster"] != shared:
            raise ConfigError(f"{field}.scenario.cluster", "a co-located job runs on the foreground's GPUs: leave "
                                                           "cluster: out (or give the foreground's)")
        job_raw["cluster"] = shared
        try:
            job = build_scenario(job_raw, job_base)
        except ConfigError as exc:
            raise ConfigError(f"{field}.scenario.{exc.field}" if exc.field else f"{field}.scenario",
                              exc.reason) from None
        jobs.append(CoLocatedJob(job, spec.priority, spec.interference_slowdown, spec.interference_source))
    return tuple(jobs)


# Accelerators whose blockwise FP8 GEMMs (1x128 / 128x128 scales, DeepSeek-V3's recipe) have a kernel but no
# measurement in gemm_microbench.csv: the run goes on, priced on the per-tensor fp8 curve, and says so
# (simulator/cost/provenance.py: gemm_blockwise "assumed", and a warning naming the kernel). Hopper parts hold a
# measured fp8_block curve (DeepGEMM); parts in neither list are refused.
BLOCKWISE_FP8_KERNELS = {
    **dict.fromkeys(("b200", "b300", "gb200", "gb300"), "DeepGEMM's SM100 kernels"),
    **dict.fromkeys(("mi300x", "mi325x", "mi355x"), "AMD AITER's gemm_a8w8_blockscale"),
}


def _check_precision(training: TrainingSpec, accelerator: Accelerator, field_prefix: str = "") -> None:
    """The accelerator has the training precision (TF32 tensor cores, the FP8 recipe's tensor cores)."""
    where = f" ({field_prefix})" if field_prefix else ""
    if training.precision not in accelerator.peak_tflops:
        raise ConfigError("training.precision", f"{accelerator.name}{where} has no {training.precision} peak")
    if training.tf32 and training.precision != "fp32":
        raise ConfigError("training.tf32", f"applies to precision fp32 only, got {training.precision}")
    if training.tf32 and "tf32" not in accelerator.peak_tflops:
        raise ConfigError("training.tf32", f"{accelerator.name}{where} has no TF32 tensor cores (no tf32 peak)")
    if training.precision != "fp8" and "fp8_recipe" in training.model_fields_set:
        # a recipe chosen for a run without FP8 GEMMs would be ignored (fp8_gemms, a list of GEMM classes whose
        # default an FP8 file often spells out, stays allowed so that --set training.precision=bf16 compares)
        raise ConfigError("training.fp8_recipe", f"applies to precision fp8 only, got {training.precision} "
                                                 "(nothing would run in FP8; drop it or set training.precision=fp8)")
    default_gemms = TrainingSpec.model_fields["fp8_gemms"].default_factory()
    if training.precision != "fp8" and "fp8_gemms" in training.model_fields_set \
            and sorted(training.fp8_gemms) != sorted(default_gemms):
        # a choice of FP8 GEMM classes would be ignored as a recipe would (the default spelled out stays allowed)
        raise ConfigError("training.fp8_gemms", f"{training.fp8_gemms} applies to precision fp8 only, got "
                                                f"{training.precision} (nothing would run in FP8; drop it or set "
                                                "training.precision=fp8)")
    recipe = training.fp8_recipe
    if training.precision == "fp8" and recipe == "blockwise" and "fp8_block" not in accelerator.efficiency.gemm_curves \
            and accelerator.name not in BLOCKWISE_FP8_KERNELS:
        raise ConfigError("training.fp8_recipe", f"blockwise: no block-scaled FP8 GEMM kernel is known on "
                                                 f"{accelerator.name}{where} (DeepGEMM and Transformer Engine's "
                                                 f"Float8BlockScaling need Hopper or later; AMD's on CDNA3 and later)")
    if training.precision == "fp8" and recipe in ("mxfp8", "nvfp4") and (
            recipe not in accelerator.block_scaled_formats or (recipe == "nvfp4" and "fp4" not in accelerator.peak_tflops)):
        raise ConfigError("training.fp8_recipe", f"{accelerator.name}{where} has no {recipe} tensor cores (has: "
                                                 f"{', '.join(accelerator.block_scaled_formats) or 'none'})")


class LayoutVariants:
    """``build_scenario`` of one scenario mapping with its ``parallelism:`` replaced, for the thousands
    of layouts of a search: the mapping is validated and its references resolved once (``raw``, with
    any valid layout), each variant only validates and resolves its layout (``Parallelism``, then the
    checks of :func:`_layout`) on a copy of that scenario. A variant whose layout fails validation is
    built by ``build_scenario`` itself, so that it raises the same error (tests/test_search_checks.py
    compares both over every candidate of several searches)."""

    def __init__(self, raw: dict[str, Any], base: Path | None = None):
        self.raw, self.base = raw, base
        self.scenario = build_scenario(raw, base)  # a bad mapping raises its ConfigError here
        self.doc = ScenarioFile.model_validate(raw)

    def build(self, parallelism: dict[str, Any]) -> Scenario:
        try:
            par = Parallelism.model_validate(parallelism)
        except ValidationError:
            return build_scenario({**self.raw, "parallelism": parallelism}, self.base)  # raises its error
        sc = self.scenario
        doc = self.doc.model_copy(update={"parallelism": par})
        return replace(sc, parallelism=_layout(doc, sc.model, sc.num_gpus, sc.strategy))


def _layout(doc: ScenarioFile, model, num_gpus: int, strategy) -> Parallelism:
    kind = get_kind(getattr(strategy, "kind", DEFAULT_KIND))
    if doc.training.finetune is not None:
        check_lora_model(model)
        if kind.name != DEFAULT_KIND:  # the other kinds read every parameter as trained
            raise ConfigError("training.finetune", f"LoRA is priced by the {DEFAULT_KIND} kind only, got strategy kind "
                                                   f"{kind.name}")
        if doc.training.optimizer_fusion != "none":
            raise ConfigError("training.finetune", "LoRA with training.optimizer_fusion is not priced (the fused "
                                                   "update's gradient buffer is sized by whole modules); use none")
    if doc.parallelism.recompute_modules is not None:
        if kind.name != DEFAULT_KIND:  # the other kinds read parallelism.recompute alone
            raise ConfigError("parallelism.recompute_modules", f"Megatron-Core's module list is priced by the "
                                                               f"{DEFAULT_KIND} kind only, got strategy kind {kind.name}")
        if doc.training.finetune is not None:
            raise ConfigError("parallelism.recompute_modules", "with training.finetune (LoRA) is not priced (the "
                                                               "adapters' saved inputs inside a recomputed module)")
    if doc.parallelism.recompute_method is not None and kind.name != DEFAULT_KIND:  # the others read recompute alone
        raise ConfigError("parallelism.recompute_method", f"Megatron-Core's partial full recompute is priced by the "
                                                          f"{DEFAULT_KIND} kind only, got strategy kind {kind.name}")
    if doc.training.optimizer_fusion not in ("none", *kind.optimizer_fusion):
        fusion = doc.training.optimizer_fusion
        modelled = ", ".join(name for name, other in load_kinds().items() if fusion in other.optimizer_fusion)
        raise ConfigError("training.optimizer_fusion", f"{fusion!r} is not modelled by strategy kind {kind.name} "
                          f"(kinds that model it: {modelled}); use none")
    layout_gpus = kind.layout_gpus
    parallelism = resolve_layout(doc.parallelism, model, layout_gpus(strategy, doc.parallelism, num_gpus)
                                 if layout_gpus else num_gpus)
    if parallelism.recompute == "selective" and not isinstance(model, TransformerSpec):
        # Korthikanti et al. 2022 Sec. 4.2: selective recompute re-runs the attention core (softmax,
        # dropout, the score and value GEMMs) that the transformer builder marks; other graphs mark none
        # (a CNN has no attention; the catalog's ViT/BERT/GNMT attention is not split into its core),
        # so it would keep everything and re-run nothing: the same run as "none" under another name.
        raise ConfigError("parallelism.recompute", f"selective re-runs a transformer block's attention core "
                          f"(Korthikanti et al. 2022); {model.name} has none marked to drop: use none, or full "
                          "(keeps each residual block's or sqrt(n) segment's input)")
    if doc.training.optimizer_fusion != "none" and (parallelism.zero_stage != 0 or parallelism.schedule == "zb-h1"):
        raise ConfigError("training.optimizer_fusion", "is modelled with zero_stage 0 and schedules other than zb-h1, got "
                          f"zero_stage {parallelism.zero_stage}, schedule {parallelism.schedule}")
    return parallelism


def _build_mixed(doc: ScenarioFile, model, base: Path | None, fabric_ref: Any, raw: dict[str, Any],
                 settings: tuple[str, ...] = ()) -> Scenario:
    """A cluster given as node groups (whole nodes each; ranks fill the groups in order)."""
    cluster = doc.cluster
    if cluster.node is not None:
        raise ConfigError("cluster.groups", "give either cluster.node (one kind of node) or cluster.groups, not both")
    if cluster.profile is not None:
        raise ConfigError("cluster.groups", "a calibrated profile describes one node: not with cluster.groups")
    if cluster.gpus_used_per_nvlink_domain is not None:
        raise ConfigError("cluster.gpus_used_per_nvlink_domain", "applies to one kind of node (cluster.node), not "
                                                                 "to cluster.groups")
    groups: list[NodeGroup] = []
    choices: list[FrameworkChoice] = []
    first = 0
    for i, spec in enumerate(cluster.groups):
        node = NODES.get(_relative(spec.node, base), f"cluster.groups.{i}.node")
        accelerator = node_accelerator(node, f"cluster.groups.{i}.node.accelerator")
        _check_precision(doc.training, accelerator, f"cluster.groups.{i}")
        choice = replace(_framework(doc.training, accelerator, model, node), settings=settings)
        accelerator, node = with_framework(choice, accelerator, node)
        accelerator = with_grouped_gemm_kernels(accelerator, doc.training.framework)
        choices.append(choice)
        gpus = spec.nodes * node.gpus_per_node
        groups.append(NodeGroup(node, accelerator, gpus, first))
        first += gpus
    if cluster.num_gpus is not None and cluster.num_gpus != first:
        raise ConfigError("cluster.num_gpus", f"{cluster.num_gpus} is not the groups' {first} GPUs "
                                              f"({' + '.join(g.label for g in groups)}); leave it out")
    training = doc.training
    for group in groups:  # flash only where every group has a fused attention kernel
        training = _resolved_attention(training, group.accelerator)
    groups = [replace(g, accelerator=with_attention_kernel(
        g.accelerator, framework_kernel(training.attention_kernel, settings, g.accelerator), training.attention,
        f"cluster.groups.{i}: training.attention_kernel")) for i, g in enumerate(groups)]
    fabric = FABRICS.get(fabric_ref, "cluster.fabric")
    return _resolved(doc, raw, base, model, fabric, training, groups, tuple(choices))


def cluster_gpus(raw: dict[str, Any]) -> int | None:
    """The GPU count of a raw scenario's ``cluster.groups`` (None when it has none or they are not
    well-formed: building the scenario then says why)."""
    groups = (raw.get("cluster") or {}).get("groups") if isinstance(raw.get("cluster"), dict) else None
    if not isinstance(groups, list):
        return None
    try:
        return sum(NODES.get(g["node"]).gpus_per_node * int(g["nodes"]) for g in groups)
    except (ConfigError, KeyError, TypeError, ValueError):
        return None


def load_scenario(source: str | Path | dict[str, Any] | None = None, overrides: list[str] | None = None) -> Scenario:
    """Read a scenario (file, mapping, or the built-in default), apply overrides, resolve it."""
    raw, base = load_raw(source)
    return build_scenario(apply_overrides(raw, overrides or []), base)

