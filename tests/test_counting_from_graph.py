"""A transformer's parameters and model FLOPs come from its layer graph and nothing else (issue 19:
one description): change what the builder says a block holds, or the ops it runs, and every count
follows — ``total_params``, ``active_params``, the simulated result's ``num_parameters``, its model
and hardware FLOPs (MFU's numerator). And no runtime module reaches for the closed forms, which stay
as test oracles in validation/closed_forms.py."""

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
EXTRA_PARAMS = 1_000            # what the perturbed builder adds to every block
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


def test_block_params_of_the_graph_are_the_model_count(monkeypatch, fresh_caches):
    model = toy(1).model
    assert counting.total_params(model) == TOY_PARAMS
    stated = transformer_graph.block_params_per_rank
    monkeypatch.setattr(transformer_graph, "block_params_per_rank",
                        lambda *a, **kw: (stated(*a, **kw)[0] + EXTRA_PARAMS, stated(*a, **kw)[1]))
    _clear_caches()
    assert counting.total_params(model) == TOY_PARAMS + L * EXTRA_PARAMS
    assert counting.active_params(model) == TOY_PARAMS + L * EXTRA_PARAMS
    assert counting.layer_params(model) == closed_forms.layer_params(model).total + EXTRA_PARAMS
    assert simulate(toy(1)).num_parameters == TOY_PARAMS + L * EXTRA_PARAMS


def test_routed_expert_params_of_the_graph_set_the_active_count(monkeypatch, fresh_caches):
    model = toy(1).model.model_copy(update={"moe": MoESpec(num_experts=4, top_k=1)})
    total, active = counting.total_params(model), counting.active_params(model)
    assert (total, active) == (closed_forms.total_params(model), closed_forms.active_params(model))
    stated = transformer_graph.block_params_per_rank

    def more_experts(*a, **kw):
        dense, expert = stated(*a, **kw)
        return dense, expert + 4 * EXTRA_PARAMS  # 4 routed experts, each EXTRA_PARAMS larger

    monkeypatch.setattr(transformer_graph, "block_params_per_rank", more_experts)
    _clear_caches()
    assert counting.total_params(model) == total + L * 4 * EXTRA_PARAMS
    assert counting.active_params(model) == active + L * EXTRA_PARAMS  # top-1 of 4: one expert's share


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


def test_graph_sums_follow_a_changed_layer():
    graph = toy(1).model.layer_graph(ShardShape(micro_batch=1, seq_length=S))
    counts = counting.counts_of(graph)
    block = graph.layers[2]
    changed = replace(graph, layers=(*graph.layers[:2], replace(block, params=block.params + 7), *graph.layers[3:]))
    assert counting.counts_of(changed).total == counts.total + 7


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
    # (Megatron): its size is the graph's word embedding, whatever the builder says that is.
    sc = toy(2, tied=True, pp=2, global_batch_size=2)
    before = stage_params(sc.model, sc.parallelism, 1), Planner(sc).stage_params_local(1)
    stated = transformer_graph.word_embedding_params_per_rank
    monkeypatch.setattr(transformer_graph, "word_embedding_params_per_rank", lambda *a: stated(*a) + EXTRA_PARAMS)
    _clear_caches()
    after = stage_params(sc.model, sc.parallelism, 1), Planner(sc).stage_params_local(1)
    assert after == (before[0] + EXTRA_PARAMS, before[1] + EXTRA_PARAMS)
    assert counting.total_params(sc.model) == closed_forms.total_params(sc.model) + EXTRA_PARAMS  # stage 0's


def test_only_the_builder_reads_whether_embeddings_are_tied():
    readers = [path for path in sorted((ROOT / "simulator").rglob("*.py")) + sorted((ROOT / "workloads").rglob("*.py"))
               if "tied_embeddings" in path.read_text()]
    assert [p.relative_to(ROOT).as_posix() for p in readers] == [
        "workloads/hf_config.py", "workloads/schema.py", "workloads/transformer_graph.py"]


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


def test_layer_work_carries_no_parameter_count():
    """The ops of a block (workloads/graph.py) say nothing about its parameters: the builder's Layer does."""
    work = transformer_graph.layer_work(toy(1).model, ShardShape(micro_batch=1, seq_length=S))
    assert isinstance(work, LayerWork) and work.params == 0
