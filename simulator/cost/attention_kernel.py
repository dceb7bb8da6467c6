"""Which fused attention kernel a run uses (``training.attention_kernel``), resolved once per scenario.

An accelerator spec holds the kernel today's frameworks run by default (``efficiency.attention``:
FlashAttention-2 on Hopper, fitted on the FlashAttention-2 paper's figures) and, in
``efficiency.attention_kernels``, the others it runs (``fa3``: FlashAttention-3, fitted on the
FlashAttention-3 paper's H100 forward rows; Shah et al. 2024, arXiv:2407.08608, which runs on
Hopper only: its kernels use the sm90 wgmma/TMA instructions; ``fa2`` on A100, fitted on the
FlashAttention-2 paper's A100 rows, whose default stays the GEMM-curve estimate: see
validation/calibrate_microbench.py ``ATTENTION_ONLY`` for why). The scenario's accelerator is
given the chosen kernel as its ``attention``, so the compute model (simulator/cost/compute.py) and
the provenance listing read one field whatever the choice.

- ``auto``: the spec's default kernel (or the GEMM-curve fallback where it has none);
- ``fa2`` / ``fa3`` / ``triton``: that kernel; where the default is that kernel, the default. ``fa2``
  on an accelerator whose spec measured no FlashAttention-2 keeps the fallback pricing
  (FlashAttention-2 runs on every GPU with bf16 tensor cores: Ampere and later, and MI200/MI300
  through ROCm's port), which the run's provenance lists as assumed; ``triton`` (Triton
  FlashAttention: the FlashAttention-2 paper's Triton kernel, fitted on its A100 rows, Dao 2023
  Figs 4-6; llm-foundry's MPT ``attn_impl: triton`` runs a port of it) likewise: Triton compiles
  for the same GPUs. ``fa3`` where the spec has no FlashAttention-3 kernel is a ConfigError
  (exit 2): it does not run there.
- ``cudnn``: cuDNN's fused attention, what Transformer Engine (so Megatron-Core and NeMo) runs on
  Hopper and later: its backend choice disables FlashAttention "to give FusedAttention preference on
  Hopper+ for performance reasons", FlashAttention-3 included (transformer_engine/pytorch/attention.py
  ``get_attention_backend`` in TE 1.9, attention/dot_product_attention/utils.py in TE 2.20). No row
  here measures a cuDNN attention kernel: where the spec has no ``cudnn`` entry it is priced as the
  spec's default fused kernel (on Hopper FlashAttention-2's fit, which NeMo 24.03's long-context
  Transformer Engine rows, 4K-1M tokens, match within +0..+10%; on Blackwell FlashAttention-4's
  in-step level), every constant listed as assumed; with no default kernel, the fallback pricing.
  cuDNN is NVIDIA's library: ``cudnn`` on an AMD part is a ConfigError (exit 2).
- On a part with no fused attention kernel at all (no bf16 tensor cores: V100, T4) any named kernel is a
  ConfigError on ``training.attention_kernel`` (simulator/scenario.py ``_resolved_attention``).
"""

from __future__ import annotations

from hardware_specs.schema import Accelerator, AttentionEfficiency
from simulator.errors import ConfigError

KERNEL_NAMES = {"fa2": "FlashAttention-2", "fa3": "FlashAttention-3", "triton": "FlashAttention Triton",
                "cudnn": "cuDNN fused attention"}
#: Kernels that run wherever a fused kernel does: where the spec measured none, the fallback pricing (assumed).
PORTABLE = ("fa2", "triton")
#: Kernels no row measures on any part: where the spec has none, priced as its default fused kernel (assumed).
PRICED_AS_DEFAULT = ("cudnn",)
ATTENTION_CONSTANTS = ("fwd_efficiency", "bwd_efficiency", "half_seq_len", "causal_half_seq_len", "head_dim_factor")
FIELD = "training.attention_kernel"
#: Kernels of one vendor's library: cuDNN is NVIDIA's (on AMD parts the fused attention is ROCm's CK / AITER
#: FlashAttention port, which ``fa2`` and ``triton`` stand for).
VENDOR_ONLY = {"cudnn": "nvidia"}
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def runs_on_vendor(accelerator: Accelerator, kernel: str) -> bool:
    """Whether ``kernel``'s library exists for the accelerator's vendor (cuDNN: NVIDIA only)."""
    return kernel not in VENDOR_ONLY or accelerator.vendor == VENDOR_ONLY[kernel]


def framework_kernel(kernel: str, settings: tuple[str, ...], accelerator: Accelerator) -> str:
    """The kernel a run uses when ``training.framework`` filled it in (``settings``: the ``key=value`` pairs the
    framework's ``fitted_with`` supplied, simulator/cost/framework.py ``with_framework_settings``): the framework's
    kernel where its vendor's library runs on the part, else ``auto`` (NeMo's ``cudnn`` is Transformer Engine's
    choice on NVIDIA parts; on an AMD part the same framework runs ROCm's fused attention, the part's default; on a
    part without bf16 tensor cores none, and auto falls back to standard attention), which the run's
    framework-settings warning then names. A kernel the scenario itself names is kept as given."""
    runs = runs_on_vendor(accelerator, kernel) and "bf16" in accelerator.peak_tflops  # no bf16 tensor cores: no
    if f"training.attention_kernel={kernel}" in settings and not runs:                 # fused kernel (V100, T4)
        return "auto"
    return kernel


def with_attention_kernel(accelerator: Accelerator, kernel: str, attention: str,
                          field: str = FIELD) -> Accelerator:
    """The accelerator with ``kernel``'s efficiency as its ``attention`` (itself for ``auto``)."""
    if kernel == "auto":
        return accelerator
    if attention != "flash":
        raise ConfigError(field, f"{kernel} is a fused attention kernel: it needs training.attention: flash "
                                 f"(the run is set to {attention})")
    eff = accelerator.efficiency
    wanted = KERNEL_NAMES[kernel]
    if not runs_on_vendor(accelerator, kernel):
        owner = VENDOR_NAMES.get(VENDOR_ONLY[kernel], VENDOR_ONLY[kernel])
        raise ConfigError(field, f"{wanted} is {owner}'s library and runs on {owner} GPUs only; "
                                 f"{accelerator.name} (vendor {accelerator.vendor}) has no {wanted} kernel "
                                 "(use auto, fa2 or triton)")
    if eff.attention is not None and eff.attention.kernel == wanted:
        return accelerator
    if kernel in eff.attention_kernels:
        chosen = eff.attention_kernels[kernel]
    elif kernel in PRICED_AS_DEFAULT:
        chosen = None if eff.attention is None else priced_as_default(eff.attention, wanted)
    elif kernel in PORTABLE:
        # runs wherever a fused kernel does; not measured here: the fallback pricing (assumed)
        chosen = None
    else:
        runs_on = "Hopper GPUs (H100, H200, H800, GH200)" if kernel == "fa3" else "other accelerators"
        raise ConfigError(field, f"{wanted} runs on {runs_on}; {accelerator.name} has no {wanted} kernel "
                                 "(use auto or fa2)")
    return accelerator.model_copy(update={"efficiency": eff.model_copy(update={"attention": chosen})})


def priced_as_default(default: AttentionEfficiency, kernel: str) -> AttentionEfficiency:
    """``kernel`` (unmeasured) priced with the accelerator's default fused kernel's constants, all assumed."""
    return default.model_copy(update={
        "kernel": kernel, "assumed": list(ATTENTION_CONSTANTS), "fitted_on": None,
        "source": f"{kernel}: no row measures it; priced as {default.kernel} ({default.source}; fitted on "
                  f"{default.fitted_on or 'nothing'})"})
