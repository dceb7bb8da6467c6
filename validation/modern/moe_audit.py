"""Where NeMo's MoE rows put their expert groups, what their all-to-alls cost, and what is left over.

``python -m validation.modern.moe_audit [--rows 35,52] [--no-simulate]``: for every NeMo MoE row (both
halves and the rows set aside: a check of the mapping, not a validation figure) it prints

- the expert-parallel group the simulator builds for the first stage's first rank, as Megatron-Core's
  ``RankGenerator`` folds it (order "tp-cp-ep-dp-pp"; with ``etp`` the expert groups fold over each stage's
  tp x cp x dp ranks, etp innermost: simulator/cost/topology.py ``RankLayout._folded_expert_group``): its
  nodes and members per node, so whether the all-to-all stays on NVLink or crosses InfiniBand, and whether
  the pipeline neighbours sit on another node;
- the dispatcher the row is mapped to (``parallelism.moe_dispatch``) and the all-to-all bytes per rank;
- the least time a plain (NCCL) all-to-all's cross-node share takes at the NIC's catalog line rate over the
  busiest stage's step (``a2a_ib_floor_s``: 4 all-to-alls per MoE layer and micro-batch, each moving
  (n - g)/n of its payload off the node for a group of n ranks with g per node), against the measured step;
- the simulated step as mapped and with ``moe_dispatch=deepep`` (DeepEP: each token crosses each remote node
  once, simulator/cost/moe_dispatch.py), with the NeMo profile's constants (its ``moe_layer_fixed_us``
  included), and the time per MoE layer and micro-batch of the busiest stage that the measurement leaves over
  each (``residual_ms``, measured - simulated, per MoE layer pass of one micro-batch: forward and backward
  together). Before that constant and the DeepEP mapping of the Megatron-Bridge rows (validation/modern/nemo.py)
  the Qwen3 rows left 2.1-3.1 ms with DeepEP where their release's scripts use it, against -2.3 to +3.0 ms
  with a plain all-to-all everywhere; now -0.8 to +0.2 ms, DeepSeek-V3 -5.0 ms.

It explains nothing by itself and fits nothing: it puts next to each other the figures the issue-23 audit
asked for (EP placement, link, dispatcher, what is left over), so that a mapping can be checked against its
source. The sources of each dispatcher are in :mod:`validation.modern.nemo`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from simulator.cost.topology import RankLayout, build_topology
from simulator.scenario import load_scenario
from validation.modern.case import ModernCase
from validation.modern.profiles import load_groups, resolved_scenario
from validation.modern.registry import SETS, built

A2A_PER_MOE_LAYER_PASS = 4  # dispatch and combine in the forward, their gradients in the backward


@dataclass(frozen=True)
class ExpertPlacement:
    """Where one expert-parallel group lies (the first stage's first rank's)."""

    ep: int
    nodes: int
    per_node: int
    pipeline_crosses_nodes: bool

    @property
    def link(self) -> str:
        return "NVLink" if self.nodes == 1 else "NVLink+IB"

    @property
    def off_node_share(self) -> float:
        """Share of a plain all-to-all's payload sent to ranks on other nodes: (n - g) / n."""
        return (self.ep - self.per_node) / self.ep


def expert_placement(raw: dict) -> ExpertPlacement:
    """The expert group the simulator builds for a scenario mapping (no simulation)."""
    sc = load_scenario(raw)
    par = sc.parallelism
    layout = RankLayout(par)
    topo = build_topology(sc.node, sc.fabric, sc.num_gpus)
    rep = layout.representative(0)
    placement = topo.placement(layout.group(rep, "ep"))
    crosses = par.pp > 1 and topo.node_of(layout.representative(1)) != topo.node_of(rep)
    return ExpertPlacement(par.ep, placement.num_nodes, placement.members_per_node, crosses)


def a2a_payload_bytes(raw: dict) -> float:
    """Bytes one rank sends in one dispatch all-to-all of one micro-batch (its tokens x top-k x hidden x
    activation bytes), read from the layer graph the simulator prices."""
    sc = load_scenario(raw)
    for layer in sc.layer_graph().layers:
        for op in layer.forward:
            if op.collective == "all_to_all" and op.group == "ep":
                return op.comm_bytes
    return 0.0


def moe_layer_fraction(raw: dict) -> float:
    """Share of the model's decoder layers that are MoE layers."""
    from workloads.layer_kinds import is_moe_layer

    model = load_scenario(raw).model
    return sum(is_moe_layer(model, i) for i in range(model.num_layers)) / model.num_layers


def measured_step_s(case: ModernCase, raw: dict) -> float | None:
    if case.measured_rate_per_gpu is None:
        return None
    par = raw["parallelism"]
    tokens = par["global_batch_size"] * raw["training"]["seq_length"]
    return tokens / (case.measured_rate_per_gpu * raw["cluster"]["num_gpus"])


@dataclass(frozen=True)
class AuditRow:
    case: ModernCase
    placement: ExpertPlacement
    dispatch: str
    payload_mb: float
    measured_s: float | None
    a2a_ib_floor_s: float
    moe_passes: float                    # MoE layer passes of one micro-batch on the busiest stage, per step
    simulated_s: float | None = None     # as mapped
    deepep_s: float | None = None        # with parallelism.moe_dispatch=deepep

    def residual_ms(self, simulated_s: float | None) -> float | None:
        if simulated_s is None or self.measured_s is None or self.moe_passes <= 0:
            return None
        return 1e3 * (self.measured_s - simulated_s) / self.moe_passes


def _nic_bytes_per_s(raw: dict) -> float:
    sc = load_scenario(raw)
    return build_topology(sc.node, sc.fabric, sc.num_gpus).links.inter_bytes_per_s


def audit_row(case: ModernCase, raw: dict, result: dict | None = None, deepep: dict | None = None) -> AuditRow:
    """One row's figures; ``result`` / ``deepep``: its simulation as mapped and with DeepEP (optional)."""
    placement = expert_placement(raw)
    par = raw["parallelism"]
    payload = a2a_payload_bytes(raw)
    tp, pp, cp = par["tp"], par["pp"], par.get("cp", 1)
    dp = raw["cluster"]["num_gpus"] // (tp * pp * cp)
    micro_batches = par["global_batch_size"] // (dp * par["micro_batch_size"])
    sc = load_scenario(raw)
    layers = sc.model.num_layers / pp
    if result is not None and result.get("layers_per_stage"):
        layers = max(result["layers_per_stage"])
    passes = layers * moe_layer_fraction(raw) * micro_batches
    floor = passes * A2A_PER_MOE_LAYER_PASS * payload * placement.off_node_share / _nic_bytes_per_s(raw)
    return AuditRow(case, placement, par.get("moe_dispatch", "all_to_all"), payload / 1e6, measured_step_s(case, raw),
                    floor, passes, (result or {}).get("step_time_s"), (deepep or {}).get("step_time_s"))


def moe_cases() -> list[ModernCase]:
    return [c for c in built("nemo")[0] if c.scenario["parallelism"].get("ep", 1) > 1]


def audit(rows: list[int] | None = None, simulate: bool = True, workers: int | None = 2) -> list[AuditRow]:
    from simulator.scenario import apply_overrides
    from validation.modern.registry import simulate_many

    cases = [c for c in moe_cases() if rows is None or c.row in rows]
    groups = load_groups(SETS["nemo"].profile_name)
    raws = [resolved_scenario(c, groups) for c in cases]
    results: list[dict | None] = [None] * len(raws)
    deepeps: list[dict | None] = [None] * len(raws)
    if simulate:
        from simulator.simulate import simulate_point

        results = [simulate_point(r, run_if_oom=True) for r in raws]
        deepeps = simulate_many([apply_overrides(r, ["parallelism.moe_dispatch=deepep"]) for r in raws], workers)
    return [audit_row(c, r, res, d) for c, r, res, d in zip(cases, raws, results, deepeps, strict=True)]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_audit(out: list[AuditRow]) -> None:
    print("NeMo MoE rows: expert group as built (first stage), dispatcher as mapped, plain all-to-all's InfiniBand floor "
          "(NIC line rate) and time per MoE layer pass left over by the measurement (both halves; not a validation "
          "figure)")
    print(f"{'row':>4} {'half':<5} {'model':<16} {'release':<14} {'layout':<20} {'EP group':<16} {'pp x-node':<9} "
          f"{'dispatch':<10} {'a2a MB':>7} {'meas s':>7} {'IB floor s':>10} {'sim s':>7} {'resid ms':>8} "
          f"{'deepep s':>8} {'resid ms':>8}")
    for a in out:
        par = a.case.scenario["parallelism"]
        layout = f"tp{par['tp']} pp{par['pp']} vp{par['virtual_stages']} ep{par['ep']}"
        group = f"{a.placement.nodes}x{a.placement.per_node} {a.placement.link}"
        half = "held" if a.case.heldout else "fit"
        if a.case.set_aside:
            half = "aside"
        model = a.case.key.split("|")[1]
        release = a.case.label.split("NeMo ")[-1].split(" container")[0].split(" tp")[0][:14]
        print(f"{a.case.row:>4} {half:<5} {model:<16} {release:<14} {layout:<20} {group:<16} "
              f"{'yes' if a.placement.pipeline_crosses_nodes else 'no':<9} {a.dispatch:<10} {a.payload_mb:>7.1f} "
              f"{_fmt(a.measured_s, '7.2f'):>7} {a.a2a_ib_floor_s:>10.2f} {_fmt(a.simulated_s, '7.2f'):>7} "
              f"{_fmt(a.residual_ms(a.simulated_s), '8.2f'):>8} {_fmt(a.deepep_s, '8.2f'):>8} "
              f"{_fmt(a.residual_ms(a.deepep_s), '8.2f'):>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.modern.moe_audit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="only these data rows, e.g. 35,52")
    parser.add_argument("--no-simulate", action="store_true", help="placement, bytes and floors only")
    args = parser.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")] if args.rows else None
    print_audit(audit(rows, simulate=not args.no_simulate))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
