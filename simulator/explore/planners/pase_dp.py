"""PaSE's dynamic program over per-vertex configurations (Elango 2021, "PaSE: Parallelization
Strategies for Efficient DNN Training", IPDPS 2021, Sec. IV), generic over a cost callback.

The problem (Sec. III): a computation graph G = (V, E); every vertex v takes one configuration
φ(v) from its set C(v); the cost of a strategy φ is

    F(G, φ) = Σ_{v ∈ V} t_l(v, φ(v)) + Σ_{(u, v) ∈ E} t_x(u, v, φ(u), φ(v))

(t_l: the layer's time under its configuration; t_x: the data movement between two vertices'
configurations). PaSE finds the minimum exactly with a dynamic program over an ordering
v_1..v_n of the vertices: after deciding v_1..v_i only the configurations of the *dependent set*
D_i = {u ∈ {v_1..v_i} : u has a neighbour in {v_{i+1}..v_n}} can still change the cost of what
is left, so the table keeps, for every assignment of D_i, the least cost of the decided prefix
(Sec. IV-A, recurrence (3)). Its size is Π_{u ∈ D_i} |C(u)|: small for chains (|D_i| = 1) and for
the branches of Inception-like blocks when the ordering keeps them short (PaSE's GenerateSeq,
Sec. IV-B, orders breadth-first and picks the vertex that adds least to D; the ordering here is
the caller's, by default the graph's topological order).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DpResult:
    """The optimal assignment, its cost, and the work it took (table entries, transitions)."""

    cost: float
    assignment: dict[Hashable, Hashable]
    states: int
    transitions: int
    max_dependent_set: int


def min_cost_assignment(
    vertices: Sequence[Hashable],
    edges: Sequence[tuple[Hashable, Hashable]],
    configs: Callable[[Hashable], Sequence[Hashable]],
    vertex_cost: Callable[[Hashable, Hashable], float],
    edge_cost: Callable[[Hashable, Hashable, Hashable, Hashable], float],
) -> DpResult:
    """Minimise Σ vertex_cost(v, φ(v)) + Σ_{(u, v)} edge_cost(u, v, φ(u), φ(v)) over φ, exactly.

    ``vertices``: the processing order (every vertex once). ``edges``: (u, v) pairs among them, in
    any direction relative to the order. ``configs(v)``: v's candidate configurations (hashable,
    at least one). A cost may be ``inf`` (a configuration a vertex cannot take)."""
    index = {v: i for i, v in enumerate(vertices)}
    if len(index) != len(vertices):
        raise ValueError("a vertex appears twice in the order")
    neighbours: dict[Hashable, list[Hashable]] = {v: [] for v in vertices}
    directed: dict[tuple[Hashable, Hashable], int] = {}  # (u, v) -> how many edges u -> v
    for u, v in edges:
        if u not in index or v not in index:
            raise ValueError(f"edge ({u}, {v}) names a vertex outside the order")
        if u == v:
            raise ValueError(f"edge ({u}, {v}) is a loop")
        neighbours[u].append(v)
        neighbours[v].append(u)
        directed[u, v] = directed.get((u, v), 0) + 1
    last_neighbour = {v: max((index[w] for w in neighbours[v]), default=-1) for v in vertices}
    options = {v: tuple(configs(v)) for v in vertices}
    for v, opts in options.items():
        if not opts:
            raise ValueError(f"vertex {v} has no configuration")

    # The table works on each configuration's position in options[v] (hashing an int, not a configuration: the
    # per-layer planners' configurations are frozen pydantic models, whose hash is recomputed on every lookup).
    # Equal configurations share the position of the first (``canon``), as they shared one dict key before.
    canon = {}
    for v, opts in options.items():
        first: dict[Hashable, int] = {}
        canon[v] = tuple(first.setdefault(c, j) for j, c in enumerate(opts))

    # table: assignment of the dependent set (a tuple of positions aligned with `frontier`) -> (cost, backpointer)
    frontier: tuple[Hashable, ...] = ()
    table: dict[tuple, tuple[float, tuple | None, int | None]] = {(): (0.0, None, None)}
    history: list[tuple[tuple[Hashable, ...], dict]] = []
    states = transitions = max_d = 0
    for i, v in enumerate(vertices):
        earlier = [(k, u, directed.get((u, v), 0), directed.get((v, u), 0))
                   for k, u in enumerate(frontier) if u in neighbours[v]]
        # edges from v to vertices already decided are priced now; the others when their end comes
        new_members = [u for u in frontier if last_neighbour[u] > i] + ([v] if last_neighbour[v] > i else [])
        keep = [frontier.index(u) for u in new_members if u != v]
        new_frontier = tuple(new_members)
        new_table: dict[tuple, tuple[float, tuple | None, int | None]] = {}
        opts, ids = options[v], canon[v]
        own: dict[int, float] = {}
        for j, c in enumerate(opts):
            own[ids[j]] = vertex_cost(v, c)
        v_kept = v in new_frontier
        edge_memo: dict[tuple, float] = {}
        for state, (cost, _, _) in table.items():
            for j, c in enumerate(opts):
                transitions += 1
                cid = ids[j]
                total = cost + own[cid]
                for k, u, into_v, out_of_v in earlier:
                    pair = (k, state[k], cid)
                    price = edge_memo.get(pair)
                    if price is None:  # each edge's cost once per pair of configurations, not per state
                        a = options[u][state[k]]
                        price = ((into_v * edge_cost(u, v, a, c) if into_v else 0.0)
                                 + (out_of_v * edge_cost(v, u, c, a) if out_of_v else 0.0))
                        edge_memo[pair] = price
                    total += price
                key = tuple(state[k] for k in keep) + ((cid,) if v_kept else ())
                best = new_table.get(key)
                if best is None or total < best[0]:
                    new_table[key] = (total, state, j)
        history.append((frontier, new_table))
        frontier, table = new_frontier, new_table
        states += len(table)
        max_d = max(max_d, len(frontier))
    (cost, _, _), = table.values()  # the last dependent set is empty: one entry
    # walk the backpointers
    assignment: dict[Hashable, Hashable] = {}
    key: tuple = ()
    for i in range(len(vertices) - 1, -1, -1):
        _, step_table = history[i]
        _, previous_state, choice = step_table[key]
        assignment[vertices[i]] = options[vertices[i]][choice]
        key = previous_state
    return DpResult(cost, assignment, states, transitions, max_d)


def transitions_needed(vertices: Sequence[Hashable], edges: Sequence[tuple[Hashable, Hashable]],
                       counts: Callable[[Hashable], int]) -> int:
    """The transitions :func:`min_cost_assignment` will make (``counts(v)``: how many configurations
    v has), without making them: step i visits every assignment of the dependent set D_{i-1} (the
    table holds all of them) times v_i's configurations, Σ_i Π_{u ∈ D_{i-1}} |C(u)| · |C(v_i)|.
    A planner checks it before a dynamic program it could not finish (U-Net's skip connections
    keep five layers in D at its bottleneck)."""
    index = {v: i for i, v in enumerate(vertices)}
    last_neighbour = dict.fromkeys(vertices, -1)
    for u, v in edges:
        last_neighbour[u] = max(last_neighbour[u], index[v])
        last_neighbour[v] = max(last_neighbour[v], index[u])
    frontier: list[Hashable] = []
    total = 0
    for i, v in enumerate(vertices):
        size = counts(v)
        for u in frontier:
            size *= counts(u)
        total += size
        frontier = [u for u in frontier if last_neighbour[u] > i] + ([v] if last_neighbour[v] > i else [])
    return total
