"""A transformer's parameters and model FLOPs come from its layer graph and nothing else (issue 19:
one description): change the weight shape of one op a block runs, or the ops themselves, and every
count follows — the layer's parameters, ``total_params``, ``active_params``, the simulated result's
``num_parameters``, its model and hardware FLOPs (MFU's numerator). And no runtime module reaches for
the closed forms, which stay as test oracles in validation/closed_forms.py."""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path

import pytest

import simulator.scenario
import workloads.transformer_graph as transformer_graph
from simulator.memory.analytic import stage_params
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.spmd.plan import Planner
from validation import closed_form_activations, closed_forms
from workloads import counting
from workloads.graph import LayerWork, Op, ShardShape
from workloads.schema import MoESpec

sys.path.insert(0, str(Path(__file__).parent))
from test_simulate import TOY_PARAMS, L, S, toy_raw  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXTRA_COLUMNS = 8               # what the perturbed builder adds to one GEMM's weight (its n)
EXTRA_FLOPS = 2.0 * 64 * 64 * 64  # a 64^3 GEMM the perturbed builder adds to every block's forward


def toy(num_gpus: int, tied: bool = False, **parallelism):
    """tests/test_simulate.py's toy GPT under a name of its own: what these tests build from a perturbed
    builder is cached under it, never under a model another test uses."""
    raw = toy_raw(num_gpus, **parallelism)
    return load_scenario(raw | {"model": raw["model"] | {"name": "toy-gpt-perturbed", "tied_embeddings": tied}})


def _clear_caches() -> None:
    transformer_graph.transformer_layer_graph.cache_clear()
    counting.param_counts.cache_clear()
    simulator.scenario._cached_graph.cache_clear()


@pytest.fixture
def fresh_caches():
    _clear_caches()
    yield
    _clear_caches()


def _widened(name: str):
    """``transformer_graph.layer_work`` with op ``name``'s weight EXTRA_COLUMNS wider (its n)."""
    stated = transformer_graph.layer_work

    def work(*a, **kw):
        built = stated(*a, **kw)
        return replace(built, forward=tuple(replace(op, n=op.n + EXTRA_COLUMNS) if op.name == name else op
                                            for op in built.forward))
    return work


def test_block_params_follow_one_ops_weight_shape(monkeypatch, fresh_caches):
    model = toy(1).model
    assert counting.total_params(model) == TOY_PARAMS
    graph = counting.unsharded_graph(model)
    fc1 = next(op for op in graph.layers[1].forward if op.name == "fc1")
    assert graph.layers[1].params == sum(op.params for op in graph.layers[1].forward)
    monkeypatch.setattr(transformer_graph, "layer_work", _widened("fc1"))
    _clear_caches()
    extra = fc1.k * EXTRA_COLUMNS   # the k x n weight of FC1, n + EXTRA_COLUMNS
    assert counting.unsharded_graph(model).layers[1].params == graph.layers[1].params + extra
    assert counting.total_params(model) == TOY_PARAMS + L * extra
    assert counting.active_params(model) == TOY_PARAMS + L * extra
    assert counting.layer_params(model) == closed_forms.layer_params(model).total + extra
    assert simulate(toy(1)).num_parameters == TOY_PARAMS + L * extra


def test_routed_expert_params_follow_the_expert_gemms(monkeypatch, fresh_caches):
    model = toy(1).model.model_copy(update={"moe": MoESpec(num_experts=4, top_k=1)})
    total, active = counting.total_params(model), counting.active_params(model)
    assert (total, active) == (closed_forms.total_params(model), closed_forms.active_params(model))
    block = counting.unsharded_graph(model).layers[1]
    fc1 = next(op for op in block.forward if op.name == "expert_fc1")
    assert fc1.batch == fc1.weights == 4   # one weight per routed expert
    monkeypatch.setattr(transformer_graph, "layer_work", _widened("expert_fc1"))
    _clear_caches()
    extra = fc1.k * EXTRA_COLUMNS   # each expert's FC1 weight EXTRA_COLUMNS wider
    assert counting.unsharded_graph(model).layers[1].expert_params == block.expert_params + 4 * extra
    assert counting.total_params(model) == total + L * 4 * extra
    assert counting.active_params(model) == active + L * extra  # top-1 of 4: one expert's share


def test_model_flops_are_the_sum_of_the_graph_ops(monkeypatch, fresh_caches):
    before = simulate(toy(1))
    stated = transformer_graph.layer_work

    def with_extra_gemm(*a, **kw):
        work = stated(*a, **kw)
        extra = Op("extra", "gemm", flops=EXTRA_FLOPS, m=64, n=64, k=64)
        return replace(work, forward=(*work.forward, extra), backward=(*work.backward, extra, extra))

    monkeypatch.setattr(transformer_graph, "layer_work", with_extra_gemm)
    _clear_caches()
    after = simulate(toy(1))
    # model FLOPs: 3 x forward per block (the transformer's rule); hardware: the ops as run (1 + 2)
    assert after.model_flops_per_step - before.model_flops_per_step == pytest.approx(3 * L * EXTRA_FLOPS, rel=1e-12)
    assert after.hardware_flops_per_step - before.hardware_flops_per_step == pytest.approx(
        3 * L * EXTRA_FLOPS, rel=1e-12)
    flops = counting.step_flops(toy(1).model, S, 1, "full")
    unsplit = toy(1).model.layer_graph(ShardShape(micro_batch=1, seq_length=S))
    assert flops == unsplit.step_flops(1, "full")


def test_graph_sums_follow_a_changed_op():
    graph = toy(1).model.layer_graph(ShardShape(micro_batch=1, seq_length=S))
    counts = counting.counts_of(graph)
    block = graph.layers[2]
    wider = tuple(replace(op, k=op.k + 7) if op.name == "attn_out" else op for op in block.forward)
    changed = replace(graph, layers=(*graph.layers[:2], replace(block, forward=wider), *graph.layers[3:]))
    h = next(op for op in block.forward if op.name == "attn_out").n
    assert changed.layers[2].params == block.params + 7 * h
    assert counting.counts_of(changed).total == counts.total + 7 * h


def test_a_copied_graph_keeps_its_own_sums():
    # dataclasses.replace hands a copy the original's cache dicts: each graph must keep its own
    graph = toy(1).model.layer_graph(ShardShape(micro_batch=1, seq_length=S))
    flops = graph.step_flops(1, "none")
    extra = Op("extra", "gemm", flops=EXTRA_FLOPS, m=64, n=64, k=64)
    block = graph.layers[1]
    copy = replace(graph, layers=(graph.layers[0], replace(block, name="renamed", forward=(*block.forward, extra)),
                                  *(replace(layer, inputs=("renamed",)) if i == 2 else layer
                                    for i, layer in enumerate(graph.layers[2:], 2))))
    assert copy.step_flops(1, "none").model_flops == flops.model_flops + 3 * EXTRA_FLOPS
    assert graph.step_flops(1, "none") == flops
    assert graph.layer("block0") is block and copy.layer("renamed").name == "renamed"
    assert graph.input_bytes(graph.layers[2]) == block.output_bytes


def test_the_tied_embedding_copy_is_the_graphs(monkeypatch, fresh_caches):
    # With tied embeddings and pp > 1 the last stage holds a copy of the word embedding for its LM head
    # (Megatron): its size is the embedding lookup's word table, whatever shape the builder gives it.
    sc = toy(2, tied=True, pp=2, global_batch_size=2)
    before = stage_params(sc.model, sc.parallelism, 1), Planner(sc).stage_params_local(1)
    stated = transformer_graph.embedding_work
    h = sc.model.hidden_size

    def more_rows(*a, **kw):
        built = stated(*a, **kw)
        lookup = replace(built.forward[0], tables=((built.forward[0].tables[0][0] + EXTRA_COLUMNS, h),
                                                   *built.forward[0].tables[1:]))
        return replace(built, forward=(lookup, *built.forward[1:]))

    monkeypatch.setattr(transformer_graph, "embedding_work", more_rows)
    _clear_caches()
    after = stage_params(sc.model, sc.parallelism, 1), Planner(sc).stage_params_local(1)
    extra = EXTRA_COLUMNS * h
    assert after == (before[0] + extra, before[1] + extra)
    assert counting.total_params(sc.model) == closed_forms.total_params(sc.model) + extra  # stage 0's


def test_only_the_builder_reads_whether_embeddings_are_tied():
    readers = [path for path in sorted((ROOT / "simulator").rglob("*.py")) + sorted((ROOT / "workloads").rglob("*.py"))
               if "tied_embeddings" in path.read_text()]
    assert [p.relative_to(ROOT).as_posix() for p in readers] == [
        "workloads/graph.py", "workloads/hf_config.py", "workloads/schema.py"]


def _imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_runtime_modules_do_not_use_the_closed_forms():
    """No module of the simulator or the workloads imports the closed forms (parameters and FLOPs,
    activation bytes) or states one again (a function of the same name); workloads/counting.py's
    functions of the oracles' names are the graph's sums (the tests above)."""
    oracles = {name for module in (closed_forms, closed_form_activations) for name, value in vars(module).items()
               if not name.startswith("_") and callable(value) and getattr(value, "__module__", "") == module.__name__}
    assert {"narayanan_params", "korthikanti_model_flops", "forward_flops_per_sequence", "total_params",
            "activation_bytes_per_layer", "mla_activation_bytes_per_layer", "output_layer_activation_bytes"} <= oracles
    graph_sums = {"layer_params", "total_params", "active_params", "embedding_params", "output_head_params"}
    runtime = sorted((ROOT / "simulator").rglob("*.py")) + sorted((ROOT / "workloads").rglob("*.py"))
    assert len(runtime) > 50
    for path in runtime:
        tree = ast.parse(path.read_text())
        assert not any(name.startswith(("validation.closed_forms", "validation.closed_form_activations"))
                       for name in _imports(tree)), path
        defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
        assert defined & (oracles - graph_sums) == set(), path


def test_the_ops_carry_the_parameter_count():
    """A block's parameters are its ops' (the weight shapes of its GEMMs, biases and norms), stated
    nowhere else: the LayerWork's own field is only the planner's copy of its layer's."""
    model = toy(1).model
    work = transformer_graph.layer_work(model, ShardShape(micro_batch=1, seq_length=S))
    assert isinstance(work, LayerWork) and work.params == 0
    assert sum(op.params for op in work.forward) == counting.layer_params(model) == closed_forms.layer_params(model).total
