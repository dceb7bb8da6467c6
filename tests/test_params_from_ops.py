"""Issue 19, "one layer is described once": a layer's parameters are its ops' — each GEMM's or
convolution's k x n weight(s) and bias, a norm's γ and β, an embedding's table (``Op.params``) — and
no builder states a second number beside them. Perturb one op's weight shape and the layer's and the
model's parameters follow; only a measured profile's layers that name no kernels (a graph.txt's bare
block names) state their parameters, from the file."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from workloads.catalog import MODELS, resolve_model
from workloads.graph import Op, ShardShape
from workloads.layer_graph import Layer, LayerGraph
from workloads.networks.catalog import network_names

ROOT = Path(__file__).resolve().parents[1]


def _graph(name: str, tp: int = 1) -> LayerGraph:
    spec = resolve_model(name)
    return spec.layer_graph(ShardShape(micro_batch=2, seq_length=spec.seq_length or 1, tp=tp, precision="fp32"))


def _with_op(graph: LayerGraph, layer_name: str, op_name: str, **change) -> LayerGraph:
    layers = tuple(replace(layer, forward=tuple(replace(op, **change) if op.name == op_name else op
                                                for op in layer.forward)) if layer.name == layer_name else layer
                   for layer in graph.layers)
    return replace(graph, layers=layers)


@pytest.mark.parametrize("name", sorted(network_names()) + ["gpt-1.7b", "mixtral-8x7b", "deepseek-v3"])
def test_every_built_layer_holds_exactly_what_its_forward_ops_hold(name):
    graph = _graph(name)
    assert graph.total_params() > 0
    for layer in graph.layers:
        assert layer.stated_params == 0, layer.name
        assert layer.params == sum(op.params for op in layer.forward), layer.name
        assert not any(op.params for op in layer.backward), layer.name   # gradients hold no parameters


def test_a_convolutions_weight_shape_sets_the_layer_and_the_model():
    graph = _graph("resnet50")
    conv = graph.layer("layer1.0.conv2")
    (op,) = [op for op in conv.forward if op.params]
    assert (op.k, op.n, op.weights) == (64 * 3 * 3, 64, 1) and conv.params == 64 * 64 * 9   # 3x3, 64 -> 64, no bias
    wider = _with_op(graph, conv.name, op.name, n=op.n + 3)   # three more output channels
    assert wider.layer(conv.name).params == conv.params + 3 * op.k
    assert wider.total_params() == graph.total_params() + 3 * op.k


def test_a_grouped_convolution_holds_one_weight_per_group():
    graph = _graph("resnext101-32x4d")
    conv = next(layer for layer in graph.layers if any(op.batch == 32 and op.params for op in layer.forward))
    (op,) = [op for op in conv.forward if op.params]
    assert op.weights == op.batch == 32 and conv.params == 32 * op.k * op.n
    assert _with_op(graph, conv.name, op.name, k=op.k + 1).total_params() == graph.total_params() + 32 * op.n


def test_an_lstms_recurrent_gemm_holds_one_weight_for_all_its_time_steps():
    graph = _graph("gnmt-16")
    lstm = next(layer for layer in graph.layers if layer.kind == "lstm")
    rec = next(op for op in lstm.forward if op.name.endswith("recurrent_gemm"))
    assert rec.batch > 1 and rec.weights == 1 and rec.bias == rec.n   # W_hh (4H x H) and b_hh, once for T steps
    assert _with_op(graph, lstm.name, rec.name, k=rec.k + 2).layer(lstm.name).params == lstm.params + 2 * rec.n


def test_a_norms_and_an_embeddings_tables_are_their_parameters():
    graph = _graph("bert-large")
    norm = next(layer for layer in graph.layers if layer.kind == "layernorm")
    assert norm.params == 2 * 1024 and norm.forward[0].tables == ((1024,), (1024,))
    embedding = graph.layers[0]
    assert embedding.kind == "embedding" and embedding.forward[0].tables == ((30522, 1024),)
    grown = replace(graph, layers=(replace(embedding, forward=(replace(embedding.forward[0], tables=((30523, 1024),)),)),
                                   *graph.layers[1:]))
    assert grown.total_params() == graph.total_params() + 1024


def test_tensor_parallel_ranks_hold_the_split_weights():
    whole, split = _graph("vit-b-16"), _graph("vit-b-16", tp=2)
    block = next(layer.name for layer in whole.layers if layer.kind == "attention")
    # Q/K/V and the output projection ÷2, the output bias replicated (Megatron)
    assert split.layer(block).params == (4 * 768 * 768 + 3 * 768) / 2 + 768
    assert whole.layer(block).params == 4 * 768 * 768 + 4 * 768


def test_a_transformer_blocks_params_are_its_ops_on_every_rank():
    model = MODELS.get("mixtral-8x7b")
    graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length, tp=2, ep=4))
    block = graph.layers[1]
    experts = [op for op in block.forward if op.name.startswith("expert_") and op.kind == "gemm"]
    assert block.expert_params == sum(op.params for op in experts) > 0
    assert all(op.weights == op.batch == 8 // 4 for op in experts)   # 2 of the 8 experts on each of 4 ep ranks


def test_a_tied_lm_head_holds_no_weight_and_its_pipeline_copy_is_the_table():
    model = MODELS.get("gpt-1.7b")   # tied embeddings, learned positions
    assert model.tied_embeddings
    graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length, tp=2))
    head = next(op for op in graph.layers[-1].forward if op.name == "lm_head")
    assert head.weights == 0 and head.params == 0
    word, positions = graph.layers[0].forward[0].tables
    assert word == (model.vocab_size // 2, model.hidden_size) and positions == (model.seq_length, model.hidden_size)
    assert graph.tied_copy_params == model.vocab_size // 2 * model.hidden_size


def test_a_graph_txt_states_only_the_parameters_its_layer_strings_do_not_give():
    """PipeDream's VGG-16 names every module with its sizes: its ops hold all 138,357,544 parameters
    (each node's equal to its parameter_size / 4, checked as it is read); DAPPLE's AmoebaNet names its
    cells without shapes: they stay the file's."""
    from workloads.networks.profiles import ProfiledModelSpec

    profiles = ROOT / "validation/data/profiles"
    spec = ProfiledModelSpec(name="vgg16-graph", format="pipedream", profile_batch=128,
                             path=str(profiles / "pipedream_vgg16_graph.txt"))
    graph = spec.layer_graph(ShardShape(micro_batch=8, seq_length=1, precision="fp32"))
    assert graph.total_params() == 138_357_544 and sum(layer.stated_params for layer in graph.layers) == 0
    cells = ProfiledModelSpec(name="amoeba", format="pipedream", profile_batch=8,
                              path=str(profiles / "dapple_amoeba-18-pbs-8.txt"))
    graph = cells.layer_graph(ShardShape(micro_batch=8, seq_length=1, precision="fp32"))
    assert graph.total_params() == sum(layer.stated_params for layer in graph.layers) > 0


def test_only_a_profile_states_parameters_beside_the_ops():
    """No runtime module hands a Layer a parameter count of its own (``params`` is derived) and only
    the graph.txt reader states one (``stated_params``)."""
    stating = []
    for path in sorted((ROOT / "workloads").rglob("*.py")) + sorted((ROOT / "simulator").rglob("*.py")):
        text = path.read_text()
        if "params=" not in text:   # no keyword of that name to look at
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and any(kw.arg in ("params", "stated_params", "expert_params")
                                                  for kw in node.keywords):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in ("Layer", "replace"):
                    stating.append((path.relative_to(ROOT).as_posix(), name,
                                    [kw.arg for kw in node.keywords if kw.arg.endswith("params")]))
    assert stating == [("workloads/networks/profiles.py", "Layer", ["stated_params"])]


def test_a_layer_cannot_be_handed_a_parameter_count():
    with pytest.raises(TypeError):
        Layer("fc", "linear", params=12)   # type: ignore[call-arg]
    fc = Layer("fc", "linear", (Op("fc", "gemm", m=2, n=3, k=4, weights=1, bias=3),))
    assert fc.params == 15
    with pytest.raises(ValueError):
        replace(fc, params=1)


def _rank_splits(model):
    """The (tp, sequence parallel, ep, etp) a layout may give ``model`` (simulator/strategies/spmd/layout.py's
    divisibility rules), a few of each."""
    tps = [t for t in (1, 2, 4, 8) if model.num_attention_heads % t == 0 and model.ffn_size % t == 0
           and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]
    eps = [e for e in (1, 2, 8) if model.moe and model.moe.num_experts % e == 0] or [1]
    etps = [e for e in (1, 2) if model.moe and (model.moe.expert_ffn_hidden_size or model.ffn_size) % e == 0] or [1]
    return [(t, sp, e, et) for t in tps for sp in ((False, True) if t > 1 else (False,)) for e in eps for et in etps]


@pytest.mark.parametrize("name", sorted(MODELS.names()))
def test_every_catalog_transformer_rank_holds_the_megatron_split(name):
    """Every rank's view of every catalog transformer (dense, MoE, GQA, MLA, tied embeddings; tp, sequence
    parallel, ep, etp): the ops' weight shapes hold what the Megatron split gives (the closed form,
    validation/closed_forms.py ``params_per_rank``), block by block, embedding, head, tied copy."""
    from validation.closed_forms import params_per_rank

    model = MODELS.get(name)
    for tp, sp, ep, etp in _rank_splits(model):
        graph = model.layer_graph(ShardShape(micro_batch=1, seq_length=model.seq_length, tp=tp,
                                             sequence_parallel=sp, ep=ep, etp=etp))
        oracle = params_per_rank(model, tp, ep, etp)
        where = (name, tp, sp, ep, etp)
        assert graph.layers[0].params == pytest.approx(oracle.embedding, rel=1e-12), where
        assert graph.layers[-1].params == pytest.approx(oracle.head, rel=1e-12), where
        assert graph.tied_copy_params == pytest.approx(oracle.tied_copy, rel=1e-12), where
        for block in graph.pipelined:
            total, experts = oracle.block[block.expert_params > 0]
            assert (block.params, block.expert_params) == (pytest.approx(total, rel=1e-12),
                                                           pytest.approx(experts, rel=1e-12)), (where, block.name)
