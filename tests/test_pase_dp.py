"""PaSE's dynamic program (simulator/explore/planners/pase_dp.py) finds the exact minimum: against
brute force over every assignment on chains, diamonds, Inception-like blocks and random DAGs with
random costs (edges in and against the processing order), and on a toy cost where the answer is
known by hand."""

from __future__ import annotations

import itertools
import random

import pytest

from simulator.explore.planners.pase_dp import min_cost_assignment, transitions_needed


def brute_force(vertices, edges, configs, vertex_cost, edge_cost):
    best = float("inf")
    for choice in itertools.product(*(configs(v) for v in vertices)):
        phi = dict(zip(vertices, choice, strict=True))
        cost = sum(vertex_cost(v, phi[v]) for v in vertices) + sum(edge_cost(u, v, phi[u], phi[v]) for u, v in edges)
        best = min(best, cost)
    return best


def random_costs(seed, vertices, n_configs):
    rng = random.Random(seed)
    opts = {v: tuple(range(rng.randint(1, n_configs))) for v in vertices}
    vc = {(v, c): rng.uniform(0, 10) for v in vertices for c in opts[v]}
    ec = {}

    def edge_cost(u, v, a, b):
        if (u, v, a, b) not in ec:
            ec[u, v, a, b] = rng.uniform(0, 10)
        return ec[u, v, a, b]

    return (lambda v: opts[v]), (lambda v, c: vc[v, c]), edge_cost


GRAPHS = {
    "chain": (list("abcdef"), [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "f")]),
    "diamond": (list("abcd"), [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]),
    "inception": (["in", "b1", "b2a", "b2b", "b3a", "b3b", "cat", "out"],
                  [("in", "b1"), ("in", "b2a"), ("b2a", "b2b"), ("in", "b3a"), ("b3a", "b3b"),
                   ("b1", "cat"), ("b2b", "cat"), ("b3b", "cat"), ("cat", "out")]),
    "skip": (list("abcde"), [("a", "b"), ("b", "c"), ("a", "c"), ("c", "d"), ("b", "e"), ("d", "e")]),
    "against_order": (list("abcd"), [("b", "a"), ("c", "b"), ("a", "d"), ("d", "c")]),
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("seed", range(4))
def test_the_dp_is_exact(name, seed):
    vertices, edges = GRAPHS[name]
    configs, vertex_cost, edge_cost = random_costs(seed, vertices, 4)
    result = min_cost_assignment(vertices, edges, configs, vertex_cost, edge_cost)
    assert result.cost == pytest.approx(brute_force(vertices, edges, configs, vertex_cost, edge_cost), rel=1e-12)
    phi = result.assignment
    recomputed = (sum(vertex_cost(v, phi[v]) for v in vertices)
                  + sum(edge_cost(u, v, phi[u], phi[v]) for u, v in edges))
    assert recomputed == pytest.approx(result.cost, rel=1e-12)
    assert transitions_needed(vertices, edges, lambda v: len(configs(v))) == result.transitions


def test_random_dags_are_exact():
    rng = random.Random(7)
    for trial in range(6):
        n = rng.randint(3, 7)
        vertices = list(range(n))
        edges = [(u, v) for u in range(n) for v in range(u + 1, n) if rng.random() < 0.4]
        configs, vertex_cost, edge_cost = random_costs(100 + trial, vertices, 3)
        result = min_cost_assignment(vertices, edges, configs, vertex_cost, edge_cost)
        assert result.cost == pytest.approx(brute_force(vertices, edges, configs, vertex_cost, edge_cost), rel=1e-12)
        assert transitions_needed(vertices, edges, lambda v, c=configs: len(c(v))) == result.transitions


def test_toy_layer_costs_give_the_pase_structure():
    """Toy costs of PaSE's VGG story: convolutions cheap under a batch split and dear under a
    channel split, fully connected layers the other way round, a switch costs 3: the optimum is
    batch for the convolutions and channels for the fully connected layers (one switch), and a
    dependent set of one vertex on a chain."""
    layers = ["conv1", "conv2", "conv3", "fc1", "fc2"]
    edges = list(zip(layers, layers[1:], strict=False))

    def vertex_cost(v, c):
        conv = v.startswith("conv")
        return {("batch", True): 1.0, ("channels", True): 6.0, ("batch", False): 8.0, ("channels", False): 2.0}[c, conv]

    result = min_cost_assignment(layers, edges, lambda v: ("batch", "channels"), vertex_cost,
                                 lambda u, v, a, b: 0.0 if a == b else 3.0)
    assert result.assignment == {"conv1": "batch", "conv2": "batch", "conv3": "batch", "fc1": "channels",
                                 "fc2": "channels"}
    assert result.cost == 3 * 1.0 + 2 * 2.0 + 3.0
    assert result.max_dependent_set == 1


def test_infinite_costs_rule_configurations_out():
    result = min_cost_assignment(["a", "b"], [("a", "b")], lambda v: (0, 1),
                                 lambda v, c: float("inf") if (v, c) == ("a", 0) else 1.0, lambda u, v, a, b: 0.0)
    assert result.assignment["a"] == 1


def test_bad_graphs_are_errors():
    with pytest.raises(ValueError, match="twice"):
        min_cost_assignment(["a", "a"], [], lambda v: (0,), lambda v, c: 0.0, lambda *a: 0.0)
    with pytest.raises(ValueError, match="outside"):
        min_cost_assignment(["a"], [("a", "z")], lambda v: (0,), lambda v, c: 0.0, lambda *a: 0.0)
    with pytest.raises(ValueError, match="no configuration"):
        min_cost_assignment(["a"], [], lambda v: (), lambda v, c: 0.0, lambda *a: 0.0)
