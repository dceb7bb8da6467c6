"""Collective cost laws of the AWS p5 (8x H100, EFA) cluster, fitted on its own microbenchmarks.

Calibration data: ``validation/data/ultrascale_playbook_scaling_figures.csv``, the rows
``AllReduce/AllGather/ReduceScatter bandwidth (GB/s), 256MB message, median`` (HF Ultra-Scale
Playbook, ``pp_comm_bandwidth.html``: one 256 MB collective over all 8·k GPUs of k = 1..64 nodes
of the very cluster its training sweep ran on). Nothing of the training sweep is used here.

What is assumed (the figure does not say): the plotted GB/s is NCCL-tests *bus* bandwidth
(``bus_bytes / t`` with bus_bytes = 2(n-1)/n·S for all-reduce, (n-1)/n·S for all-gather and
reduce-scatter, ``collectives.BUS_FACTOR``), S = 256 MiB = 2^28 bytes, 10^9 bytes per GB.
So each point gives a time ``t(k) = bus_bytes(S, n = 8k) / busbw(k)``.

Law, per collective, across nodes (n = 8k ranks): ``t = steps(n)·alpha + bus_bytes/B`` with
``steps`` = 2(n-1) for all-reduce and n-1 for all-gather / reduce-scatter (``AlphaBeta``'s
``latency_per_step_us`` and ``bus_bandwidth_gb_per_s``). The Playbook's bandwidths fall ~1/n
from 2 to 64 nodes, which only a latency that grows with the ring length explains (a constant
alpha cannot: one message size, many node counts). (alpha, 1/B) come from a least-squares fit
of t, weighted by 1/t (relative error), on the 2-64 node points (6 per collective).

Inside one node (k = 1, n = 8) there is one point per collective, so only the bandwidth is
fitted: ``B = bus_bytes / (t - steps·alpha_nvlink)`` with the node's NVLink hop latency as the
per-step latency (an assumption, ~2% of the 256 MB time).

``python -m validation.calibrate_efa`` prints the laws, the fit per node count, and the YAML
block that ``hardware_specs/nodes/p5-h100-efa.yaml`` carries (tests check that they agree).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simulator.collectives import BUS_FACTOR, ring_steps

DATA = Path(__file__).resolve().parent / "data" / "ultrascale_playbook_scaling_figures.csv"
MESSAGE_BYTES = 2**28  # "256MB"
GPUS_PER_NODE = 8
FIGURES = {
    "all_reduce": "AllReduce bandwidth (GB/s), 256MB message, median",
    "all_gather": "AllGather bandwidth (GB/s), 256MB message, median",
    "reduce_scatter": "ReduceScatter bandwidth (GB/s), 256MB message, median",
}
FITTED_ON = ("validation/data/ultrascale_playbook_scaling_figures.csv: '{figure}' rows, nodes {nodes} "
             "(HF Ultra-Scale Playbook pp_comm_bandwidth.html, 8xH100 p5 nodes, EFA); fit by validation/calibrate_efa.py")


def bus_factor(collective: str, n: int) -> float:
    return BUS_FACTOR[collective](n)


@dataclass(frozen=True)
class Point:
    nodes: int
    busbw_gb_per_s: float

    def time_s(self, collective: str) -> float:
        n = self.nodes * GPUS_PER_NODE
        return bus_factor(collective, n) * MESSAGE_BYTES / (self.busbw_gb_per_s * 1e9)


@dataclass(frozen=True)
class Law:
    collective: str
    latency_per_step_us: float
    bus_bandwidth_gb_per_s: float
    fitted_on: str

    def time_s(self, n: int, payload_bytes: float = MESSAGE_BYTES) -> float:
        return (ring_steps(self.collective, n) * self.latency_per_step_us * 1e-6
                + bus_factor(self.collective, n) * payload_bytes / (self.bus_bandwidth_gb_per_s * 1e9))

    def busbw_gb_per_s(self, n: int) -> float:
        return bus_factor(self.collective, n) * MESSAGE_BYTES / self.time_s(n) / 1e9


def points(collective: str) -> list[Point]:
    frame = pd.read_csv(DATA)
    rows = frame[frame["experiment"] == FIGURES[collective]]
    return [Point(int(r["x"]), float(r["y"])) for r in rows.to_dict("records")]


def fit_inter_node(collective: str) -> Law:
    """Weighted least squares of t = steps·alpha + bus·beta over the multi-node points."""
    pts = [p for p in points(collective) if p.nodes > 1]
    xs, ys, ts = [], [], []
    for p in pts:
        n = p.nodes * GPUS_PER_NODE
        xs.append(ring_steps(collective, n))
        ys.append(bus_factor(collective, n) * MESSAGE_BYTES)
        ts.append(p.time_s(collective))
    # minimise sum ((x a + y b - t) / t)^2: normal equations of the 2x2 system
    sxx = sum((x / t) ** 2 for x, t in zip(xs, ts, strict=True))
    syy = sum((y / t) ** 2 for y, t in zip(ys, ts, strict=True))
    sxy = sum(x * y / t**2 for x, y, t in zip(xs, ys, ts, strict=True))
    sxt = sum(x / t for x, t in zip(xs, ts, strict=True))
    syt = sum(y / t for y, t in zip(ys, ts, strict=True))
    det = sxx * syy - sxy**2
    alpha = (sxt * syy - syt * sxy) / det
    beta = (syt * sxx - sxt * sxy) / det
    if alpha < 0 or beta <= 0:
        raise ValueError(f"{collective}: fit left the physical range (alpha {alpha}, beta {beta})")
    nodes = ",".join(str(p.nodes) for p in pts)
    return Law(collective, alpha * 1e6, 1 / beta / 1e9, FITTED_ON.format(figure=FIGURES[collective], nodes=nodes))


def fit_intra_node(collective: str, hop_latency_us: float) -> Law:
    """Bandwidth from the single-node point, per-step latency = the NVLink hop latency."""
    (p,) = [p for p in points(collective) if p.nodes == 1]
    n = GPUS_PER_NODE
    transfer = p.time_s(collective) - ring_steps(collective, n) * hop_latency_us * 1e-6
    bw = bus_factor(collective, n) * MESSAGE_BYTES / transfer / 1e9
    return Law(collective, hop_latency_us, bw, FITTED_ON.format(figure=FIGURES[collective], nodes="1"))


def laws(hop_latency_us: float = 3.0) -> tuple[dict[str, Law], dict[str, Law]]:
    """(intra-node laws, inter-node laws) for the three collectives."""
    return ({c: fit_intra_node(c, hop_latency_us) for c in FIGURES}, {c: fit_inter_node(c) for c in FIGURES})


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    intra, inter = laws()
    for name, group in (("intra-node (1 node, 8 GPUs)", intra), ("inter-node", inter)):
        print(f"== {name}")
        for law in group.values():
            print(f"{law.collective}: latency_per_step_us {law.latency_per_step_us:.2f}, "
                  f"bus_bandwidth_gb_per_s {law.bus_bandwidth_gb_per_s:.1f}")
            for p in points(law.collective):
                if (p.nodes == 1) != (group is intra):
                    continue
                pred = law.busbw_gb_per_s(p.nodes * GPUS_PER_NODE)
                print(f"   {p.nodes:3d} nodes: measured {p.busbw_gb_per_s:7.1f} GB/s, law {pred:7.1f} "
                      f"({100 * (pred / p.busbw_gb_per_s - 1):+.0f}%)")
    err = [abs(math.log(inter[c].busbw_gb_per_s(p.nodes * 8) / p.busbw_gb_per_s))
           for c in inter for p in points(c) if p.nodes > 1]
    print(f"inter-node fit: mean |log error| {sum(err) / len(err):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
