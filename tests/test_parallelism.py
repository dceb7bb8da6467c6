"""The parallel layout (simulator/strategies/spmd/layout.py) and rank numbering (simulator/cost/topology.py)."""

from __future__ import annotations

import pytest

from simulator.cost.topology import Coordinates, RankLayout
from simulator.errors import ConfigError
from simulator.strategies.spmd.layout import (
    Parallelism,
    ceil_div,
    data_parallel_groups_per_node,
    resolve_layout,
    split_layers,
)
from workloads.schema import TransformerSpec

MODEL = TransformerSpec(name="m", num_layers=8, hidden_size=512, num_attention_heads=8, num_kv_heads=4,
                        vocab_size=1000, seq_length=128)


def _resolve(num_gpus: int = 16, model: TransformerSpec = MODEL, **kw) -> Parallelism:
    kw.setdefault("global_batch_size", 64)
    return resolve_layout(Parallelism(**kw), model, num_gpus)


def test_dp_auto_is_inferred():
    par = _resolve(16, tp=2, pp=2)
    assert par.dp == 4 and par.dp_degree == 4
    assert par.num_micro_batches == 64 // (4 * 1)
    assert par.model_parallel_size == 4


def test_dp_explicit_must_match():
    assert _resolve(16, tp=2, pp=2, dp=4).dp == 4
    with pytest.raises(ConfigError) as exc:
        _resolve(16, tp=2, pp=2, dp=2)
    assert exc.value.field == "parallelism"
    assert "16" in str(exc.value)


def test_unresolved_dp_raises():
    with pytest.raises(ConfigError) as exc:
        _ = Parallelism().dp_degree
    assert exc.value.field == "parallelism.dp"


@pytest.mark.parametrize(("kw", "num_gpus", "field"), [
    (dict(tp=3), 12, "parallelism.tp"),                                   # 8 heads
    (dict(tp=1, pp=3), 16, "parallelism"),                                # 3 does not divide 16
    (dict(tp=1, pp=16), 16, "parallelism.pp"),                            # 16 stages > 8 layers
    (dict(tp=1, pp=4, virtual_stages=4, schedule="interleaved"), 16, "parallelism.pp"),
    (dict(tp=1, pp=2, virtual_stages=2), 16, "parallelism.virtual_stages"),
    (dict(tp=1, pp=1, schedule="interleaved"), 16, "parallelism.schedule"),
    (dict(tp=1, ep=2), 16, "parallelism.ep"),
    (dict(tp=1, sequence_parallel=True), 16, "parallelism.sequence_parallel"),
    (dict(tp=1, global_batch_size=24), 16, "parallelism.global_batch_size"),
    (dict(tp=1, pp=4, schedule="interleaved", virtual_stages=2, global_batch_size=8), 16,
     "parallelism.global_batch_size"),  # dp 4, m = 2 not divisible by pp 4
])
def test_layout_errors_name_the_field(kw, num_gpus, field):
    with pytest.raises(ConfigError) as exc:
        _resolve(num_gpus, **kw)
    assert exc.value.field == field


def test_tp_and_kv_heads_must_divide_one_another():
    model = TransformerSpec(name="m", num_layers=4, hidden_size=768, num_attention_heads=12, num_kv_heads=4,
                            vocab_size=100, seq_length=64)
    with pytest.raises(ConfigError) as exc:
        _resolve(6, model=model, tp=6, global_batch_size=6)   # 6 ∤ 4 and 4 ∤ 6
    assert exc.value.field == "parallelism.tp" and "kv heads" in str(exc.value)
    assert _resolve(2, model=model, tp=2, global_batch_size=2).tp == 2   # 2 | 4
    assert _resolve(8, tp=8, global_batch_size=8).tp == 8   # 8 heads, 4 kv heads: 4 | 8, KV replicated


def test_tp_must_divide_ffn():
    model = TransformerSpec(name="m", num_layers=4, hidden_size=256, num_attention_heads=8, ffn_hidden_size=700,
                            vocab_size=100, seq_length=64)
    with pytest.raises(ConfigError) as exc:
        _resolve(8, model=model, tp=8, global_batch_size=8)   # 700 / 8 not integral
    assert exc.value.field == "parallelism.tp"


@pytest.mark.parametrize("field", ["tp", "pp", "cp", "ep", "virtual_stages", "micro_batch_size",
                                   "global_batch_size", "gradient_bucket_mb"])
def test_non_positive_sizes_rejected(field):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Parallelism(**{field: 0})
    with pytest.raises(ValidationError):
        Parallelism(**{field: -1})


def test_unknown_layout_key_rejected():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Parallelism(tensor_parallel=2)


@pytest.mark.parametrize(("layers", "chunks", "expected"), [
    (126, 16, [7] + [8] * 14 + [7]),     # Llama-3-405B on 16 stages
    (10, 4, [2, 3, 3, 2]),
    (8, 4, [2, 2, 2, 2]),
    (9, 4, [2, 2, 3, 2]),                # base 2, 1 extra: 3 of the 4 chunks give one back: ends first
    (11, 4, [2, 3, 3, 3]),               # base 2, 3 extra: only the first chunk gives one back
    (96, 16, [6] * 16),
    (5, 5, [1] * 5),
    (3, 1, [3]),
])
def test_split_layers(layers, chunks, expected):
    counts = split_layers(layers, chunks)
    assert counts == expected
    assert sum(counts) == layers
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize(("layers", "chunks"), [(4, 5), (4, 0), (4, -1)])
def test_split_layers_rejects_impossible_splits(layers, chunks):
    with pytest.raises(ConfigError):
        split_layers(layers, chunks)


def test_rank_numbering_tp_innermost():
    # tp 2, cp 1, dp 4, pp 2 (16 ranks): rank = tp + 2·(dp + 4·pp)
    par = _resolve(16, tp=2, pp=2)
    layout = RankLayout(par)
    assert layout.world == 16
    assert layout.rank(Coordinates(tp=1, cp=0, dp=3, pp=1)) == 1 + 2 * (3 + 4 * 1) == 15
    for r in range(16):
        assert layout.rank(layout.coords(r)) == r
    assert layout.group(5, "tp") == (4, 5)
    assert layout.group(5, "dp") == (1, 3, 5, 7)
    assert layout.group(5, "pp") == (5, 13)
    assert layout.group(5, "embedding") == (5, 13)
    assert layout.representative(0) == 0 and layout.representative(1) == 8
    with pytest.raises(ValueError):
        layout.group(0, "xx")


def test_rank_numbering_with_cp():
    # tp 2, cp 2, dp 2, pp 2: rank = tp + 2·(cp + 2·(dp + 2·pp))
    par = _resolve(16, tp=2, cp=2, pp=2, dp=2)
    layout = RankLayout(par)
    assert layout.group(0, "cp") == (0, 2)
    assert layout.group(0, "dp") == (0, 4)
    assert layout.group(0, "pp") == (0, 8)


def test_data_parallel_groups_per_node():
    # 8 GPUs per node: tp 2 -> 4 dp members share a node (capped by dp); tp 8 -> 1.
    assert data_parallel_groups_per_node(_resolve(16, tp=2, pp=2), 8) == 4
    assert data_parallel_groups_per_node(_resolve(16, tp=8, pp=1), 8) == 1
    assert data_parallel_groups_per_node(_resolve(16, tp=1, pp=8), 8) == 2   # dp 2 < 8
    assert ceil_div(7, 2) == 4 and ceil_div(8, 2) == 4
