"""The swarm kind (SWARM parallelism, Ryabinin et al. 2023): exact timelines on toy swarms, the
bottleneck pool's throughput, a preempted peer's micro-batch redone on another peer, the same seed
giving the same run bit for bit, the square-cube trend, memory per peer, bad input naming the field.

Toy swarms: one GPU per node (every peer its own machine), an inline accelerator and a NIC whose
rate is set per test; pass times, wire bytes and optimizer times are read from the result (the
spmd planner prices them; tests/test_simulate.py checks those prices) and the tests check how the
swarm schedules them.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.scenario import load_scenario
from simulator.simulate import simulate

ACCELERATOR = {
    "name": "toy-t4", "vendor": "toy", "peak_tflops": {"fp32": 8.1, "fp16": 65}, "hbm_gib": 16,
    "hbm_bandwidth_gb_per_s": 320, "tdp_watts": 70,
    "efficiency": {"gemm_curve": [{"gflop": 0.002, "efficiency": 0.1}, {"gflop": 200.0, "efficiency": 0.7}],
                   "memory_bound_efficiency": 0.8, "kernel_launch_overhead_us": 4, "source": "toy"},
    "source": "toy",
}


def node(nic_gbit_per_s: float) -> dict:
    return {"name": "toy-peer", "accelerator": ACCELERATOR, "gpus_per_node": 1,
            "intra_node": {"kind": "pcie", "bandwidth_per_gpu_gb_per_s": 16, "latency_us": 5,
                           "collective_efficiency": 0.8, "source": "toy"},
            "nics_per_node": 1, "nic_bandwidth_gbit_per_s": nic_gbit_per_s, "nic_efficiency": 1.0,
            "nic_latency_us": 100, "host_memory_gib": 64, "source": "toy"}


def swarm_raw(peers=(1, 1), hidden=1024, layers=4, batch=8, nic_gbit_per_s=100.0, steps=1, **strategy) -> dict:
    return {
        "model": {"name": f"toy-h{hidden}", "num_layers": layers, "hidden_size": hidden, "num_attention_heads": 16,
                  "vocab_size": 8192, "seq_length": 512},
        "cluster": {"node": node(nic_gbit_per_s), "fabric": "fat-tree", "num_gpus": sum(peers)},
        "strategy": {"kind": "swarm", "peers_per_stage": list(peers), **strategy},
        "parallelism": {"pp": len(peers), "micro_batch_size": 1, "global_batch_size": batch},
        "training": {"precision": "fp16"},
        "simulation": {"steps": steps},
    }


def run(raw):
    return simulate(load_scenario(raw))


def prices(r):
    x = r.extra
    send_s = x["swarm_link_latency_s"] + x["swarm_boundary_bytes"][0] / x["swarm_link_bytes_per_s"]
    return x["swarm_forward_s_per_stage"], x["swarm_backward_s_per_stage"], x["swarm_optimizer_s_per_stage"], send_s


def tasks(r, actor=None):
    return [e for e in r.timeline if actor is None or e.rank_class == actor]


# ------------------------------------------------------------------ exact timelines, throughput


def test_one_peer_per_stage_exact_timeline():
    # Stage 1's peer runs at half speed: it is the bottleneck, busy from the first activation's
    # arrival (stage 0's forward + one send) for m·(F1 + B1)/0.5 (a backward runs as soon as its
    # forward ends on the last stage); then the last gradient's send, stage 0's last backward and
    # its optimizer step end the step (stage 1 steps its optimizer meanwhile). One peer per stage
    # averages nothing.
    m = 8
    r = run(swarm_raw(batch=m, peer_speeds=[[1.0], [0.5]]))
    (f0, f1), (b0, b1), (opt0, opt1), c = prices(r)
    busy_until = f0 + c + m * (f1 + b1) / 0.5
    assert r.step_time_s == pytest.approx(max(busy_until + c + b0 + opt0, busy_until + opt1 / 0.5), rel=1e-12)
    assert r.extra["swarm_dispatch_makespan_s"] == pytest.approx(r.step_time_s, rel=1e-12)  # nothing contends
    # the bottleneck pool's throughput is the swarm's between fill and drain
    assert r.extra["swarm_bottleneck_stage"] == 1
    assert r.extra["swarm_pool_throughput_samples_per_s"][1] == pytest.approx(0.5 / (f1 + b1), rel=1e-12)
    stage1 = [e for e in tasks(r, "peer1") if e.stream == "compute" and e.category == "compute"]
    assert stage1[0].start_s == pytest.approx(f0 + c, rel=1e-12)
    assert stage1[-1].end_s - stage1[0].start_s == pytest.approx(m / r.extra["swarm_pool_throughput_samples_per_s"][1],
                                                                 rel=1e-12)
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


def test_two_peers_in_the_bottleneck_stage_each_busy_for_its_share():
    # Stage 1 has two half-speed peers fed by one fast stage-0 peer: every activation reaches them
    # long before they are free, so each is busy from its first arrival for (its micro-batches) x
    # (F1 + B1)/0.5 without a gap; the wiring shares the 32 micro-batches at random (seeded).
    m = 32
    r = run(swarm_raw(peers=(1, 2), batch=m, peer_speeds=[[1.0], [0.5, 0.5]], seed=3))
    (f0, f1), (b0, b1), _, c = prices(r)
    loads = []
    for actor in ("peer1", "peer2"):
        passes = [e for e in tasks(r, actor) if e.stream == "compute" and e.category == "compute"]
        loads.append(len(passes) // 2)
        assert passes[-1].end_s - passes[0].start_s == pytest.approx(loads[-1] * (f1 + b1) / 0.5, rel=1e-9)
    assert sum(loads) == m and min(loads) > 0
    # pool throughput: the two together pass m samples in max(load)·(F1+B1)/0.5, at least m / pool throughput
    pool = r.extra["swarm_pool_throughput_samples_per_s"][1]
    assert pool == pytest.approx(2 * 0.5 / (f1 + b1), rel=1e-12)
    assert max(loads) * (f1 + b1) / 0.5 >= m / pool * (1 - 1e-12)


@pytest.mark.parametrize("victim_index, redone", [(2, ["F", "B"]), (3, ["F.redo", "B"])])
def test_a_preempted_peer_s_micro_batch_is_redone_on_another_peer(victim_index, redone):
    # Peer 1 (stage 1 of 2, two peers there) runs F.mb2 then B.mb2 as its third and fourth passes. It
    # is preempted in the middle of one of them and does not return within the step: that pass is cut
    # short (.aborted) and micro-batch 2 is redone on peer 2 -- its input resent by stage 0; a lost
    # backward redoes the forward first (the activations went with peer 1). The step takes longer.
    m = 16
    base = swarm_raw(peers=(1, 2), batch=m, peer_speeds=[[1.0], [0.5, 0.5]], seed=3)
    clean = run(base)
    passes = [e for e in tasks(clean, "peer1") if e.stream == "compute" and e.category == "compute"]
    assert [e.name for e in passes[2:4]] == ["s0.F.mb2.st1", "s0.B.mb2.st1"]
    victim = passes[victim_index]
    down_at = (victim.start_s + victim.end_s) / 2
    raw = copy.deepcopy(base)
    raw["strategy"]["outages"] = [{"peer": 1, "down_at_s": down_at, "up_at_s": 1e6}]
    failed = run(raw)
    aborted = [e for e in tasks(failed, "peer1") if e.name.endswith(".aborted")]
    assert [e.name for e in aborted] == [victim.name + ".aborted"]
    assert aborted[0].start_s == pytest.approx(victim.start_s, rel=1e-12)
    assert aborted[0].end_s == pytest.approx(down_at, rel=1e-12)
    assert not [e for e in tasks(failed, "peer1") if e.start_s > down_at and e.category == "compute"]
    again = [e for e in tasks(failed, "peer2") if ".mb2." in e.name and e.category == "compute"]
    assert [e.name.split(".mb2")[0].removeprefix("s0.") for e in again] == redone
    assert again[0].start_s >= down_at
    resends = [e for e in tasks(failed, "peer0") if e.name.startswith("s0.mb2.send_act")]
    assert len(resends) == 2 and resends[1].start_s >= down_at  # to peer 1, then again to peer 2
    assert failed.extra["swarm_aborted_passes"] == 1 and failed.extra["swarm_preemptions"] == 1
    assert failed.step_time_s > clean.step_time_s


def test_a_returning_peer_downloads_its_stage_before_working_again():
    # every micro-batch of step 0 is wired while peer 2 is away; in step 1 it works again, after its download
    raw = swarm_raw(peers=(1, 2), batch=16, peer_speeds=[[1.0], [0.5, 0.5]], seed=3, steps=2,
                    outages=[{"peer": 2, "down_at_s": 0.01, "up_at_s": 0.05}])
    r = run(raw)
    down = [e for e in tasks(r, "peer2") if "rejoin_download" in e.name]
    assert len(down) == 1 and down[0].start_s >= 0.05
    later = [e for e in tasks(r, "peer2") if e.category == "compute" and e.start_s > 0.01]
    assert later and all(e.start_s >= down[0].end_s for e in later)


# ------------------------------------------------------------------ reproducibility


def test_same_seed_same_run_bit_for_bit():
    raw = swarm_raw(peers=(2, 3), batch=24, steps=3, peer_speeds=[[1.0, 0.6], [1.0, 0.8, 0.5]], seed=11,
                    preemptions_per_hour=3600.0, mean_downtime_s=0.02, rebalance_every_steps=1, averaging="gossip")
    a, b = run(raw), run(copy.deepcopy(raw))
    assert a.step_times_s == b.step_times_s
    assert [(e.rank_class, e.name, e.start_s, e.end_s) for e in a.timeline] == \
        [(e.rank_class, e.name, e.start_s, e.end_s) for e in b.timeline]
    assert a.extra["swarm_preemptions"] > 0  # the process drew some
    other = run({**raw, "strategy": {**raw["strategy"], "seed": 12}})
    assert [(e.rank_class, e.name) for e in other.timeline] != [(e.rank_class, e.name) for e in a.timeline]


def test_many_steps_and_rebalancing_move_a_peer_to_the_slow_stage():
    # stage 1's two peers are slow: after step 0, one of stage 0's three peers moves there and
    # downloads stage 1's parameters first.
    r = run(swarm_raw(peers=(3, 2), batch=12, steps=3, peer_speeds=[[1.0, 1.0, 1.0], [0.3, 0.3]],
                      rebalance_every_steps=1))
    assert r.steps == 3 and len(r.step_times_s) == 3
    assert r.extra["swarm_moves"][0] == {"step": 1, "peer": 0, "from_stage": 0, "to_stage": 1} or \
        r.extra["swarm_moves"][0]["to_stage"] == 1
    assert r.extra["swarm_final_peers_per_stage"] == [2, 3]
    moved = r.extra["swarm_moves"][0]["peer"]
    download = [e for e in tasks(r, f"peer{moved}") if "move_download" in e.name]
    assert len(download) == 1
    assert sum(r.step_times_s) == pytest.approx(r.makespan_s, rel=1e-12)


# ------------------------------------------------------------------ square-cube


HIDDEN_SIZES = (1024, 2048, 4096)


def square_cube_shares():
    shares = {}
    for h in HIDDEN_SIZES:
        r = run(swarm_raw(peers=(2, 2), hidden=h, layers=8, batch=8, nic_gbit_per_s=0.2))
        shares[h] = r.extra["swarm_comm_share"]
    return shares


def test_square_cube_communication_share_falls_as_hidden_size_grows():
    # SWARM Sec. 3.1: a stage's compute grows as h^2 per token, its boundary activations as h, so at a
    # fixed 200 Mb/s the share of time spent sending activations and their gradients falls with h.
    shares = square_cube_shares()
    values = [shares[h] for h in HIDDEN_SIZES]
    assert all(a > b for a, b in zip(values, values[1:], strict=False)), shares
    assert all(0 < v < 1 for v in values)


def test_int8_compression_halves_the_wire_bytes_and_costs_kernels():
    plain = run(swarm_raw(activation_compression="none"))
    packed = run(swarm_raw(activation_compression="int8"))
    raw_bytes = plain.extra["swarm_boundary_bytes"][0]
    assert raw_bytes == plain.extra["swarm_boundary_bytes_uncompressed"][0] == 512 * 1024 * 2
    assert packed.extra["swarm_boundary_bytes"][0] == pytest.approx(raw_bytes / 2 * (1 + 4 / 4096), rel=1e-12)
    q = packed.extra["swarm_quantisation_s_per_boundary"][0]
    assert q > 0 and plain.extra["swarm_quantisation_s_per_boundary"][0] == 0
    # stage 0 quantises its output and dequantises the incoming gradient: + q in each pass
    assert packed.extra["swarm_forward_s_per_stage"][0] == pytest.approx(plain.extra["swarm_forward_s_per_stage"][0] + q)


# ------------------------------------------------------------------ memory


def test_memory_per_peer_analytic_and_simulated():
    # The analytic count is the bound where every micro-batch of a step is in flight: one stage-0
    # peer that runs all m forwards before the first gradient comes back (a 0.1 Gb/s link: one send
    # outlasts the 16 forwards) holds m activations; the last stage runs each backward right after
    # its forward: one. The engine's memory counter per peer reaches exactly those peaks. On a fast
    # link gradients come back sooner, backwards run first, and fewer are held.
    m = 16
    r = run(swarm_raw(peers=(1, 2), batch=m, seed=1, nic_gbit_per_s=0.1))
    assert set(r.simulated_peak_memory_gib) == {"peer0", "peer1", "peer2"}
    stage0, stage1 = r.memory_per_stage_gib
    assert r.simulated_peak_memory_gib["peer0"] == pytest.approx(stage0, rel=1e-9)
    assert r.simulated_peak_memory_gib["peer1"] == pytest.approx(stage1, rel=1e-9)
    assert r.simulated_peak_memory_gib["peer2"] == pytest.approx(stage1, rel=1e-9)
    fast = run(swarm_raw(peers=(1, 2), batch=m, seed=1, nic_gbit_per_s=100.0))
    assert fast.memory_per_stage_gib == r.memory_per_stage_gib
    assert fast.simulated_peak_memory_gib["peer0"] < stage0
    # with two stage-0 peers of speeds 1 and 0.5 the analytic count is the fast one's share, 2/3 of m
    two = run(swarm_raw(peers=(2, 1), batch=m, seed=1, peer_speeds=[[1.0, 0.5], [1.0]]))
    one_act = (stage0 - r.memory_gib["weights"] - r.memory_gib["gradients"] - r.memory_gib["optimizer"]
               - r.memory_gib["other"]) / m
    held = (two.memory_per_stage_gib[0] - (stage0 - m * one_act)) / one_act
    assert held == pytest.approx(11, rel=1e-9)  # ceil(16 * 1 / 1.5)


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("strategy, field", [
    ({"peers_per_stage": [1, 2]}, "strategy.peers_per_stage"),
    ({"peers_per_stage": [2]}, "strategy.peers_per_stage"),
    ({"peers_per_stage": [2, 0]}, "strategy.peers_per_stage"),
    ({"peer_speeds": [[1.0], [1.0, 1.0]]}, "strategy.peer_speeds"),
    ({"peer_speeds": [[1.0], [0.0]]}, "strategy.peer_speeds"),
    ({"outages": [{"peer": 9, "down_at_s": 1, "up_at_s": 2}]}, "strategy.outages.0.peer"),
    ({"outages": [{"peer": 0, "down_at_s": 2, "up_at_s": 1}]}, "strategy.outages.0.up_at_s"),
    ({"preemptions_per_hour": 1.0}, "strategy.mean_downtime_s"),
    ({"averaging": "allreduce"}, "strategy.averaging"),
    ({"rebalance_every_steps": 0}, "strategy.rebalance_every_steps"),
    ({"seed": True}, "strategy.seed"),
])
def test_bad_strategy_names_the_field(strategy, field):
    raw = swarm_raw()
    raw["strategy"].update(strategy)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        run(raw)


def test_layouts_a_swarm_cannot_run_name_the_field():
    raw = swarm_raw(peers=(2, 2))
    raw["parallelism"]["zero_stage"] = 1
    with pytest.raises(ConfigError, match=r"parallelism\.zero_stage"):
        run(raw)


def test_a_mixed_cluster_prices_each_peer_on_its_own_accelerator():
    # Stage 1's two peers sit on nodes whose GPU has twice the peaks and memory bandwidth: their passes
    # take what that GPU's kernels take (shorter), stage 0's what the toy T4's take, and the pool
    # throughputs say so. Peers fill the node groups in order (stage 0 first).
    raw = swarm_raw(peers=(2, 2), batch=8)
    node = raw["cluster"].pop("node")
    raw["cluster"].pop("num_gpus")
    fast = {**ACCELERATOR, "name": "toy-fast", "peak_tflops": {"fp32": 16.2, "fp16": 130},
            "hbm_bandwidth_gb_per_s": 640}
    raw["cluster"]["groups"] = [{"node": node, "nodes": 2}, {"node": {**node, "name": "fast", "accelerator": fast},
                                                             "nodes": 2}]
    mixed = run(raw)
    plain = run(swarm_raw(peers=(2, 2), batch=8))

    def pass_s(r, peer, phase):
        return sorted({round(e.end_s - e.start_s, 15) for e in tasks(r, peer) if e.name.split(".")[1] == phase
                       and e.category == "compute"})

    assert pass_s(mixed, "peer0", "F") == pytest.approx(pass_s(plain, "peer0", "F"), rel=1e-9)
    (slow_f,), (fast_f,) = pass_s(plain, "peer2", "F"), pass_s(mixed, "peer2", "F")
    assert fast_f < 0.8 * slow_f
    t_mixed, t_plain = (r.extra["swarm_pool_throughput_samples_per_s"] for r in (mixed, plain))
    assert t_mixed[0] == pytest.approx(t_plain[0], rel=1e-12) and t_mixed[1] > t_plain[1]


def wan(regions, gbit_per_s=10.0, delay_ms=50.0) -> dict:
    n = len(regions)
    return {"topology": "wan", "name": "toy-wan", "regions": [{"name": f"r{i}", "nodes": c} for i, c in enumerate(regions)],
            "intra_region": "fat-tree", "source": "toy",
            "delay_ms": [[0 if i == j else delay_ms for j in range(n)] for i in range(n)],
            "bandwidth_gbit_per_s": [[0 if i == j else gbit_per_s for j in range(n)] for i in range(n)]}


def test_stages_in_two_regions_exact_timeline():
    # As the one-peer-per-stage timeline, with the stages in two regions 50 ms apart over a 10 Gb/s
    # pair link (NICs 100 Gb/s): a send is the bytes at the pair link's rate, then the delay as
    # propagation (the sender's stream free meanwhile); the engine agrees with the dispatcher.
    m = 8
    raw = swarm_raw(batch=m, peer_speeds=[[1.0], [0.5]])
    raw["cluster"]["fabric"] = wan([1, 1])
    r = run(raw)
    (f0, f1), (b0, b1), (opt0, opt1), _ = prices(r)
    c = r.extra["swarm_boundary_bytes"][0] / (10e9 / 8) + 0.050
    busy_until = f0 + c + m * (f1 + b1) / 0.5
    assert r.step_time_s == pytest.approx(max(busy_until + c + b0 + opt0, busy_until + opt1 / 0.5), rel=1e-12)
    assert r.extra["swarm_dispatch_makespan_s"] == pytest.approx(r.step_time_s, rel=1e-12)
    sends = [e for e in tasks(r, "peer0") if e.stream == "send"]
    assert sends[0].end_s - sends[0].start_s == pytest.approx(c, rel=1e-9)
    assert sends[1].start_s == pytest.approx(2 * f0, rel=1e-9)
    assert sends[1].start_s < sends[0].end_s  # pipelined behind the delay


def test_averaging_across_regions_pays_the_pair_link_and_the_delay():
    # stage 1's two peers sit in two regions: their ring all-reduce crosses the pair link both ways
    # (each way the gradient once, k = 2) and waits 2(k-1) = 2 delays
    raw = swarm_raw(peers=(1, 2), batch=8, gradient_compression="none")
    raw["cluster"]["fabric"] = wan([2, 1])
    r = run(raw)
    grads = r.extra["swarm_stage_params"][1] * 2
    average = [e for e in r.timeline if e.stream == "avg"]
    assert len(average) == 2
    assert all(e.end_s - e.start_s >= 2 * 0.050 + grads / (10e9 / 8) for e in average)


def test_bad_input_through_the_cli_exits_2_naming_the_field(tmp_path):
    raw = swarm_raw()
    raw["strategy"]["peers_per_stage"] = [3, 1]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "strategy.peers_per_stage" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ invariants, averaging, CLI


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_never_beats_the_dispatchers_uncontended_times(seed):
    # The engine runs the dispatcher's orders with the same pass times and transfers that can only
    # be slowed by sharing a link, so its makespan is never shorter (a longest path with longer edges).
    raw = swarm_raw(peers=(3, 2), batch=20, steps=2, nic_gbit_per_s=0.5, seed=seed,
                    peer_speeds=[[1.0, 0.7, 0.4], [1.0, 0.6]], preemptions_per_hour=3600.0, mean_downtime_s=0.05)
    r = run(raw)
    assert r.makespan_s >= r.extra["swarm_dispatch_makespan_s"] * (1 - 1e-12)


def random_swarm(case: int) -> dict:
    """A seeded random swarm: 2-4 stages of 1-3 peers of mixed speeds, preemptions, rebalancing,
    gossip or all-reduce, compression on or off, 1-3 steps, slow or fast links."""
    rng = random.Random(case)
    stages = rng.choice([2, 3, 4])
    peers = tuple(rng.randint(1, 3) for _ in range(stages))
    strategy = dict(peer_speeds=[[rng.choice([0.3, 0.5, 1.0, 1.5]) for _ in range(p)] for p in peers],
                    seed=rng.randint(0, 99), averaging=rng.choice(["all_reduce", "gossip"]),
                    activation_compression=rng.choice(["none", "int8"]),
                    gradient_compression=rng.choice(["none", "int8"]))
    if rng.random() < 0.7:
        strategy.update(preemptions_per_hour=rng.choice([360.0, 3600.0, 36000.0]),
                        mean_downtime_s=rng.choice([0.01, 0.1, 1.0]))
    if rng.random() < 0.5:
        strategy["rebalance_every_steps"] = rng.choice([1, 2])
    return swarm_raw(peers=peers, layers=4, batch=rng.choice([4, 8, 12]), steps=rng.choice([1, 2, 3]),
                     nic_gbit_per_s=rng.choice([0.2, 1.0, 100.0]), **strategy)


@pytest.mark.parametrize("case", range(12))
def test_random_swarms_finish_and_the_engine_never_beats_the_dispatcher(case):
    # Every routing decision the dispatcher takes at a time is a dependency on what ended then, so
    # the engine (same orders, same passes, transfers that sharing can only slow) never finishes
    # earlier; every step is simulated, whatever the preemptions and moves (seeds 1-2 of 100 such
    # swarms each ran clean when this was written).
    r = run(random_swarm(case))
    assert r.makespan_s >= r.extra["swarm_dispatch_makespan_s"] * (1 - 1e-9)
    assert len(r.step_times_s) == r.steps and min(r.step_times_s) >= 0
    assert sum(r.time_breakdown_s.values()) == pytest.approx(r.step_time_s, rel=1e-9)


@pytest.mark.parametrize("averaging, share", [("all_reduce", 2 * 3 / 4), ("gossip", 1.0)])
def test_averaging_bytes_per_peer(averaging, share):
    # four peers in one stage: a ring all-reduce sends 2(k-1)/k of the gradient from each, gossip all of it once
    r = run(swarm_raw(peers=(1, 4), batch=8, averaging=averaging, gradient_compression="none"))
    sent = [dict(e.args)["bytes"] for e in r.timeline if e.stream == "avg"]
    assert len(sent) == 4
    params = r.extra["swarm_stage_params"][1]
    assert all(b == pytest.approx(share * params * 2, rel=1e-12) for b in sent)  # fp16 gradients: 2 B each


def test_many_steps_through_the_cli(tmp_path):
    path = tmp_path / "swarm.yaml"
    path.write_text(yaml.safe_dump(swarm_raw(peers=(1, 2), batch=8)))
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "simulate", str(path), "--steps", "3", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["steps"] == 3 and len(out["step_times_s"]) == 3
    assert sum(out["step_times_s"]) == pytest.approx(out["makespan_s"], rel=1e-9)
    assert set(out["simulated_peak_memory_per_rank_gib"]) == {"peer0", "peer1", "peer2"}
    assert out["simulated_peak_memory_gib"] <= out["peak_memory_gib"]


def test_no_refresh_download_once_the_stage_has_trained_its_last_step():
    # peer 2 rejoins early in the run and downloads stage 1 (0.02 -> ~0.62 s at 1 Gb/s) while stage 1 steps
    # (~0.2 s a step). With steps left it must fetch the stepped parameters again (refresh); after the stage's last
    # step there is nothing left to train, so, as a peer that rejoins after the last step downloads nothing
    # (dispatch's _on_rejoin), it fetches nothing: the refresh (~0.54 s more) made the one-step run 1.16 s.
    def one(steps):
        return run(swarm_raw(peers=(1, 2), batch=16, peer_speeds=[[1.0], [0.5, 0.5]], seed=3, steps=steps,
                             nic_gbit_per_s=1.0, outages=[{"peer": 2, "down_at_s": 0.01, "up_at_s": 0.02}]))
    last = one(1)
    rejoin = [e for e in tasks(last, "peer2") if "rejoin_download" in e.name]
    assert len(rejoin) == 1
    assert not [e for e in tasks(last) if "refresh_download" in e.name]
    assert last.makespan_s == pytest.approx(max(e.end_s for e in tasks(last)), rel=1e-12)
    assert last.makespan_s == pytest.approx(max(rejoin[0].end_s, max(
        e.end_s for e in tasks(last) if e.category == "optimizer")), rel=1e-12)
    three = one(3)  # the stage stepped during the download and has steps left: it fetches again
    assert len([e for e in tasks(three, "peer2") if "refresh_download" in e.name]) == 1
