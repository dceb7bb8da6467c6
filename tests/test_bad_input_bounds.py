"""Bounds with reasons on the sizes of networks other than decoder transformers (workloads/networks/spec.py
NETWORK_SIZE_LIMITS) and on link, NIC and fabric figures (hardware_specs/schema.py LINK_LIMITS, LINK_FLOORS): a figure
past one is refused in one line naming the field, with the bound and why, exit 2.

Before (main at ece1f8f): a ResNet's ``image_size`` of 10**30 printed a step of 10**54 s and 10**56 GiB of
activations with exit 0, ``blocks: [3, 4, 6, 100000]`` ran past 30 s, a NIC of 10**30 Gbit/s or a latency of 10**30 us
ran with exit 0, a NIC of 1e-30 Gbit/s was refused as ``strategy.preemptions_per_hour`` (another field), and a
transformer of 10**5 layers (inside its old bound) took 10-15 s to run (220 s under subnetwork_dp).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from hardware_specs.catalog import FABRICS, NODES
from hardware_specs.schema import LINK_FLOORS, LINK_LIMITS, Fabric, Node
from simulator.cli import main
from workloads.networks.catalog import NETWORKS, NetworkEntry
from workloads.networks.spec import NETWORK_SIZE_LIMITS
from workloads.schema import MODEL_SIZE_LIMITS

ROOT = Path(__file__).resolve().parents[1]
HUGE = 10**30


def _yaml(*parts: str) -> dict:
    return yaml.safe_load((ROOT.joinpath(*parts)).read_text())


def _run(raw: dict, tmp_path: Path) -> tuple[int, str, str]:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["simulate", str(path)])
    return code, out.getvalue(), err.getvalue()


def _refused_line(raw: dict, tmp_path: Path) -> str:
    code, _, err = _run(raw, tmp_path)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("clustersim: error: "), (code, err[-2000:])
    return lines[0]


def _resnet_scenario(**model) -> dict:
    raw = _yaml("examples", "resnet50-8xa100.yaml")
    raw["model"] = {**_yaml("workloads", "models", "networks", "resnet50.yaml"), **model}
    return raw


@pytest.mark.parametrize(("field", "value"), [("image_size", HUGE), ("num_classes", HUGE), ("width_per_group", HUGE),
                                              ("groups", HUGE), ("blocks", [3, 4, 6, 100_000])])
def test_resnet_size_past_its_bound_is_refused_naming_it(tmp_path, field, value):
    line = _refused_line(_resnet_scenario(**{field: value}), tmp_path)
    limit, why = NETWORK_SIZE_LIMITS[field]
    assert line.startswith(f"clustersim: error: model.{field}: ") and f"limit of {limit:,}" in line, line
    assert why in line, line


def test_resnet_image_size_true_is_not_read_as_one(tmp_path):
    line = _refused_line(_resnet_scenario(image_size=True), tmp_path)
    assert "model.image_size:" in line and "true/false" in line, line


def test_every_catalog_network_is_inside_the_bounds():
    """The control: no bound refuses a network of the catalog (each is 20-1000x past any trained)."""
    for name in NETWORKS.names():
        NETWORKS.get(name, "model")


@pytest.mark.parametrize("family", ["vit", "bert", "gnmt", "biglstm", "unet", "efficientnet", "inception_v3", "vgg"])
def test_each_family_refuses_a_huge_size(family):
    entry = next(NETWORKS.get(name, "model").root for name in NETWORKS.names()
                 if NETWORKS.get(name, "model").root.family == family)
    fields = [f for f in type(entry).model_fields if f in NETWORK_SIZE_LIMITS]
    assert fields, family
    for field in fields:
        raw = {**entry.model_dump(), field: HUGE}
        with pytest.raises(ValidationError, match=f"{field}[\\s\\S]*past the limit of"):
            NetworkEntry.model_validate(raw)


def test_network_floats_refuse_nan_and_inf():
    entry = NETWORKS.get("efficientnet-b0", "model").root.model_dump()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValidationError, match="finite"):
            NetworkEntry.model_validate({**entry, "width_mult": bad})
    with pytest.raises(ValidationError, match="past the limit of 100"):
        NetworkEntry.model_validate({**entry, "depth_mult": 1e30})


def test_transformer_of_10_5_layers_is_refused_with_the_reason(tmp_path):
    """10**5 layers were inside the old bound and took 10-15 s to run (220 s under subnetwork_dp): linear per-layer
    Python work (graph build, per-op pricing, parameter counts); the bound is now 20x DeepNet's 1,000 layers."""
    raw = _yaml("examples", "gpt3-xl-parameter-server-v100.yaml")
    raw["model"]["num_layers"] = 100_000
    line = _refused_line(raw, tmp_path)
    limit, why = MODEL_SIZE_LIMITS["num_layers"]
    assert limit == 20_000 and line.startswith("clustersim: error: model.num_layers: ") and why in line, line


def _node() -> dict:
    return _yaml("hardware_specs", "nodes", "dgx-a100-80g.yaml")


NODE_FIELDS = [("nic_latency_us",), ("nics_per_node",), ("gpus_per_node",), ("intra_node", "latency_us")]


@pytest.mark.parametrize("path", NODE_FIELDS, ids=".".join)
def test_node_link_figure_past_its_bound_is_refused(path):
    node = _node()
    target = node
    for key in path[:-1]:
        target = target[key]
    limit, why = LINK_LIMITS[path[-1]]
    target[path[-1]] = HUGE
    with pytest.raises(ValidationError, match="past the limit of " + f"{int(limit):,}"):
        Node.model_validate(node)
    for bad in (float("nan"), float("inf"), -1):
        target[path[-1]] = bad
        with pytest.raises(ValidationError):
            Node.model_validate(node)
    target[path[-1]] = limit  # the bound itself is allowed
    if path[-1] != "gpus_per_node":  # a node's GPUs also size its link tables
        Node.model_validate(node)


@pytest.mark.parametrize("path", [("nic_bandwidth_gbit_per_s",), ("intra_node", "bandwidth_per_gpu_gb_per_s")],
                         ids=".".join)
def test_bandwidth_has_a_floor_and_no_ceiling(path):
    """A huge bandwidth is an ideal link (transfers cost nothing; the hand-timed tests use 1e12 GB/s so); one below
    the floor is a unit slip."""
    node = _node()
    target = node
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = HUGE
    Node.model_validate(node)
    floor, _ = LINK_FLOORS[path[-1]]
    target[path[-1]] = floor / 10
    with pytest.raises(ValidationError, match="below the floor of"):
        Node.model_validate(node)
    target[path[-1]] = floor
    Node.model_validate(node)


def test_bandwidth_below_its_floor_is_refused_naming_it(tmp_path):
    """1e-30 Gbit/s (a unit slip) was refused as strategy.preemptions_per_hour, another field."""
    raw = _yaml("examples", "swarm-t4-preemptible.yaml")
    raw["cluster"]["node"]["nic_bandwidth_gbit_per_s"] = 1e-30
    line = _refused_line(raw, tmp_path)
    floor, why = LINK_FLOORS["nic_bandwidth_gbit_per_s"]
    assert line.startswith("clustersim: error: cluster.node.nic_bandwidth_gbit_per_s: ") and why in line, line


@pytest.mark.parametrize("field", ["nic_low_latency_us", "nic_latency_us"])
def test_huge_nic_figure_in_a_scenario_is_one_line(tmp_path, field):
    raw = _yaml("examples", "stragglers-dp-a100.yaml")
    raw["cluster"]["node"] = _node()
    raw["cluster"]["node"][field] = HUGE
    line = _refused_line(raw, tmp_path)
    assert line.startswith(f"clustersim: error: cluster.node.{field}: ") and "past the limit" in line, line


@pytest.mark.parametrize(("fabric", "field"), [("fat-tree-2to1", "switch_latency_us"),
                                               ("fat-tree-2to1", "oversubscription"),
                                               ("fat-tree-2to1", "pod_size_nodes"),
                                               ("rail-optimized", "rail_group_nodes")])
def test_fabric_figure_past_its_bound_is_refused(fabric, field):
    spec = _yaml("hardware_specs", "fabrics", f"{fabric}.yaml")
    spec[field] = HUGE
    with pytest.raises(ValidationError, match=f"{field}[\\s\\S]*past the limit"):
        TypeAdapter(Fabric).validate_python(spec)


def test_wide_area_matrices_are_bounded_entry_by_entry():
    spec = _yaml("hardware_specs", "fabrics", "ds3lab-case3-two-regions.yaml")
    adapter = TypeAdapter(Fabric)
    adapter.validate_python(spec)  # the control
    for key, bad_value, match in (("delay_ms", HUGE, "past the limit of 10,000"),
                                  ("bandwidth_gbit_per_s", 1e-30, "below the floor of 0.001")):
        bad = {**spec, key: [[v if i == j or (i, j) != (0, 40) else bad_value for j, v in enumerate(row)]
                             for i, row in enumerate(spec[key])]}
        with pytest.raises(ValidationError, match=match):
            adapter.validate_python(bad)


def test_every_catalog_node_and_fabric_is_inside_the_bounds():
    """The control: no bound refuses a part of the catalog (variants built from their base included)."""
    for catalog in (NODES, FABRICS):
        for name in catalog.names():
            catalog.get(name, "cluster")


def _traced(**model) -> dict:
    return {"name": "traced", "model": {"torch": "torch_nets:ResNet", "input_shape": [3, 64, 64],
                                        "kwargs": {"blocks": [1, 1, 1, 1], "width_per_group": 16}, **model},
            "cluster": {"node": "dgx-a100-80g", "num_gpus": 8},
            "parallelism": {"dp": 8, "micro_batch_size": 4, "global_batch_size": 32}}


def test_traced_model_input_shape_past_its_bound_is_one_line(tmp_path):
    """Before: a traceback out of torch.empty (a shape past int64)."""
    pytest.importorskip("torch")
    line = _refused_line(_traced(input_shape=[3, HUGE, 64]), tmp_path)
    assert line.startswith("clustersim: error: model.input_shape: ") and "limit of 100,000,000" in line, line


def test_traced_model_constructor_failure_is_one_line(tmp_path):
    """Before: torch's C++ stack (60 lines of frames) after the first line of the message."""
    pytest.importorskip("torch")
    line = _refused_line(_traced(kwargs={"blocks": [1, 1, 1, 1], "width_per_group": HUGE}), tmp_path)
    assert "model.torch:" in line and "Overflow" in line, line
