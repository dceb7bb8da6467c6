"""Flow-level network (simulator/engine/network.py): exact completion times on toy ports.

Every expected time below is derived by hand from the max-min fair-share rule
(progressive filling) with capacities in bytes/s; no number is copied from a run.
"""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.network import FlowNetwork

GB = 1e9


def _net(capacities: dict[str, float]) -> tuple[simpy.Environment, FlowNetwork]:
    env = simpy.Environment()
    return env, FlowNetwork(env, lambda port: capacities[port])


def _finish_times(env: simpy.Environment, events: dict[str, simpy.Event]) -> dict[str, float]:
    """Run the environment and record when each named event fired."""
    times: dict[str, float] = {}
    for name, ev in events.items():
        ev.callbacks.append(lambda _ev, name=name: times.__setitem__(name, env.now))
    env.run()
    assert set(times) == set(events), "every transfer must complete"
    return times


def _start_at(env: simpy.Environment, net: FlowNetwork, t0: float, demands: dict[str, float],
              latency_s: float = 0.0) -> simpy.Event:
    """An event that fires when a transfer started at ``t0`` completes."""
    done = env.event()

    def proc():
        if t0 > 0:
            yield env.timeout(t0)
        yield net.transfer(demands, latency_s)
        done.succeed()

    env.process(proc())
    return done


def test_single_flow_takes_size_over_bandwidth():
    # S = 3 GB on a port of B = 2 GB/s, alone: S/B = 1.5 s.
    env, net = _net({"p": 2 * GB})
    times = _finish_times(env, {"a": net.transfer({"p": 3 * GB})})
    assert times["a"] == pytest.approx(1.5, rel=1e-12)
    assert net.flows_started == 1


def test_single_flow_latency_is_added():
    # latency 5 us, then 1 GB at 4 GB/s = 0.25 s: total 0.25 + 5e-6 s.
    env, net = _net({"p": 4 * GB})
    times = _finish_times(env, {"a": net.transfer({"p": 1 * GB}, latency_s=5e-6)})
    assert times["a"] == pytest.approx(0.25 + 5e-6, rel=1e-12)


def test_two_equal_flows_share_the_port_and_both_take_2s_over_b():
    # Two flows of S = 1 GB start together on one port of B = 1 GB/s: each gets B/2,
    # so each finishes at S/(B/2) = 2S/B = 2 s.
    env, net = _net({"p": 1 * GB})
    times = _finish_times(env, {"a": net.transfer({"p": 1 * GB}), "b": net.transfer({"p": 1 * GB})})
    assert times["a"] == pytest.approx(2.0, rel=1e-12)
    assert times["b"] == pytest.approx(2.0, rel=1e-12)


def test_flow_joining_when_the_first_is_half_done():
    # Flow a: S = 2 GB at t=0 on B = 1 GB/s, alone at 1 GB/s -> half done (1 GB left) at t=1.
    # Flow b (2 GB) starts at t=1: both at 0.5 GB/s. a's remaining 1 GB takes 2 s -> a ends at t=3.
    # By then b moved 1 GB; its last 1 GB alone at 1 GB/s takes 1 s -> b ends at t=4.
    env, net = _net({"p": 1 * GB})
    a = _start_at(env, net, 0.0, {"p": 2 * GB})
    b = _start_at(env, net, 1.0, {"p": 2 * GB})
    times = _finish_times(env, {"a": a, "b": b})
    assert times["a"] == pytest.approx(3.0, rel=1e-12)
    assert times["b"] == pytest.approx(4.0, rel=1e-12)


def test_three_flows_staggered_piecewise():
    # Port B = 1 GB/s. a: 3 GB at t=0; b: 1 GB at t=1; c: 1 GB at t=1.
    # [0,1): a alone, moves 1 GB (2 left).  [1, ...): three flows at 1/3 GB/s each.
    # b and c (1 GB each) finish after 3 s -> t=4; a has moved 1 GB more (1 left).
    # a alone again: 1 GB at 1 GB/s -> t=5.
    env, net = _net({"p": 1 * GB})
    a = _start_at(env, net, 0.0, {"p": 3 * GB})
    b = _start_at(env, net, 1.0, {"p": 1 * GB})
    c = _start_at(env, net, 1.0, {"p": 1 * GB})
    times = _finish_times(env, {"a": a, "b": b, "c": c})
    assert times["b"] == pytest.approx(4.0, rel=1e-12)
    assert times["c"] == pytest.approx(4.0, rel=1e-12)
    assert times["a"] == pytest.approx(5.0, rel=1e-12)


def test_max_min_two_ports_bottleneck_and_free_flow():
    # Port A: 1 GB/s, port B: 3 GB/s. Flow x crosses A and B (1 GB on each); flow y only B (4 GB).
    # Progressive filling: both rise together; A saturates first at 1 GB/s (x alone on A),
    # x freezes at 1 GB/s; y takes the rest of B: 3 - 1 = 2 GB/s (max-min, not an equal split 1.5/1.5).
    # x: 1 GB at 1 GB/s -> t=1. y moved 2 GB by t=1; then alone on B at 3 GB/s: 2 GB / 3 -> t = 1 + 2/3.
    env, net = _net({"A": 1 * GB, "B": 3 * GB})
    times = _finish_times(env, {"x": net.transfer({"A": 1 * GB, "B": 1 * GB}), "y": net.transfer({"B": 4 * GB})})
    assert times["x"] == pytest.approx(1.0, rel=1e-12)
    assert times["y"] == pytest.approx(1.0 + 2.0 / 3.0, rel=1e-12)


def test_max_min_flow_limited_elsewhere_leaves_bandwidth_to_others():
    # Ports A (0.5 GB/s) and B (2 GB/s). x crosses A and B, y and z only B; each moves 1 GB.
    # Filling: A saturates at 0.5 for x; y, z split B's remaining 1.5 -> 0.75 GB/s each.
    # y, z finish at 1/0.75 = 4/3 s; x (0.5 GB/s, A still its bottleneck) finishes at 2 s.
    env, net = _net({"A": 0.5 * GB, "B": 2 * GB})
    times = _finish_times(env, {
        "x": net.transfer({"A": 1 * GB, "B": 1 * GB}),
        "y": net.transfer({"B": 1 * GB}),
        "z": net.transfer({"B": 1 * GB}),
    })
    assert times["y"] == pytest.approx(4.0 / 3.0, rel=1e-12)
    assert times["z"] == pytest.approx(4.0 / 3.0, rel=1e-12)
    assert times["x"] == pytest.approx(2.0, rel=1e-12)


def test_uneven_demands_limited_by_the_heaviest_port():
    # One flow moving 2 GB on A and 1 GB on B, both 1 GB/s: it progresses as one unit,
    # limited by A: 2 GB / 1 GB/s = 2 s (B idles half the time).
    env, net = _net({"A": 1 * GB, "B": 1 * GB})
    times = _finish_times(env, {"a": net.transfer({"A": 2 * GB, "B": 1 * GB})})
    assert times["a"] == pytest.approx(2.0, rel=1e-12)


def test_zero_byte_flow_with_latency_takes_only_the_latency():
    # No bytes: only the latency, 7 us; nothing enters the flow network.
    env, net = _net({"p": 1 * GB})
    times = _finish_times(env, {"a": net.transfer({"p": 0.0}, latency_s=7e-6)})
    assert times["a"] == pytest.approx(7e-6, rel=1e-12)
    assert net.flows_started == 0


def test_zero_byte_flow_without_latency_is_immediate():
    env, net = _net({"p": 1 * GB})
    ev = net.transfer({}, latency_s=0.0)
    assert ev.triggered
    env.run()
    assert env.now == 0.0


def test_latency_delays_the_start_of_sharing():
    # a: 2 GB at t=0, no latency, B = 1 GB/s. b: 1 GB, latency 1 s (starts moving at t=1).
    # [0,1): a alone, 1 GB left. [1,3): both at 0.5: b's 1 GB ends at t=3, a's 1 GB ends at t=3 too.
    env, net = _net({"p": 1 * GB})
    times = _finish_times(env, {"a": net.transfer({"p": 2 * GB}), "b": net.transfer({"p": 1 * GB}, latency_s=1.0)})
    assert times["a"] == pytest.approx(3.0, rel=1e-12)
    assert times["b"] == pytest.approx(3.0, rel=1e-12)


def test_disjoint_ports_do_not_interact():
    # Two flows on different ports run at full speed each: 1 GB / 1 GB/s and 3 GB / 2 GB/s.
    env, net = _net({"A": 1 * GB, "B": 2 * GB})
    times = _finish_times(env, {"a": net.transfer({"A": 1 * GB}), "b": net.transfer({"B": 3 * GB})})
    assert times["a"] == pytest.approx(1.0, rel=1e-12)
    assert times["b"] == pytest.approx(1.5, rel=1e-12)


def test_max_min_is_in_bandwidth_on_each_flows_heaviest_port():
    # x moves 2 GB on A and 1 GB on B; y moves 1 GB on B; A = B = 1 GB/s.
    # Filling raises each flow's bandwidth on its heaviest port at one level l: A carries l (x),
    # B carries l/2 (x) + l (y) -> B saturates first at l = 2/3 GB/s; both freeze there.
    # y: 1 GB at 2/3 GB/s -> t = 1.5. x by then moved 1 GB of A's 2 (and 0.5 of B's 1);
    # alone, limited by A at 1 GB/s: 1 GB more -> t = 2.5.
    env, net = _net({"A": 1 * GB, "B": 1 * GB})
    times = _finish_times(env, {"x": net.transfer({"A": 2 * GB, "B": 1 * GB}), "y": net.transfer({"B": 1 * GB})})
    assert times["y"] == pytest.approx(1.5, rel=1e-12)
    assert times["x"] == pytest.approx(2.5, rel=1e-12)


def test_a_flow_with_its_ports_to_itself_is_not_slowed_by_sharing_elsewhere():
    """a and b share p (0.5 GB/s each); c has r (2 GB/s) to itself. At 1 s d starts on q and r:
    the filling gives a, b 0.5 (p saturates first) and c, d 1 GB/s each on r (r and q saturate
    together: q carries a's 0.5 + d's 0.5). a, b, d end at 2 s; c then has 1 GB left alone at
    2 GB/s and ends at 2.5 s."""
    env, net = _net({"p": 1 * GB, "q": 1 * GB, "r": 2 * GB})
    times: dict[str, float] = {}

    def run(name, demands, start_s=0.0):
        yield env.timeout(start_s)
        yield net.transfer(demands)
        times[name] = env.now

    env.process(run("a", {"p": 1 * GB, "q": 1 * GB}))
    env.process(run("b", {"p": 1 * GB}))
    env.process(run("c", {"r": 4 * GB}))
    env.process(run("d", {"q": 0.5 * GB, "r": 1 * GB}, start_s=1.0))
    env.run()
    assert times == pytest.approx({"a": 2.0, "b": 2.0, "c": 2.5, "d": 2.0})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcdefgh"), st.floats(0.1, 10.0), min_size=1, max_size=3),
                min_size=1, max_size=8))
def test_rates_equal_progressive_filling_over_all_flows(demand_sets):
    """The shortcut (flows on unshared ports get their own bottleneck without the filling)
    gives every flow the rate the filling over all flows gives it."""
    env, net = _net({p: (1 + "abcdefgh".index(p)) * GB for p in "abcdefgh"})
    for demands in demand_sets:
        net.transfer({p: b * GB for p, b in demands.items()})
    fast = [f.rate for f in net._flows]
    net._progressive_filling(net._flows)
    assert fast == pytest.approx([f.rate for f in net._flows], rel=1e-9)
