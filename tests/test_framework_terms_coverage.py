"""No strategy kind drops an efficiency term silently (simulator/strategies/framework_terms.py).

For every kind in the registry (simulator/strategies/registry.py ``KIND_MODULES``) and every step-level term an
efficiency block can set (``STEP_TERMS``: a framework profile's ``sync_jitter``, ``host_dispatch_us_per_kernel``,
``input_us_per_sample`` and ``moe_layer_fixed_us``; a calibration profile's ``cross_node_pipeline_floor`` and
its interference slowdowns), the kind either applies the term -- the step changes when the term is set; for
the interference slowdowns, which only act where a transfer runs beside a kernel, the kind's kernels carry the
slowdown -- or names it in the result (``framework_terms_dropped``, printed under the step time). A kind that
refuses the model (per_layer on a mixture of experts) says so by name and is not run.

The probe is the toy GPT of tests/test_simulate.py (4 layers, one GPU per node, 1 GB/s NICs), in each kind's
smallest layout with a pipeline across nodes where the kind has pipeline stages (the floor needs one), two
data-parallel ranks where it has none; the MoE term on the same toy with every second FFN a mixture of experts.
A new kind fails here until it has a probe (:func:`_probe_raw`).
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest

from hardware_specs.schema import ComputeEfficiency
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.framework_terms import DROPPED_KEY, STEP_TERMS
from simulator.strategies.registry import get_kind, load_kinds

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import toy_raw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Each term at a value that moves the toy's step by far more than round-off.
VALUES = {"sync_jitter": 0.15, "host_dispatch_us_per_kernel": 2000.0, "input_us_per_sample": 50_000.0,
          "moe_layer_fixed_us": 20_000.0,
          "cross_node_pipeline_floor": {"per_layer_us": 20_000.0, "per_layer_per_tp_rank_us": 0.0, "source": "test"},
          "overlap_compute_slowdown": 0.5, "overlap_comm_slowdown": 1.0}
INTERFERENCE = ("overlap_compute_slowdown", "overlap_comm_slowdown")
PIPELINED = ("spmd", "local_sgd", "parameter_server", "async_pipeline", "local_learning", "swarm", "layer_parallel_mgrit")
DATA_PARALLEL = ("cyclic_dp", "per_layer", "subnetwork_dp", "replicated_pipeline")


def _probe_raw(kind: str, moe: bool) -> dict:
    """The kind's probe scenario (see the module docstring); KeyError for a kind without one."""
    if kind not in PIPELINED + DATA_PARALLEL:
        raise KeyError(f"no probe for strategy kind {kind!r}: add one to tests/test_framework_terms_coverage.py")
    raw = toy_raw(2, pp=2, global_batch_size=4) if kind in PIPELINED else toy_raw(2, dp=2, global_batch_size=4)
    node = raw["cluster"]["node"]
    node.update(gpus_per_node=1, nics_per_node=1, nic_bandwidth_gbit_per_s=8.0, nic_latency_us=5)
    if moe:
        raw["model"]["moe"] = {"num_experts": 4, "top_k": 2, "moe_layer_frequency": 2}
    strategy = {"kind": kind}
    if kind == "local_sgd":
        strategy["local_steps"] = 2
    elif kind == "per_layer":
        strategy["default"] = {"batch": 2}
        raw["parallelism"] = {"global_batch_size": 4}
    elif kind == "subnetwork_dp":
        strategy.update(mask="block", masking="forward_backward", keep_fraction=1.0, subnetworks=1)
    elif kind == "layer_parallel_mgrit":
        strategy.update(coarsening_factor=2, levels=2)
    elif kind == "replicated_pipeline":  # two stages on two nodes, one GPU each
        layers = len(load_scenario(toy_raw(1)).layer_graph().layers)
        strategy.update(stages=[{"layers": layers // 2, "replicas": 1}, {"layers": layers - layers // 2, "replicas": 1}],
                        micro_batches=4)
        raw["parallelism"] = {"global_batch_size": 4}
    raw["strategy"] = strategy
    return raw


def _with(raw: dict, term: str) -> dict:
    raw = copy.deepcopy(raw)
    raw["cluster"]["node"]["accelerator"]["efficiency"][term] = copy.deepcopy(VALUES[term])
    return raw


def _dropped(result, term: str) -> list[str]:
    return [line for line in result.extra.get(DROPPED_KEY) or () if line.startswith(f"{term} (")]


CASES = [(kind, term) for kind in load_kinds() for term in STEP_TERMS]


@pytest.mark.parametrize("kind,term", CASES)
def test_every_kind_applies_or_names_every_term(kind, term):
    moe = term == "moe_layer_fixed_us"
    raw = _probe_raw(kind, moe)
    scenario = load_scenario(_with(raw, term))
    try:
        result = simulate(scenario)
    except ConfigError as exc:  # the kind refuses the model by name: nothing runs, nothing is dropped
        assert moe and kind == "per_layer" and "mixture of experts" in str(exc), str(exc)
        return
    if _dropped(result, term):
        return
    if term in INTERFERENCE:  # applied: the kind's kernels (or transfers) carry the slowdown the engine applies
        plan = get_kind(kind).compile(scenario)
        tasks = [t for (_, stream), ts in plan.streams.items() for t in ts]
        if term == "overlap_compute_slowdown":
            assert any(t.slowdown_while_contended > 0 for t in tasks), f"{kind} neither applies nor names {term}"
        else:
            assert any(t.comm_slowdown_while_computing > 0 for t in tasks), f"{kind} neither applies nor names {term}"
        return
    bare_s = simulate(load_scenario(raw)).step_time_s
    assert abs(result.step_time_s / bare_s - 1) > 1e-3, f"{kind} neither applies nor names {term}"


def test_the_terms_are_every_step_level_field_spmd_reads():
    """Every efficiency field the spmd planner reads beyond the kernel prices (which every kind takes from
    simulator/cost/compute.py ComputeModel) is one of STEP_TERMS, so the test above covers it: read from the
    source of simulator/strategies/spmd/ and framework_terms.py."""
    fields = set(ComputeEfficiency.model_fields)
    source = "".join(p.read_text() for p in (ROOT / "simulator" / "strategies" / "spmd").glob("*.py"))
    source += (ROOT / "simulator" / "strategies" / "framework_terms.py").read_text()
    read = {name for name in re.findall(r"\.(\w+)", source) if name in fields}
    compute_source = (ROOT / "simulator" / "cost" / "compute.py").read_text()
    priced = {name for name in re.findall(r"\.(\w+)", compute_source) if name in fields}
    assert read - priced - {"source"} <= set(STEP_TERMS), read - priced - set(STEP_TERMS)
    assert {"sync_jitter", "host_dispatch_us_per_kernel", "input_us_per_sample", "moe_layer_fixed_us",
            "cross_node_pipeline_floor"} <= read


def test_every_registered_kind_has_a_probe():
    for kind in load_kinds():
        _probe_raw(kind, False)
