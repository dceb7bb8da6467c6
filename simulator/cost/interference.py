"""Closed form of a kernel and a collective that start together and slow each other.

While both run, the kernel progresses at 1/(1+s) (``overlap_compute_slowdown``: the
collective's kernels or threads take SMs / cores) and the collective at 1/(1+c)
(``overlap_comm_slowdown``: the kernel takes what the collective needs). The engine
(simulator/engine/engine.py) simulates exactly this when both are tasks; the planner's fused passes
use this formula for a collective overlapped with one known kernel.

With kernel work t_k and collective work t_c (each alone):
- the collective ends first when t_c·(1+c) <= t_k·(1+s): the pair takes
  t_k + t_c·(1+c)·s/(1+s);
- else the kernel ends first, at t_k·(1+s), and the pair takes t_c + t_k·(1+s)·c/(1+c).
With c = 0 this is max(t_c, t_k + t_c·s/(1+s)), the form used before ``c`` was modelled.
"""

from __future__ import annotations


def overlapped_pair_s(kernel_s: float, comm_s: float, compute_slowdown: float, comm_slowdown: float) -> float:
    """Seconds until both the kernel and the collective are done (see the module docstring)."""
    s, c = compute_slowdown, comm_slowdown
    if comm_s <= 0:
        return kernel_s
    if kernel_s <= 0:
        return comm_s
    if comm_s * (1 + c) <= kernel_s * (1 + s):
        return kernel_s + comm_s * (1 + c) * s / (1 + s)
    return comm_s + kernel_s * (1 + s) * c / (1 + c)


def exposed_comm_share(kernel_s: float, comm_s: float, compute_slowdown: float, comm_slowdown: float) -> float:
    """The pair's time beyond the kernel's own, as a share of the collective's isolated time."""
    if comm_s <= 0:
        return 1.0
    return max(0.0, overlapped_pair_s(kernel_s, comm_s, compute_slowdown, comm_slowdown) - kernel_s) / comm_s
