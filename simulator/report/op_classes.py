"""Measured vs simulated time per *op class* of one step (``clustersim compare --op-classes``).

:mod:`simulator.report.compare` sets compute, optimizer and communication side by side; this
splits the work further, into the classes a CPU step's error comes from:

- ``gemm_forward`` / ``gemm_backward``: matrix multiplies (``aten::mm``, ``addmm``, ``bmm``);
  backward is what the autograd engine runs;
- ``attention``: the fused attention kernels (``scaled_dot_product_attention`` and what runs
  inside it); simulated: QKᵀ, softmax and AV;
- ``cross_entropy``: log-softmax and NLL loss, forward and backward;
- ``elementwise_norm``: every other ``aten::`` op that does work (GELU, LayerNorm, adds,
  copies, fills, reductions, embedding);
- ``optimizer``: all that runs inside ``Optimizer.step`` / ``zero_grad``;
- ``framework``: the self time of view ops, autograd nodes and module wrappers (not of wrappers
  named after a collective, ``FSDP::all_gather``, or that issued one, a tensor-parallel autograd
  function calling ``all_reduce``: their self time is the wait, left out), and
  ``python_between_ops``: the part of the step no op of that thread covers (the Python between
  ops; on a pipeline stage also its waits for the other stage).
  The simulator has no such classes: it charges ``kernel_launch_overhead_us`` inside each kernel.

Measured times are *self* times (an op's duration less its children's) on the busiest thread of a
host trace (gloo / CPU), summed per step and averaged over the profiled steps; communication ops
are left out (``compare`` reports them). A trace with device events is not split (the classes
describe the host's work). The profiler adds ~1 us per op it records, most visible in
``framework``. Source of the classes: the 2026-12-06 diagnosis of the harness's under-prediction
(validation/harness/README.md), where they showed the memory-bound kernels priced at half their
time and the GEMMs right.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError
from simulator.report.compare import _COMM_PATTERNS, DEVICE_CATS, _steps, comm_kind, load_trace

OP_CLASSES = ("gemm_forward", "gemm_backward", "attention", "cross_entropy", "elementwise_norm", "optimizer",
              "framework", "python_between_ops")
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
# ops that move no data of their own (views, allocation, dispatch wrappers): their self time is framework
NO_WORK = re.compile(
    r"^aten::(view|_unsafe_view|reshape|_reshape_alias|t|transpose|permute|expand|expand_as|as_strided|squeeze|"
    r"unsqueeze|select|slice|narrow|split|split_with_sizes|chunk|unbind|detach|alias|resolve_conj|resolve_neg|"
    r"contiguous|empty|empty_like|empty_strided|new_empty|new_empty_strided|result_type|lift_fresh|to|_to_copy|"
    r"linear|matmul|scaled_dot_product_attention|cross_entropy_loss|layer_norm|embedding|dropout|zeros|zeros_like|"
    r"ones_like|zero_|arange|clamp)$")
ATTENTION = re.compile(r"scaled_dot_product|ScaledDotProduct|flash_attention|efficient_attention", re.I)
CROSS_ENTROPY = re.compile(r"log_softmax|nll_loss|LogSoftmax|NllLoss|cross_entropy", re.I)


def _class_of(name: str, ancestors: list[str]) -> str | None:
    """The class of an op's self time (None: communication, reported by ``compare``)."""
    chain = ancestors + [name]
    if any(comm_kind(a) for a in chain):
        return None
    if not name.startswith("aten::") and any(p.search(name) for _, p in _COMM_PATTERNS):
        return None  # a wrapper named after a collective (FSDP::all_gather): its self time is the wait
    if any(a.startswith("Optimizer.") or "fused_adam" in a for a in chain):
        return "optimizer"
    backward = any(a.startswith("autograd::engine") for a in chain)
    if name in GEMM_OPS:
        return "gemm_backward" if backward else "gemm_forward"
    if any(ATTENTION.search(a) for a in chain):
        return "attention" if name.startswith("aten::") and not NO_WORK.match(name) else "framework"
    if any(CROSS_ENTROPY.search(a) for a in chain) and name.startswith("aten::") and not NO_WORK.match(name):
        return "cross_entropy"
    if name.startswith("aten::") and not NO_WORK.match(name):
        return "elementwise_norm"
    return "framework"


def _self_times(ops: list[dict], window_end: float) -> list[tuple[str, list[str], float, bool, float]]:
    """(name, ancestors' names, self time, issued a collective, time it covers as a top-level op)
    for ops sorted by start, longest first on ties: an op's self time is its duration less its
    children's."""
    stack: list[list] = []  # [name, end, self_us, issued a collective, top-level cover]
    done: list[tuple[str, list[str], float, bool, float]] = []

    def close(entry: list) -> None:
        done.append((entry[0], [x[0] for x in stack], entry[2], entry[3], entry[4]))
        if stack and (entry[3] or comm_kind(entry[0])):
            stack[-1][3] = True

    for e in ops:
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        while stack and stack[-1][1] <= s:
            close(stack.pop())
        cover = 0.0
        if stack:
            stack[-1][2] -= min(t, stack[-1][1]) - s
        else:
            cover = min(t, window_end) - s
        stack.append([str(e["name"]), t, t - s, False, cover])
    while stack:
        close(stack.pop())
    return done


def measured_op_classes(path: str | Path, step: int | None = None) -> dict[str, float]:
    """Seconds per step in each class of :data:`OP_CLASSES`, from a host (CPU) profiler trace."""
    doc = load_trace(path)
    events = doc["_complete"]
    if any(e.get("cat") in DEVICE_CATS for e in events):
        raise ConfigError("--op-classes", "the trace has device events: op classes split a host (CPU) trace only")
    ops = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation")
           and not str(e.get("name", "")).startswith("ProfilerStep")]
    if not ops:
        raise ConfigError("--trace", f"{path}: no cpu_op events")
    load: dict[Any, float] = {}
    for e in ops:
        if e.get("cat") == "cpu_op":
            load[e.get("tid")] = load.get(e.get("tid"), 0.0) + float(e["dur"])
    if not load:
        raise ConfigError("--trace", f"{path}: no cpu_op events")
    main = max(load, key=load.get)
    windows = _steps(events)
    if step is not None:
        windows = [w for w in windows if w[0] == f"ProfilerStep#{step}"]
        if not windows:
            raise ConfigError("--step", f"ProfilerStep#{step} is not in the trace")
    if not windows:
        lo = min(float(e["ts"]) for e in ops)
        windows = [("whole trace", lo, max(float(e["ts"]) + float(e["dur"]) for e in ops))]
    mine = sorted((e for e in ops if e.get("tid") == main), key=lambda e: (float(e["ts"]), -float(e["dur"])))
    totals = dict.fromkeys(OP_CLASSES, 0.0)
    for _, lo, hi in windows:
        inside = [e for e in mine if lo <= float(e["ts"]) < hi]
        covered = 0.0
        for name, ancestors, self_us, issued, top_us in _self_times(inside, hi):
            covered += top_us
            # a wrapper that issued a collective (an autograd function calling all_reduce, FSDP's
            # post-backward reduce): its time beyond its children is the wait for it
            cls = None if issued and not name.startswith("aten::") else _class_of(name, ancestors)
            if cls is not None:
                totals[cls] += max(self_us, 0.0) * 1e-6
        totals["python_between_ops"] += max(hi - lo - covered, 0.0) * 1e-6
    return {k: v / len(windows) for k, v in totals.items()}


_SIM_GEMM = re.compile(r"\.(wgrad|dgrad)$")


def simulated_op_classes(result, rank_class: str) -> dict[str, float]:
    """Seconds of the simulated step in each class (one rank class; its compute and optimizer events)."""
    totals = dict.fromkeys(OP_CLASSES, 0.0)
    for e in result.timeline:
        if e.rank_class != rank_class or e.category not in ("compute", "recompute", "optimizer"):
            continue
        name, dur = e.name, e.end_s - e.start_s
        flops = float(dict(e.args).get("flops", 0.0) or 0.0)
        if e.category == "optimizer" or name.startswith("optimizer"):
            cls = "optimizer"
        elif re.search(r"attn_scores|attn_values|softmax|attention|flash", name):
            cls = "attention"
        elif "cross_entropy" in name:
            cls = "cross_entropy"
        elif _SIM_GEMM.search(name):
            cls = "gemm_backward"
        elif name.startswith("F.") and flops > 0:
            cls = "gemm_forward"
        elif name.startswith("B.") and flops > 0:
            cls = "gemm_backward"
        else:
            cls = "elementwise_norm"
        totals[cls] += dur
    return totals


def op_class_rows(measured: dict[str, float], simulated: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for cls in OP_CLASSES:
        mv, sv = measured.get(cls, 0.0), simulated.get(cls, 0.0)
        if mv == 0.0 and sv == 0.0:
            continue
        rows.append({"op_class": cls, "measured_s": mv, "simulated_s": sv,
                     "relative_error": (sv - mv) / mv if mv > 0 else None})
    return rows
