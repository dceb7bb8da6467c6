"""Calibrate collectives across nodes (EFA, GPUDirect-TCPXO) on the multi-node rows of public sweeps.

Data: ``data/microbench/collectives_bandwidth.csv`` (caveats in ``data/microbench/SOURCE_README.md``),
rows measured over more than one node: the AWS p6-b200 4-node all_reduce sweep (ml-engineering's
``all_reduce_bench.py``, torch.distributed: busbw only, the framework's call overhead included), the
AWS p5en 4-node 4 GiB all_reduce under NCCL's default, forced ring and forced NVLS-tree, and a 2-node
GCP A3 Mega nccl-tests sweep (third party, tuning unknown). The time of a row is its NCCL-tests bus
volume over its busbw. Held out, as inside the node, when the md5 of the row's key is odd.

Model (simulator/cost/collectives.py, the code the simulator runs): the node's NICs
(``nics_per_node`` x ``nic_bandwidth_gbit_per_s`` x ``nic_efficiency``) carry a ring's bus volume or a
double binary tree's 2·S (S over two nodes), NVLink the node-local share; latency is the ring's network
steps (2k for an all-reduce, as NCCL's tuner counts them; the other 2(n-1)-2k steps at NVLink's latency)
or 2·ceil(log2 k) tree levels of ``nic_latency_us`` plus the fabric's switches (the catalog ``fat-tree``,
which a scenario gets by default), and the same algorithms also run on NCCL's low-latency protocol
(``nic_low_latency_efficiency`` / ``nic_low_latency_us``); on a node with NVLS (H200, B200, GB200) NVLSTree
is a candidate as well (the node's NVLS law inside, the tree's bytes between nodes), as in the simulator,
which passes the node's NVLS law the same way. NCCL's choice is the fastest; a forced ``NCCL_ALGO`` keeps that
algorithm (``allreduce:nvlstree`` is NVLSTree, ``allreduce:tree`` the plain tree). Fitted per system (least squares on log time, scipy) on the fit
half: the NIC efficiency, and where the fit rows span several sizes the per-hop latency and the
low-latency line; what the rows cannot fix is carried from another node of the same transport and
says so in ``nic_fitted_on``.

Rows set aside (listed with their errors, never dropped silently): a row that takes more than
``NOT_MONOTONE`` times as long as a larger message of the same sweep. A collective of fewer bytes does
not take longer in steady state; the largest repeat spread in the data (A3 Mega out-of-place vs
in-place, 1 KiB) is 16%, so a 25% inversion is a warm-up or measurement artefact, not noise.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd
from scipy.optimize import least_squares

from hardware_specs.catalog import FABRICS, NODES
from hardware_specs.schema import Node
from simulator.cost.collectives import bus_bytes, collective_cost
from simulator.cost.topology import Placement, Topology

CSV = Path(__file__).parent / "data" / "microbench" / "collectives_bandwidth.csv"
LABEL = "validation/data/microbench/collectives_bandwidth.csv rows "
FABRIC = "fat-tree"
# system column prefix -> the catalog node whose network block the rows fit
CROSS_SYSTEMS = {"AWS p6-b200": "p6-b200", "AWS p5en": "p5en-h200", "GCP A3 Mega": "a3-mega-h100"}
CROSS_NODES = frozenset(CROSS_SYSTEMS.values())
# what a node's own rows cannot fix (one message size: no latency, no protocol switch) comes from a node on
# the same transport
LATENCY_FROM = {"p5en-h200": "p6-b200"}
NOT_MONOTONE = 1.25
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")


def is_heldout(key: str) -> bool:
    """The split of validation/layout_ranking.py, here and in validation/calibrate_collectives.py."""
    return int(hashlib.md5(key.encode()).hexdigest(), 16) % 2 == 1


@dataclass(frozen=True)
class CrossRow:
    key: str
    row: int                 # 1-based line of the CSV (header = line 1)
    node: str
    collective: str
    algorithm: str | None    # "ring" / "tree" where NCCL_ALGO forced it; None: NCCL's choice
    num_nodes: int
    gpus_per_node: int
    message_bytes: float
    busbw_gb_per_s: float
    set_aside: str | None = None

    @property
    def heldout(self) -> bool:
        return is_heldout(self.key)

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    time_us: float | None = None   # nccl-tests' own time where the row gives it (busbw is rounded)

    @property
    def time_s(self) -> float:
        if self.time_us is not None:
            return self.time_us * 1e-6
        return bus_bytes(self.collective, self.message_bytes, self.gpus) / (self.busbw_gb_per_s * 1e9)


def _algorithm(algo: str) -> str | None:
    text = algo.lower()
    if "nccl_algo=allreduce:ring" in text:
        return "ring"
    if "nccl_algo=allreduce:nvlstree" in text:
        return "nvls_tree"
    if "nccl_algo=allreduce:tree" in text:
        return "tree"
    return None


@cache
def cross_rows() -> tuple[CrossRow, ...]:
    """Every measured multi-node row of a known system, set-aside rows marked with their reason."""
    df = pd.read_csv(CSV)
    out = []
    for i, r in df.iterrows():
        node = next((n for prefix, n in CROSS_SYSTEMS.items() if str(r.system).startswith(prefix)), None)
        try:
            size, busbw, gpn, k = (float(r.message_bytes), float(r.busbw_gb_per_s), int(r.gpus_per_node),
                                   int(r.num_nodes))
        except (TypeError, ValueError):
            continue
        if (node is None or k < 2 or r.collective not in COLLECTIVES or r.measurement_type != "measured"
                or not (math.isfinite(size) and math.isfinite(busbw))):
            continue
        key = f"{r.gpu}|{r.system}|{k}x{gpn}|{r.collective}|{r.algo}|{int(size)}"
        time_us = float(r.time_us) if math.isfinite(float(r.time_us)) else None
        out.append(CrossRow(key, int(i) + 2, node, r.collective, _algorithm(r.algo), k, gpn, size, busbw,
                            time_us=time_us))
    marked = []
    for row in out:
        larger = [o for o in out if (o.node, o.algorithm, o.collective, o.gpus) == (row.node, row.algorithm,
                                                                                   row.collective, row.gpus)
                  and o.message_bytes > row.message_bytes]
        fastest = min(larger, key=lambda o: o.time_s, default=None)
        if fastest is not None and row.time_s > NOT_MONOTONE * fastest.time_s:
            reason = (f"{row.time_s * 1e6:.0f} us, {row.time_s / fastest.time_s:.1f}x the "
                      f"{fastest.time_s * 1e6:.0f} us of {int(fastest.message_bytes)} B (row {fastest.row}) in the "
                      f"same sweep: not monotone in size past the data's repeat spread")
            row = CrossRow(**{**row.__dict__, "set_aside": reason})
        marked.append(row)
    return tuple(marked)


def with_network(node: Node, efficiency: float, latency_us: float, ll_efficiency: float | None,
                 ll_latency_us: float | None) -> Node:
    return node.model_copy(update={"nic_efficiency": efficiency, "nic_latency_us": latency_us,
                                   "nic_low_latency_efficiency": ll_efficiency, "nic_low_latency_us": ll_latency_us})


def predicted(node: Node, row: CrossRow) -> tuple[float, str]:
    """(seconds, algorithm) the simulator gives ``row`` on ``node`` (on the catalog fat tree)."""
    links = Topology(node, FABRICS.get(FABRIC), row.gpus).links
    placement = Placement(tuple(range(row.gpus)), row.gpus_per_node, row.num_nodes, 1)
    cost = collective_cost(row.collective, row.message_bytes, placement, links, node.intra_laws,
                           node.inter_node_collectives, node.nvls_all_reduce, algorithm=row.algorithm)
    return cost.isolated_time_s(links), cost.algorithm


@dataclass(frozen=True)
class CrossFit:
    node: str
    efficiency: float
    latency_us: float
    ll_efficiency: float | None
    ll_latency_us: float | None
    rows: tuple[int, ...]
    latency_from: str | None     # the node the latency (and low-latency line) were carried from


@cache
def cross_fit(node_name: str) -> CrossFit:
    node = NODES.get(node_name)
    fit_rows = [r for r in cross_rows() if r.node == node_name and not r.heldout and r.set_aside is None]
    sizes = {r.message_bytes for r in fit_rows}
    if len(sizes) >= 4:
        x0, lo, hi = [0.9, 20.0, 0.3, 10.0], [0.05, 0.0, 0.005, 0.0], [1.0, 1000.0, 1.0, 1000.0]
        source = None

        def spec(p):
            return with_network(node, *p)
    else:  # one size: the bandwidth only; latency and protocol line from a node on the same transport
        source = LATENCY_FROM[node_name]
        other = cross_fit(source)
        x0, lo, hi = [0.9], [0.05], [1.0]

        def spec(p):
            return with_network(node, p[0], other.latency_us, other.ll_efficiency, other.ll_latency_us)

    def residuals(p):
        node_p = spec(p)
        return [math.log(predicted(node_p, r)[0] / r.time_s) for r in fit_rows]

    p = [float(f"{v:.4g}") for v in least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0).x]
    fitted = spec(p)
    return CrossFit(node_name, fitted.nic_efficiency, fitted.nic_latency_us, fitted.nic_low_latency_efficiency,
                    fitted.nic_low_latency_us, tuple(r.row for r in fit_rows), source)


def fitted_node(node_name: str) -> Node:
    f = cross_fit(node_name)
    return with_network(NODES.get(node_name), f.efficiency, f.latency_us, f.ll_efficiency, f.ll_latency_us)


def cross_node_block(node_name: str) -> dict:
    """The network fields of ``node_name``'s generated block."""
    f = cross_fit(node_name)
    fitted_on = LABEL + ",".join(map(str, f.rows)) + f" (on the catalog {FABRIC} fabric"
    if f.latency_from:
        fitted_on += (f"; nic_efficiency only, at one size: nic_latency_us and the low-latency line "
                      f"(transferred from {f.latency_from}: same transport; not measured on this node)")
    out = {"nic_efficiency": f.efficiency, "nic_latency_us": f.latency_us}
    if f.ll_efficiency is not None:
        out |= {"nic_low_latency_efficiency": f.ll_efficiency, "nic_low_latency_us": f.ll_latency_us}
    out["nic_fitted_on"] = fitted_on + "; validation/calibrate_collectives.py)"
    return out


def cross_table(heldout: bool = True) -> pd.DataFrame:
    """Rows predicted with the fitted network on the catalog node: the held-out half (set-aside rows too,
    marked), or every row with ``heldout=False``."""
    out = []
    for r in cross_rows():
        if heldout and not r.heldout:
            continue
        t, algorithm = predicted(fitted_node(r.node), r)
        measured = bus_bytes(r.collective, r.message_bytes, r.gpus) / r.time_s / 1e9
        pred = bus_bytes(r.collective, r.message_bytes, r.gpus) / t / 1e9
        out.append({"row": r.row, "node": r.node, "nodes": r.num_nodes, "gpus": r.gpus,
                    "forced": r.algorithm or "-", "ran": algorithm, "message_bytes": int(r.message_bytes),
                    "measured_busbw": round(measured, 3), "predicted_busbw": round(pred, 3),
                    "error": pred / measured - 1, "set_aside": r.set_aside or ""})
    return pd.DataFrame(out)


def cross_heldout_table() -> pd.DataFrame:
    return cross_table(heldout=True)


# Tolerances on the held-out half, rows not set aside (tests/test_collectives_cross.py holds the same).
CROSS_MEDIAN, CROSS_WORST, CROSS_LARGE = 0.08, 0.30, 0.15


def tolerance_misses(table: pd.DataFrame, median: float, worst: float, large: float, label: str = "") -> list[str]:
    """The held-out figures of ``table`` (columns ``error``, ``message_bytes``) past their tolerances:
    median and max |error| over every row, and max |error| over rows of 64 MiB or more (empty: met).
    Shared by the intra-node calibration (validation/calibrate_collectives.py)."""
    errors = table.error.abs()
    out = []
    if errors.median() > median:
        out.append(f"{label}median |error| {errors.median():.1%} > {median:.0%}")
    if errors.max() > worst:
        out.append(f"{label}max |error| {errors.max():.1%} > {worst:.0%}")
    big = table[table.message_bytes >= 2**26].error.abs()
    if len(big) and big.max() > large:
        out.append(f"{label}max |error| at >= 64 MiB {big.max():.1%} > {large:.0%}")
    return out


def cross_misses(table: pd.DataFrame) -> list[str]:
    return tolerance_misses(table[table.set_aside == ""], CROSS_MEDIAN, CROSS_WORST, CROSS_LARGE, "cross-node ")


def _line_busbw(pair: list[CrossRow], row: CrossRow) -> float:
    """Bus bandwidth at ``row``'s size on the α-β line t = a + S·b through the two rows of ``pair``."""
    (s0, t0), (s1, t1) = ((r.message_bytes, r.time_s) for r in pair)
    t = t0 + (t1 - t0) / (s1 - s0) * (row.message_bytes - s0)
    return bus_bytes(row.collective, row.message_bytes, row.gpus) / t / 1e9


def sweep_lines(row: CrossRow) -> dict[str, tuple[tuple[int, ...], float]]:
    """What ``row``'s own sweep says at its size, from fit rows only: every algorithm and protocol is an α-β
    line in the message size, so the line through the two fit rows just below it (``below``) and the two just
    above it (``above``) of the same sweep (node, forced algorithm, collective, GPUs), each at the row's size
    (bus bandwidth, GB/s). A choice of the fastest line (NCCL's tuner model, and this one) makes time concave in
    size: a row on a slower line than the one its sweep takes above it is a choice the tuner made by its size
    regions, not by speed. Empty where the sweep has no two fit rows on either side."""
    same = sorted((o for o in cross_rows() if (o.node, o.algorithm, o.collective, o.gpus)
                   == (row.node, row.algorithm, row.collective, row.gpus) and not o.heldout and o.set_aside is None),
                  key=lambda o: o.message_bytes)
    out = {}
    below = [o for o in same if o.message_bytes < row.message_bytes][-2:]
    above = [o for o in same if o.message_bytes > row.message_bytes][:2]
    for name, pair in (("below", below), ("above", above)):
        if len(pair) == 2:
            out[name] = (tuple(o.row for o in pair), _line_busbw(pair, row))
    return out


def print_sweep_lines(table: pd.DataFrame) -> None:
    """The held-out rows of >= 64 MiB past their tolerance against their own sweep's fit rows (sweep_lines)."""
    rows = {r.row: r for r in cross_rows()}
    misses = table[(table.set_aside == "") & (table.message_bytes >= 2**26) & (table.error.abs() > CROSS_LARGE)]
    if not len(misses):
        return
    print(f"held-out rows of >= 64 MiB past {CROSS_LARGE:.0%}, against their own sweep's fit rows "
          f"(the alpha-beta line through two fit rows, at the row's size):")
    for _, t in misses.iterrows():
        lines = sweep_lines(rows[t.row])
        text = (f"  row {t.row} {t.node} {t.message_bytes / 2**20:g} MiB"
                + (f" (forced {t.forced})" if t.forced != "-" else "")
                + f": measured {t.measured_busbw:g} GB/s, model {t.predicted_busbw:g} ({t.error:+.1%}, {t.ran})")
        if not lines:
            text += "; no two fit rows of this sweep on either side: nothing in the fit half prices it apart"
        for name, (pair, busbw) in lines.items():
            text += (f"; line of the rows {name} ({pair[0]},{pair[1]}) {busbw:.1f} "
                     f"({busbw / t.measured_busbw - 1:+.1%})")
        print(text)


def print_cross() -> list[str]:
    """Print the fits and the held-out table; return the misses."""
    print("\nacross nodes (catalog fat tree):")
    for name in sorted(CROSS_NODES):
        f = cross_fit(name)
        text = f"  {name:<13} NIC efficiency {f.efficiency:.3f}, {f.latency_us:.1f} us/hop"
        if f.ll_efficiency is not None:
            text += f"; low-latency {f.ll_efficiency:.3f}, {f.ll_latency_us:.1f} us/hop"
        text += f"  ({len(f.rows)} fit rows" + (f"; latency from {f.latency_from})" if f.latency_from else ")")
        print(text)
    table = cross_heldout_table()
    kept, aside = table[table.set_aside == ""], table[table.set_aside != ""]
    print(kept.drop(columns="set_aside").to_string(index=False))
    for node, group in kept.groupby("node"):
        print(f"  {node}: {len(group)} held-out rows, median |error| {group.error.abs().median():.1%}, "
              f"max {group.error.abs().max():.1%}")
    print(f"cross-node median |error| {kept.error.abs().median():.1%}, max {kept.error.abs().max():.1%} "
          f"(tolerance {CROSS_MEDIAN:.0%} / {CROSS_WORST:.0%}; {CROSS_LARGE:.0%} at >= 64 MiB)")
    print_sweep_lines(table)
    every = cross_table(heldout=False)
    aside = every[every.set_aside != ""]
    if len(aside):
        print(f"set aside ({len(aside)} rows, fit and held-out halves):")
        for _, r in aside.iterrows():
            print(f"  row {r.row} {r.node} {r.message_bytes} B: error {r.error:+.1%} -- {r.set_aside}")
    return cross_misses(table)
