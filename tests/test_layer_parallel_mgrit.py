"""The layer_parallel_mgrit kind (Günther et al. 2020; MGRIT, Falgout et al. 2014): an exact
timeline on a toy chain, the speed-up's shape with ranks, memory, bad input through the CLI.

Toy (tests/test_graph_simulate.py): 256-wide linear layers marked as residual blocks
(``kind: mlp_block``); a block's forward, its adjoint step (input gradient) and its weight
gradient each take one GEMM of C = 67.108864 us. A state sent between ranks (256 x 256 bf16 =
131,072 B on NVLink at 1e12 GB/s, ~1e-16 s) costs its latency x; the optimizer ~1e-13 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from graph_models import ChainSpec
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_graph_simulate import C, chain_scenario

from simulator.engine.engine import Engine
from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate
from simulator.strategies.layer_parallel_mgrit import LayerParallelMgritConfig, compile_mgrit, memory_mgrit

ROOT = Path(__file__).resolve().parents[1]
X = 10e-6  # the toy's NVLink latency: one state send


def _toy(blocks: int, ranks: int, latency_us: float = 10.0, **cfg):
    sc = chain_scenario(ranks, ChainSpec(widths=(256,) * blocks, kind="mlp_block"), nvl_latency_us=latency_us,
                        pp=ranks, global_batch_size=1)
    return replace(sc, strategy=LayerParallelMgritConfig(**cfg))


TOY = {"coarsening_factor": 2, "levels": 2, "forward_iterations": 1, "backward_iterations": 1}


def _timed(sc) -> dict[str, tuple[float, float]]:
    plan = compile_mgrit(sc)
    Engine(plan.topology.port_capacity).run(plan.streams, {})
    return {f"{actor}/{t.name}": (t.start_s / C, t.end_s / C) for (actor, _), ts in plan.streams.items() for t in ts}


def test_toy_v_cycle_timeline_8_blocks_2_ranks_coarsening_2():
    # Blocks 0-3 on rank 0, 4-7 on rank 1; states u0..u8, C-points 0, 2, 4, 6, 8 (u4 on rank 1).
    # Times in C, x = 0.149 C (10 us):
    #  F-relax    r0: u1, u3 [0, 2]        r1: u5, u7 [0, 2]
    #  C-relax    r0: u2, u4 [2, 4], u4 sent [4, 4 + x]            r1: u6, u8 [2, 4]
    #  F-relax    r0: u1, u3 [4, 6]        r1: u5 waits for u4: [4 + x, 5 + x], u7 [5 + x, 6 + x]
    #  FAS rhs    r0: residual at 2, coarse step 0, residual at 4, coarse step 1 [6, 10] (the last two sent)
    #             r1: residual at 6, coarse step 2, residual at 8, coarse step 3 [6 + x, 10 + x]
    #  coarse     serial: r0 steps 0, 1 [10, 12], sent [12, 12 + x]; r1 steps 2, 3 [12 + x, 14 + x]
    #  interp     r0: u1, u3 [12, 14]      r1: u5, u7 [14 + x, 16 + x]
    # The forward solve ends at 16C + x; the adjoint solve mirrors it (rank 1 starts the reversed
    # chain, rank 0 ends it): 16C + x; then rank 0's 4 weight gradients: 4C. Without residual
    # norms the step is 36C + 2x.
    x = X / C
    t = _timed(_toy(8, 2, residual_norm=False, **TOY))
    assert t["rank0/F.step0.mb0.it0.C.L0.s3.out"] == pytest.approx((4, 4 + x))
    assert t["rank1/F.step0.mb0.it0.F2.L0.s4"] == pytest.approx((4 + x, 5 + x))
    assert t["rank1/F.step0.mb0.it0.tau.L1.s3"] == pytest.approx((9 + x, 10 + x))
    assert t["rank0/F.step0.mb0.it0.coarse.L1.s1"] == pytest.approx((11, 12))
    assert t["rank1/F.step0.mb0.it0.coarse.L1.s3"] == pytest.approx((13 + x, 14 + x))
    assert t["rank1/F.step0.mb0.it0.interp.L0.s6"] == pytest.approx((15 + x, 16 + x))
    assert t["rank0/wgrad.step0.mb0"] == pytest.approx((32 + 2 * x, 36 + 2 * x))
    r = simulate(_toy(8, 2, residual_norm=False, **TOY))
    assert r.step_time_s == pytest.approx(36 * C + 2 * X, rel=1e-9)
    assert r.extra["mgrit_coarse_points"] == 4
    # with XBraid's residual norm after each V-cycle: an all-reduce over 2 ranks, 2(n-1)·x each
    assert simulate(_toy(8, 2, **TOY)).step_time_s == pytest.approx(36 * C + 6 * X, rel=1e-9)


def test_serial_reference_and_speedup_are_read_from_the_same_prices():
    r = simulate(_toy(8, 2, **TOY))
    assert r.extra["mgrit_serial_step_s"] == pytest.approx(8 * 3 * C, rel=1e-9)
    assert r.extra["mgrit_speedup"] == pytest.approx(24 * C / r.step_time_s, rel=1e-9)


def test_speedup_grows_with_ranks_until_the_coarse_level_dominates():
    # A deep chain of 256 blocks, c = 4, 2 forward and 1 backward V-cycles, 2 us per send. The
    # speed-up over the serial forward + backward (3 GEMMs per block) grows with ranks, each
    # doubling gains less, and it stays under the bound of the serial coarse sweeps:
    # serial / ((2 + 1) · 256/4 · C) = 3·256 / 192 = 4.
    speedups = []
    for ranks in (2, 4, 8, 16, 32, 64):
        r = simulate(_toy(256, ranks, latency_us=2.0, coarsening_factor=4, levels=2,
                          forward_iterations=2, backward_iterations=1))
        speedups.append(r.extra["mgrit_speedup"])
    assert all(b > a for a, b in zip(speedups, speedups[1:], strict=False)), speedups
    gains = [b / a for a, b in zip(speedups, speedups[1:], strict=False)]
    assert all(g2 < g1 for g1, g2 in zip(gains, gains[1:], strict=False)), gains
    assert speedups[0] < 1 < speedups[-1] < 4, speedups


def test_a_third_level_shortens_the_serial_sweep():
    two = simulate(_toy(256, 64, latency_us=2.0, coarsening_factor=4, levels=2))
    three = simulate(_toy(256, 64, latency_us=2.0, coarsening_factor=4, levels=3))
    assert three.extra["mgrit_coarse_points"] == 16 and two.extra["mgrit_coarse_points"] == 64
    assert three.step_time_s < two.step_time_s


def test_memory_splits_the_parameters_over_the_ranks():
    # 8 blocks of 65,536 parameters, 4 per rank: 2 B weights, 2 B (bf16) gradients, 12 B Adam each;
    # activations: the 4 blocks' kept inputs (256 x 256 bf16 = 131,072 B each) and, for the coarse
    # level (C-points 0, 2, 4, 6, 8: rank 0 owns 0 and 2), two 131,072 B states per coarse point.
    stage, peak, ranks = memory_mgrit(_toy(8, 2, **TOY))
    assert len(ranks) == 2
    for r in ranks:
        assert (r.weights_bytes, r.gradients_bytes, r.optimizer_bytes) == (4 * 65_536 * 2, 4 * 65_536 * 2,
                                                                           4 * 65_536 * 12)
    assert ranks[0].activations_bytes == 4 * 131_072 + 2 * 2 * 131_072
    assert ranks[1].activations_bytes == 4 * 131_072 + 3 * 2 * 131_072
    assert stage == 1 and peak is ranks[1]


def test_many_steps_repeat_the_step():
    sc = _toy(8, 2, **TOY)
    r = simulate(replace(sc, simulation=sc.simulation.model_copy(update={"steps": 3})))
    assert r.steps == 3 and r.step_times_s == pytest.approx([36 * C + 6 * X] * 3, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(blocks=st.sampled_from([8, 12, 16, 24, 32]), ranks=st.sampled_from([1, 2, 4, 8]), c=st.sampled_from([2, 3, 4]),
       levels=st.sampled_from([2, 3]), relaxation=st.sampled_from(["F", "FCF"]), fi=st.integers(1, 3),
       bi=st.integers(1, 2))
def test_evaluations_follow_the_v_cycle_count_and_no_speedup_beats_the_ranks(blocks, ranks, c, levels, relaxation,
                                                                           fi, bi):
    # A V-cycle evaluates 3 N_l blocks on every level l but the coarsest with FCF (F: (c-1)/c N_l,
    # C: N_l/c, F again, residual N_l/c, coarse FAS step N_l/c, interpolation (c-1)/c N_l), 2 N_l
    # with F relaxation, and N_(L-1) on the coarsest. MGRIT never evaluates fewer blocks than the
    # serial sweep, so its step is at least the serial one over the ranks; and never shorter than
    # its serial coarse sweeps.
    try:
        sc = _toy(blocks, ranks, latency_us=1.0, coarsening_factor=c, levels=levels, relaxation=relaxation,
                  forward_iterations=fi, backward_iterations=bi)
        r = simulate(sc)
    except ConfigError:
        assume(False)
    points = [blocks // c**level for level in range(levels)]
    per_cycle = (3 if relaxation == "FCF" else 2) * sum(points[:-1]) + points[-1]
    assert r.extra["mgrit_layer_evaluations_per_step"] == (fi + bi) * per_cycle
    assert r.extra["mgrit_speedup"] <= ranks * (1 + 1e-9)
    assert r.step_time_s >= (fi + bi) * points[-1] * C * (1 - 1e-9)


RESNET = {"model": "resnet152", "cluster": {"node": "dgx-a100-80g", "num_gpus": 5},
          "parallelism": {"pp": 5, "micro_batch_size": 8, "global_batch_size": 8}, "training": {"precision": "bf16"}}


def _cli(tmp_path: Path, raw: dict, *extra: str):
    path = tmp_path / "mgrit.yaml"
    path.write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "simulator", "simulate", str(path), "--json", *extra],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize(("change", "field"), [
    ({"strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 1}}, "strategy.coarsening_factor"),
    ({"strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 3}}, "strategy.coarsening_factor"),
    ({"strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 5},
      "cluster": {"node": "dgx-a100-80g", "num_gpus": 4},
      "parallelism": {"pp": 4, "micro_batch_size": 8, "global_batch_size": 8}}, "parallelism.pp"),
    ({"strategy": {"kind": "layer_parallel_mgrit", "forward_iterations": 0}}, "strategy.forward_iterations"),
    ({"strategy": {"kind": "layer_parallel_mgrit"}, "model": "vgg16",
      "parallelism": {"pp": 5, "micro_batch_size": 8, "global_batch_size": 8}}, "model"),
])
def test_bad_input_is_an_error_naming_the_field(change, field):
    with pytest.raises(ConfigError) as caught:
        simulate(load_scenario({**RESNET, **change}))
    assert caught.value.field == field


def test_mixed_clusters_are_refused():
    mixed = {**RESNET, "cluster": {"groups": [{"node": "dgx-a100-80g", "nodes": 1}, {"node": "g4dn-12xlarge", "nodes": 2}]},
             "parallelism": {"pp": 2, "dp": 8, "micro_batch_size": 8, "global_batch_size": 64},
             "training": {"precision": "fp16"}, "strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 5}}
    with pytest.raises(ConfigError) as caught:
        simulate(load_scenario(mixed))
    assert caught.value.field == "cluster.groups"


def test_bad_input_exits_2_with_one_line(tmp_path):
    proc = _cli(tmp_path, {**RESNET, "strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 1}})
    assert proc.returncode == 2, proc.stderr
    assert "strategy.coarsening_factor" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_runs_resnet152_for_many_steps(tmp_path):
    proc = _cli(tmp_path, {**RESNET, "strategy": {"kind": "layer_parallel_mgrit", "coarsening_factor": 5}},
                "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # no barrier between steps: a rank starts the next step once its own update is done, so the
    # second step (from the first's end) is no longer than the first
    first, second = result["step_times_s"]
    assert result["steps"] == 2 and 0 < second <= first * (1 + 1e-9)
    assert first + second == pytest.approx(result["makespan_s"], rel=1e-9)
    assert result["mgrit_blocks"] == 50 and result["mgrit_coarse_points"] == 10
