"""Calibrate the collectives inside a node (NVLink/NVSwitch, NVLS, xGMI) on public nccl-tests rows.

Data: ``data/microbench/collectives_bandwidth.csv`` (copied from ``shared/published/modern/``; its
caveats are in ``data/microbench/SOURCE_README.md``). Rows used: one node, all_reduce / all_gather /
reduce_scatter, a numeric message size and bus bandwidth, measured (not a maintainer's "expected"
value). A row is held out when the md5 of its key (GPU, system, GPUs, collective, algorithm, bytes)
is odd, as in validation/layout_ranking.py; the laws are fitted on the even half only.

Model (simulator/cost/collectives.py, the code the simulator runs):

- ring: ``t = steps(n) · latency_per_step_us + bus_bytes / bus_bandwidth`` (AlphaBeta law; steps
  2(n-1) for all-reduce, n-1 for all-gather / reduce-scatter), or the same line of the
  low-latency protocol (LL/LL128: shorter steps, less bandwidth) where that is faster — NCCL's
  tuner picks the protocol so (src/graph/tuning.cc);
- NVLS (NVSwitch nodes, n >= 4): ``t = latency_us + S / bandwidth`` (NvlsLaw), NCCL's choice when
  faster than the ring — the rows of NCCL's default algorithm are predicted so, rows with NVLS off
  by the ring alone;
- xGMI full mesh (MI300X): a group of n uses n-1 of a GPU's 7 links, so its bus bandwidth is the
  law's x (n-1)/7 (simulator/cost/collectives.py ``mesh_peers``).

Parameters are fitted per system (least squares on log time, scipy) on its fit rows: the ring's
per-step latency and bus bandwidth (all-gather and reduce-scatter share the all-reduce ring's
unless their own rows are in the fit half), NVLS latency and bandwidth. Nodes of the same NVLink
generation without rows of their own carry the fit, marked as transferred in ``fitted_on``.

``python -m validation.calibrate_collectives`` prints the laws and the held-out table; ``--write``
rewrites the generated block at the end of each calibrated node YAML.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pandas as pd
import yaml
from scipy.optimize import least_squares

from hardware_specs.catalog import NODES
from hardware_specs.schema import AlphaBeta, FatTree, Node, NvlsLaw
from simulator.cost.collectives import bus_bytes, collective_cost
from simulator.cost.topology import Placement, Topology
from validation.calibrate_collectives_cross import (
    COLLECTIVES,
    CROSS_NODES,
    cross_node_block,
    is_heldout,
    print_cross,
    tolerance_misses,
)

CSV = Path(__file__).parent / "data" / "microbench" / "collectives_bandwidth.csv"
NODE_SPECS = Path(__file__).parent.parent / "hardware_specs" / "nodes"
MARKER = "# --- collectives: written by `python -m validation.calibrate_collectives --write`"
LABEL = "validation/data/microbench/collectives_bandwidth.csv rows "
FABRIC = FatTree(name="none", levels=1, switch_latency_us=0, source="unused: one node")

# system of the rows -> the catalog node they calibrate; then nodes that carry another's fit
SYSTEMS = {"A100 SXM": "dgx-a100-80g", "H200 SXM": "hgx-h200", "B200": "dgx-b200", "MI300X": "mi300x-8",
           "H100 80GB HBM3": "dgx-h100"}
TRANSFERS = {"dgx-h100": "hgx-h200", "hgx-b200": "dgx-b200", "dgx-b300": "dgx-b200", "gb200-nvl72": "dgx-b200",
             "gb300-nvl72": "dgx-b200", "mi325x-8": "mi300x-8", "p6-b200": "dgx-b200", "p5en-h200": "hgx-h200",
             "a3-mega-h100": "hgx-h200"}
# Fitted and checked but not written: the A100 validations (Narayanan, Korthikanti; the A100 curve of
# validation/calibrate_a100.py) and Hagemann's fitted profile price the A100's collectives with the
# node's collective_efficiency; adopting these laws would move them and needs those fits redone.
NOT_WRITTEN = {"dgx-a100-80g"}


@dataclass(frozen=True)
class Row:
    key: str
    row: int              # 1-based line of the CSV (header = line 1)
    node: str
    collective: str
    nvls_allowed: bool
    gpus: int
    message_bytes: float
    busbw_gb_per_s: float
    nccl_chose_nvls: bool = False

    @property
    def heldout(self) -> bool:
        return is_heldout(self.key)

    @property
    def time_s(self) -> float:
        return bus_bytes(self.collective, self.message_bytes, self.gpus) / (self.busbw_gb_per_s * 1e9)


@cache
def rows() -> tuple[Row, ...]:
    df = pd.read_csv(CSV)
    out = []
    for i, r in df.iterrows():
        node = SYSTEMS.get(r.gpu)
        try:
            size, busbw, gpus = float(r.message_bytes), float(r.busbw_gb_per_s), int(r.gpus_per_node)
        except (TypeError, ValueError):
            continue
        if (node is None or r.num_nodes != 1 or r.collective not in COLLECTIVES or r.measurement_type != "measured"
                or not (math.isfinite(size) and math.isfinite(busbw))):
            continue
        key = f"{r.gpu}|{r.system}|{gpus}|{r.collective}|{r.algo}|{int(size)}"
        # NCCL ran the ring where the row says so (NVLS off, or "RING/LL up to 1MiB" at those sizes)
        ring_only = "NVLS_ENABLE=0" in r.algo or ("RING/LL up to 1MiB" in r.algo and size <= 2**20)
        out.append(Row(key, int(i) + 2, node, r.collective, not ring_only, gpus, size, busbw,
                       "NVLS (NCCL default" in r.algo))
    return tuple(out)


def node_with(node: Node, laws: dict[str, AlphaBeta], nvls: NvlsLaw | None) -> Node:
    return node.model_copy(update={"intra_node_measured": laws, "nvls_all_reduce": nvls})


def predicted_time_s(node: Node, row: Row) -> float:
    placement = Placement(tuple(range(row.gpus)), row.gpus, 1, 1)
    links = Topology(node, FABRIC, node.gpus_per_node).links
    nvls = node.nvls_all_reduce if row.nvls_allowed else None
    cost = collective_cost(row.collective, row.message_bytes, placement, links, node.intra_laws, None, nvls,
                           mesh_peers=node.gpus_per_node - 1 if node.intra_node.kind == "xgmi" else None)
    return cost.isolated_time_s(links)


@dataclass(frozen=True)
class Fit:
    node: str
    laws: dict[str, AlphaBeta]
    nvls: NvlsLaw | None
    rows: tuple[int, ...]


def _laws(params, with_nvls: bool, own: dict[str, int], fitted_on: str,
          min_gpus: int = 4, digits: int | None = None) -> tuple[dict[str, AlphaBeta], NvlsLaw | None]:
    params = [float(f"{v:.{digits}g}") if digits else float(v) for v in params]
    step_us, bw, ll_step_us, ll_bw = params[0], params[1], params[-2], params[-1]
    laws = {}
    for c in COLLECTIVES:
        c_bw = params[own[c]] if c in own else bw
        laws[c] = AlphaBeta(latency_us=0.0, latency_per_step_us=step_us,
                            bus_bandwidth_gb_per_s=c_bw, low_latency_per_step_us=ll_step_us,
                            low_latency_bus_bandwidth_gb_per_s=ll_bw,
                            source="ring law fitted on nccl-tests rows" + ("" if c == "all_reduce" or c in own else
                                                                           " (all-reduce ring's bandwidth)"),
                            fitted_on=fitted_on)
    nvls = None
    if with_nvls:
        nvls = NvlsLaw(latency_us=params[2], bandwidth_gb_per_s=params[3],
                       min_gpus=min_gpus,
                       source="NVLS law fitted on nccl-tests rows (NCCL default algorithm and NVLS sweeps)",
                       fitted_on=fitted_on)
    return laws, nvls


@cache
def fit(node_name: str) -> Fit:
    node = NODES.get(node_name)
    fit_rows = [r for r in rows() if r.node == node_name and not r.heldout]
    with_nvls = node.intra_node.supports_nvls
    own: dict[str, int] = {}
    x0, lo, hi = [5.0, 200.0], [0.0, 1.0], [100.0, 2000.0]
    if with_nvls:
        x0, lo, hi = x0 + [20.0, 300.0], lo + [0.0, 1.0], hi + [200.0, 2000.0]
    for c in ("all_gather", "reduce_scatter"):
        if any(r.collective == c for r in fit_rows):
            own[c] = len(x0)
            x0, lo, hi = x0 + [200.0], lo + [1.0], hi + [2000.0]
    x0, lo, hi = x0 + [2.0, 50.0], lo + [0.0, 1.0], hi + [100.0, 2000.0]  # the low-latency protocol, last
    label = LABEL + ",".join(str(r.row) for r in fit_rows)
    # the smallest group NCCL's default ran NVLS on (its tuner's choice, not a bandwidth question)
    chose = [r.gpus for r in fit_rows if r.nccl_chose_nvls]
    min_gpus = min(chose) if chose else 4

    def residuals(p):
        laws, nvls = _laws(p, with_nvls, own, label, min_gpus)
        spec = node_with(node, laws, nvls)
        return [math.log(predicted_time_s(spec, r) / r.time_s) for r in fit_rows]
    p = least_squares(residuals, x0, bounds=(lo, hi), x_scale=x0).x
    laws, nvls = _laws(p, with_nvls, own, label, min_gpus, digits=4)
    return Fit(node_name, laws, nvls, tuple(r.row for r in fit_rows))


def law_source(node_name: str) -> str:
    """The node whose rows fit ``node_name``'s laws (itself, or the one it carries the fit of)."""
    return TRANSFERS.get(node_name, node_name)


def heldout_table() -> pd.DataFrame:
    """Held-out rows predicted with the fitted laws on the catalog node (the written nodes hold exactly
    these laws: tests/test_collectives_calibration.py)."""
    out = []
    for r in rows():
        if not r.heldout:
            continue
        f = fit(law_source(r.node))
        node = node_with(NODES.get(r.node), f.laws, f.nvls)
        t = predicted_time_s(node, r)
        pred = bus_bytes(r.collective, r.message_bytes, r.gpus) / t / 1e9
        out.append({"row": r.row, "node": r.node, "collective": r.collective, "gpus": r.gpus,
                    "nvls_allowed": r.nvls_allowed, "message_bytes": int(r.message_bytes),
                    "measured_busbw": r.busbw_gb_per_s, "predicted_busbw": round(pred, 1),
                    "error": pred / r.busbw_gb_per_s - 1})
    return pd.DataFrame(out)


def block(node_name: str) -> dict:
    source = TRANSFERS.get(node_name)
    f = fit(source or node_name)
    if source:
        note = f" (transferred from {source}: same link generation; not measured on this node)"
        laws = {c: law.model_copy(update={"fitted_on": law.fitted_on + note}) for c, law in f.laws.items()}
        nvls = f.nvls.model_copy(update={"fitted_on": f.nvls.fitted_on + note}) if f.nvls else None
    else:
        laws, nvls = f.laws, f.nvls
    out = {"intra_node_measured": {c: law.model_dump(exclude_none=True, exclude_defaults=False)
                                   for c, law in laws.items()}}
    if nvls is not None and NODES.get(node_name).intra_node.supports_nvls:
        out["nvls_all_reduce"] = nvls.model_dump(exclude_none=True)
    if node_name in CROSS_NODES:
        out.update(cross_node_block(node_name))
    return out


def calibrated_nodes() -> list[str]:
    names = set(NODES.names())
    return sorted((set(SYSTEMS.values()) - NOT_WRITTEN | set(TRANSFERS)) & names)


def write_node(name: str) -> Path:
    path = NODE_SPECS / f"{name}.yaml"
    text = path.read_text()
    head = text[: text.index(MARKER)] if MARKER in text else text
    body = yaml.safe_dump(block(name), sort_keys=False, width=200, default_flow_style=None)
    path.write_text(head.rstrip("\n") + "\n" + MARKER + " (edit the script, not this block) ---\n" + body)
    return path


# Tolerances on the held-out half (tests/test_collectives_calibration.py holds the same): median and worst
# |error|, and the worst row of 64 MiB or more (bandwidth-bound, where two alpha-beta lines should hold).
MEDIAN, WORST, LARGE = 0.08, 0.30, 0.15


def misses(table: pd.DataFrame) -> list[str]:
    """The held-out figures past their tolerance (empty when the calibration meets them)."""
    return tolerance_misses(table, MEDIAN, WORST, LARGE)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the generated block of the node YAMLs")
    args = parser.parse_args(argv)
    for name in sorted(set(SYSTEMS.values()) - set(TRANSFERS)):
        f = fit(name)
        ring = f.laws["all_reduce"]
        text = f"  {name:<14} ring {ring.latency_per_step_us:.2f} us/step, {ring.bus_bandwidth_gb_per_s:.0f} GB/s"
        if f.nvls:
            text += f"; NVLS {f.nvls.latency_us:.1f} us + S / {f.nvls.bandwidth_gb_per_s:.0f} GB/s"
        print(text + f"  ({len(f.rows)} fit rows)")
    if args.write:
        for name in calibrated_nodes():
            print("wrote", write_node(name))
    pd.set_option("display.width", 200)
    table = heldout_table()
    print(table.to_string(index=False))
    print(f"median |error| {table.error.abs().median():.1%}, max {table.error.abs().max():.1%} "
          f"(tolerance {MEDIAN:.0%} / {WORST:.0%}; {LARGE:.0%} at >= 64 MiB)")
    failed = misses(table)
    failed += print_cross()
    for miss in failed:
        print("MISS:", miss)
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
