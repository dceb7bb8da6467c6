"""Collective cost laws of the AWS p5 (8x H100, EFA) cluster, fitted on its own measurements.

Calibration data, both in ``validation/data/ultrascale_playbook_scaling_figures.csv`` (HF
Ultra-Scale Playbook figures of the very cluster its training sweep ran on; no row of the sweep
is used):

1. ``AllReduce/AllGather/ReduceScatter bandwidth (GB/s), 256MB message, median``
   (``pp_comm_bandwidth.html``): one 256 MB collective over all 8·k GPUs of k = 1..64 nodes;
2. ``DP scaling`` (``dp_scaling.html``): nanotron training the 1B model with data parallelism
   alone (tp 1, pp 1, ZeRO-0, micro-batch 2, 256 sequences of 4096 tokens; micro-batch 1 at
   DP 256, the only way 256 sequences spread over 256 ranks) on 8..256 GPUs: tokens/s/GPU.

What is assumed (the figure does not say): the plotted GB/s is NCCL-tests *bus* bandwidth
(``bus_bytes / t`` with bus_bytes = 2(n-1)/n·S for all-reduce, (n-1)/n·S for all-gather and
reduce-scatter, ``collectives.BUS_FACTOR``), S = 256 MiB = 2^28 bytes, 10^9 bytes per GB.
So each point gives a time ``t(k) = bus_bytes(S, n = 8k) / busbw(k)``.

**Why the DP figure is needed.** The measured bus bandwidth falls from 362 (all-reduce) / 185
(all-gather) GB/s at 2 nodes to 33 / 11 GB/s at 64. One message size cannot tell *why*:

- (a) a per-ring-step latency that grows with the ring (t = steps(n)·alpha + bus/B, B constant;
  the previous law here: alpha 16-37 us, B 280-408 GB/s), under which large messages (a 5 GB
  gradient all-reduce) still move at B at any scale; or
- (b) a bandwidth that itself falls with the node count (congestion, the fabric's
  oversubscription), under which they move at the measured busbw(k).

Both reproduce the 256 MB points; they differ by up to 10x for gigabyte messages. The law kept
here has the 256 MB time of every node count exactly (``AlphaBeta.bus_bandwidth_by_nodes``,
B(k) = bus / (t(k) - steps·alpha)) and one per-step latency alpha shared by the three
collectives, from 0 (pure (b)) up to where some B(k) would become infinite (the most of (a)
the points allow). alpha is FITTED on the DP figure's multi-node points (least squares of log
tokens/s/GPU, with nanotron's profile ``validation/profiles/nanotron-p5-h100.yaml``: compute
fitted on single-node runs, a latency per inter-node call on the sweep's fit half, the two fits
taken in turn, validation/calibrate_frameworks.py fit_playbook_collective_latency), together with the one thing about nanotron the figure settles: whether its gradient
all-reduce is hidden behind the backward pass (``overlap_grad_reduce``). Measured (2026-12-03):
the figure wants alpha 2.64 us and an exposed all-reduce (errors within -3..+6% at 2-32 nodes);
the ring-latency law (a) with overlap, as before, gave +7..+35%.

Inside one node (k = 1, n = 8) there is one point per collective, so only the bandwidth is
fitted: ``B = bus_bytes / (t - steps·alpha_nvlink)`` with the node's NVLink hop latency as the
per-step latency (an assumption, ~2% of the 256 MB time).

``python -m validation.calibrate_efa [--write]`` prints the laws, the fit per node count, both
interpretations on the DP figure, and the YAML block that ``hardware_specs/nodes/p5-h100-efa.yaml``
carries (``--write`` puts it there; tests check that they agree).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simulator.cost.collectives import BUS_FACTOR, ring_steps

DATA = Path(__file__).resolve().parent / "data" / "ultrascale_playbook_scaling_figures.csv"
MESSAGE_BYTES = 2**28  # "256MB"
GPUS_PER_NODE = 8
FIGURES = {
    "all_reduce": "AllReduce bandwidth (GB/s), 256MB message, median",
    "all_gather": "AllGather bandwidth (GB/s), 256MB message, median",
    "reduce_scatter": "ReduceScatter bandwidth (GB/s), 256MB message, median",
}
DP_FIGURE = "DP scaling (1B model: DP=8 point equals 1B config MBS2/GBS256/ZeRO0 in sweep, 40,150 tok/s/gpu)"
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
    """t = steps(n)·latency_per_step + bus/B, B = ``bus_bandwidth_by_nodes`` at the group's node
    count where given (else ``bus_bandwidth_gb_per_s``): ``hardware_specs.schema.AlphaBeta``."""

    collective: str
    latency_per_step_us: float
    bus_bandwidth_gb_per_s: float
    fitted_on: str
    bus_bandwidth_by_nodes: dict[int, float] | None = None

    def bandwidth_gb_per_s(self, n: int) -> float:
        if not self.bus_bandwidth_by_nodes:
            return self.bus_bandwidth_gb_per_s
        return self.spec(digits=None).bandwidth_gb_per_s(max(1, n // GPUS_PER_NODE))

    def time_s(self, n: int, payload_bytes: float = MESSAGE_BYTES) -> float:
        return (ring_steps(self.collective, n) * self.latency_per_step_us * 1e-6
                + bus_factor(self.collective, n) * payload_bytes / (self.bandwidth_gb_per_s(n) * 1e9))

    def busbw_gb_per_s(self, n: int) -> float:
        return bus_factor(self.collective, n) * MESSAGE_BYTES / self.time_s(n) / 1e9

    def spec(self, digits: int | None = 1):
        """The law as the node spec's ``AlphaBeta`` (GB/s rounded to ``digits``, as the YAML has them)."""
        from hardware_specs.schema import AlphaBeta

        def r(value: float, places: int | None) -> float:
            return value if places is None else round(value, places)

        return AlphaBeta(latency_us=0, latency_per_step_us=r(self.latency_per_step_us, None if digits is None else 2),
                         bus_bandwidth_gb_per_s=r(self.bus_bandwidth_gb_per_s, digits),
                         bus_bandwidth_by_nodes=({k: r(v, digits) for k, v in self.bus_bandwidth_by_nodes.items()}
                                                 if self.bus_bandwidth_by_nodes else None),
                         fitted_on=self.fitted_on)


def points(collective: str) -> list[Point]:
    frame = pd.read_csv(DATA)
    rows = frame[frame["experiment"] == FIGURES[collective]]
    return [Point(int(r["x"]), float(r["y"])) for r in rows.to_dict("records")]


def _multi_node(collective: str) -> list[Point]:
    return [p for p in points(collective) if p.nodes > 1]


def fit_ring_latency_law(collective: str) -> Law:
    """Interpretation (a): weighted least squares of t = steps·alpha + bus·beta over the
    multi-node points, one bandwidth for every node count (kept for comparison)."""
    pts = _multi_node(collective)
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


def max_latency_per_step_us() -> float:
    """The largest per-step latency the 256 MB points allow: beyond it some point's time is all
    latency (its bandwidth would be infinite)."""
    return min(p.time_s(c) / ring_steps(c, p.nodes * GPUS_PER_NODE) * 1e6 for c in FIGURES for p in _multi_node(c))


def fit_inter_node(collective: str, latency_per_step_us: float) -> Law:
    """The law with ``latency_per_step_us`` per ring step and, per node count, the bandwidth that
    gives the measured 256 MB time exactly: B(k) = bus / (t(k) - steps·alpha)."""
    if not 0 <= latency_per_step_us < max_latency_per_step_us():
        raise ValueError(f"latency_per_step_us must be in [0, {max_latency_per_step_us():.2f}), got {latency_per_step_us}")
    pts = _multi_node(collective)
    table = {}
    for p in pts:
        n = p.nodes * GPUS_PER_NODE
        transfer = p.time_s(collective) - ring_steps(collective, n) * latency_per_step_us * 1e-6
        table[p.nodes] = bus_factor(collective, n) * MESSAGE_BYTES / transfer / 1e9
    nodes = ",".join(str(p.nodes) for p in pts)
    fitted_on = (FITTED_ON.format(figure=FIGURES[collective], nodes=nodes)
                 + f"; latency per step fitted on the '{DP_FIGURE}' rows")
    return Law(collective, latency_per_step_us, table[min(table)], fitted_on, table)


def fit_intra_node(collective: str, hop_latency_us: float) -> Law:
    """Bandwidth from the single-node point, per-step latency = the NVLink hop latency."""
    (p,) = [p for p in points(collective) if p.nodes == 1]
    n = GPUS_PER_NODE
    transfer = p.time_s(collective) - ring_steps(collective, n) * hop_latency_us * 1e-6
    bw = bus_factor(collective, n) * MESSAGE_BYTES / transfer / 1e9
    return Law(collective, hop_latency_us, bw, FITTED_ON.format(figure=FIGURES[collective], nodes="1"))


# --------------------------------------------------------------------------- the DP scaling figure


def dp_scaling_points() -> list[tuple[int, float]]:
    """(data-parallel size, tokens/s/GPU) of the Playbook's DP scaling figure."""
    frame = pd.read_csv(DATA)
    rows = frame[frame["experiment"] == DP_FIGURE]
    return [(int(r["x"]), float(r["y"])) for r in rows.to_dict("records")]


def dp_scaling_scenario(dp: int, inter: dict[str, Law], overlap_grad_reduce: bool) -> dict:
    """The figure's run on ``dp`` GPUs (1B, tp 1, pp 1, ZeRO-0, 256 sequences of 4096, micro-batch
    2, or 1 where 256 sequences allow no more) as a scenario mapping: the Playbook sweep's mapping
    (validation/layout_ranking.py ultrascale_case, with nanotron's fitted profile) on a p5 node
    whose inter-node laws are ``inter`` (plus the profile's fitted latency per call, if any: it and
    the per-step latency here are fitted in turn, validation/calibrate_frameworks.py
    fit_playbook_collective_latency)."""
    import validation.layout_ranking as lr

    row = {"model": "1B", "nodes": dp // GPUS_PER_NODE, "gpus": dp, "dp": dp, "tp": 1, "pp": 1, "zero_stage": 0,
           "micro_batch_size": lr.dp_figure_micro_batch(dp), "global_batch_size_seqs": lr.DP_FIGURE_GLOBAL_BATCH,
           "seq_len": 4096,
           "status": "ok", "tokens_per_sec_per_gpu": math.nan, "mfu_pct": math.nan, "gpu_memory_GB": math.nan}
    profile = lr.load_profile(lr.ULTRASCALE_PROFILE)
    raw = lr.ultrascale_case(0, row, profile).raw
    node = lr.profiled_node(lr.ULTRASCALE_NODE, profile.compute_efficiency if profile else None,
                            {"inter_node_collectives": {}})
    laws = {c: law.spec().model_dump(exclude_none=True) for c, law in inter.items()}
    # nanotron's fitted latency per call (profile node_overrides) rides on top, as in the sweep's mapping
    extra = ((profile.node_overrides or {}).get("inter_node_collectives") or {}) if profile else {}
    node["inter_node_collectives"] = lr._merged(laws, {c: v for c, v in extra.items() if c in laws})
    raw["cluster"]["node"] = node
    raw["parallelism"]["overlap_grad_reduce"] = overlap_grad_reduce
    return raw


def predict_dp_scaling(inter: dict[str, Law], overlap_grad_reduce: bool) -> list[tuple[int, float, float]]:
    """(dp, measured, predicted tokens/s/GPU) for the figure's multi-node points."""
    from simulator.simulate import simulate_point

    out = []
    for dp, measured in dp_scaling_points():
        if dp <= GPUS_PER_NODE:
            continue
        result = simulate_point(dp_scaling_scenario(dp, inter, overlap_grad_reduce))
        out.append((dp, measured, result["tokens_per_s"] / result["num_gpus"]))
    return out


@dataclass(frozen=True)
class DpFit:
    """The per-step latency and gradient-overlap setting that fit the DP scaling figure."""

    latency_per_step_us: float
    overlap_grad_reduce: bool
    loss: float                                  # mean squared log error over the figure's multi-node points
    rows: list[tuple[int, float, float]]          # (dp, measured, predicted) at the fit
    alternatives: dict[str, float]                # loss of every other candidate, by name


def _dp_loss(rows: list[tuple[int, float, float]]) -> float:
    return sum(math.log(p / m) ** 2 for _, m, p in rows) / len(rows)


def fit_latency_on_dp_scaling() -> DpFit:
    """Bounded 1-D fit of the shared per-step latency, for each overlap setting; the better wins.
    Also scores interpretation (a), the ring-latency law, for the report."""
    from scipy.optimize import minimize_scalar

    upper = 0.999 * max_latency_per_step_us()

    def inter_at(alpha: float) -> dict[str, Law]:
        return {c: fit_inter_node(c, alpha) for c in FIGURES}

    fits = {}
    for overlap in (True, False):
        res = minimize_scalar(lambda a, o=overlap: _dp_loss(predict_dp_scaling(inter_at(a), o)),
                              bounds=(0.0, upper), method="bounded", options={"xatol": 0.01})
        fits[overlap] = (float(res.x), float(res.fun))
    overlap = min(fits, key=lambda o: fits[o][1])
    alpha = round(fits[overlap][0], 2)
    rows = predict_dp_scaling(inter_at(alpha), overlap)
    ring = {c: fit_ring_latency_law(c) for c in FIGURES}
    alternatives = {f"bandwidth by nodes, overlap_grad_reduce={not overlap} (alpha {fits[not overlap][0]:.2f} us)":
                    fits[not overlap][1]}
    for o in (True, False):
        alternatives[f"ring-latency law (a), overlap_grad_reduce={o}"] = _dp_loss(predict_dp_scaling(ring, o))
    return DpFit(alpha, overlap, _dp_loss(rows), rows, alternatives)


def laws(hop_latency_us: float = 3.0, latency_per_step_us: float | None = None) -> tuple[dict[str, Law], dict[str, Law]]:
    """(intra-node laws, inter-node laws) for the three collectives; the inter-node per-step
    latency fitted on the DP scaling figure unless given."""
    if latency_per_step_us is None:
        latency_per_step_us = fit_latency_on_dp_scaling().latency_per_step_us
    return ({c: fit_intra_node(c, hop_latency_us) for c in FIGURES},
            {c: fit_inter_node(c, latency_per_step_us) for c in FIGURES})


NODE_YAML = Path(__file__).resolve().parents[1] / "hardware_specs" / "nodes" / "p5-h100-efa.yaml"
_FIGURE_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}


def node_yaml_block(inter: dict[str, Law]) -> str:
    """The ``inter_node_collectives`` block of the node spec for the laws ``inter``."""
    lines = ["inter_node_collectives:"]
    for c, law in inter.items():
        spec = law.spec()
        table = ", ".join(f"{k}: {v}" for k, v in spec.bus_bandwidth_by_nodes.items())
        lines += [f"  {c}:", "    latency_us: 0",
                  f"    latency_per_step_us: {spec.latency_per_step_us}        # fitted on the Playbook's DP scaling figure (see header)",
                  f"    bus_bandwidth_gb_per_s: {spec.bus_bandwidth_gb_per_s}       # = the 2-node entry (unused while the table is given)",
                  f"    bus_bandwidth_by_nodes: {{{table}}}",
                  '    source: "HF Ultra-Scale Playbook microbenchmark (pp_comm_bandwidth.html), 2-64 nodes, and DP scaling '
                  'figure (dp_scaling.html)"',
                  f'    fitted_on: "validation/data/ultrascale_playbook_scaling_figures.csv: \'{_FIGURE_NAMES[c]} bandwidth (GB/s), '
                  "256MB message, median' rows, nodes 2,4,8,16,32,64 (bandwidth per node count); 'DP scaling' rows, "
                  'DP 16-256 (latency per step); validation/calibrate_efa.py"']
    return "\n".join(lines) + "\n"


def write_node_yaml(inter: dict[str, Law], path: Path = NODE_YAML) -> None:
    """Replace the node spec's ``inter_node_collectives`` block (up to ``host_memory_gib``)."""
    text = path.read_text()
    start, end = text.index("inter_node_collectives:"), text.index("host_memory_gib")
    path.write_text(text[:start] + node_yaml_block(inter) + text[end:])


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="rewrite inter_node_collectives in hardware_specs/nodes/p5-h100-efa.yaml")
    args = parser.parse_args(argv)
    dp = fit_latency_on_dp_scaling()
    intra, inter = laws(latency_per_step_us=dp.latency_per_step_us)
    print(f"== DP scaling figure (1B, tp 1, pp 1): latency per step {dp.latency_per_step_us:.2f} us, "
          f"overlap_grad_reduce {dp.overlap_grad_reduce}, mean squared log error {dp.loss:.4f}")
    for d, measured, predicted in dp.rows:
        print(f"   DP {d:4d}: measured {measured:8.0f} tokens/s/GPU, predicted {predicted:8.0f} "
              f"({100 * (predicted / measured - 1):+.1f}%)")
    for name, loss in dp.alternatives.items():
        print(f"   instead: {name}: mean squared log error {loss:.4f}")
    for name, group in (("intra-node (1 node, 8 GPUs)", intra), ("inter-node", inter)):
        print(f"== {name}")
        for law in group.values():
            print(f"{law.collective}: latency_per_step_us {law.latency_per_step_us:.2f}, "
                  f"bus_bandwidth_gb_per_s {law.bus_bandwidth_gb_per_s:.1f}"
                  + (f", bus_bandwidth_by_nodes {law.spec().bus_bandwidth_by_nodes}" if law.bus_bandwidth_by_nodes else ""))
            for p in points(law.collective):
                if (p.nodes == 1) != (group is intra):
                    continue
                pred = law.busbw_gb_per_s(p.nodes * GPUS_PER_NODE)
                print(f"   {p.nodes:3d} nodes: measured {p.busbw_gb_per_s:7.1f} GB/s, law {pred:7.1f} "
                      f"({100 * (pred / p.busbw_gb_per_s - 1):+.0f}%)")
    print("== hardware_specs/nodes/p5-h100-efa.yaml")
    print(node_yaml_block(inter))
    if args.write:
        write_node_yaml(inter)
        print(f"wrote {NODE_YAML}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
