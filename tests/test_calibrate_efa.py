"""The p5 (EFA) collective laws: validation/calibrate_efa.py fits them on the Playbook's 256 MB
collective microbenchmark, and hardware_specs/nodes/p5-h100-efa.yaml carries them."""

from __future__ import annotations

import pytest

from hardware_specs.catalog import NODES
from validation import calibrate_efa as efa


def test_the_node_spec_carries_the_fitted_laws():
    intra, inter = efa.laws()
    node = NODES.get("p5-h100-efa")
    for name, law in intra.items():
        spec = node.intra_node.collectives[name]
        assert spec.latency_us == 0
        assert spec.latency_per_step_us == pytest.approx(law.latency_per_step_us, abs=0.005)
        assert spec.bus_bandwidth_gb_per_s == pytest.approx(law.bus_bandwidth_gb_per_s, abs=0.05)
    for name, law in inter.items():
        spec = node.inter_node_collectives[name]
        assert spec.latency_us == 0
        assert spec.latency_per_step_us == pytest.approx(law.latency_per_step_us, abs=0.005)
        assert spec.bus_bandwidth_gb_per_s == pytest.approx(law.bus_bandwidth_gb_per_s, abs=0.05)


def test_one_node_point_is_reproduced_exactly():
    intra, _ = efa.laws()
    for name, law in intra.items():
        (point,) = [p for p in efa.points(name) if p.nodes == 1]
        assert law.busbw_gb_per_s(8) == pytest.approx(point.busbw_gb_per_s, rel=1e-9)


@pytest.mark.parametrize(("collective", "worst"), [("all_gather", 0.25), ("reduce_scatter", 0.25), ("all_reduce", 0.65)])
def test_inter_node_law_reproduces_the_microbenchmark(collective, worst):
    # The stated fit quality (p5 YAML header): all-gather / reduce-scatter within -14..+22% of the
    # measured bus bandwidth at 2-64 nodes; all-reduce (NVLS/tree in NCCL) within -19..+60%.
    _, inter = efa.laws()
    law = inter[collective]
    pts = [p for p in efa.points(collective) if p.nodes > 1]
    assert [p.nodes for p in pts] == [2, 4, 8, 16, 32, 64]
    errors = [law.busbw_gb_per_s(8 * p.nodes) / p.busbw_gb_per_s - 1 for p in pts]
    assert max(abs(e) for e in errors) <= worst, errors
    # the falling bandwidth is what the per-step latency carries: 64 nodes is far below 2 nodes
    assert law.busbw_gb_per_s(512) < 0.2 * law.busbw_gb_per_s(16)
