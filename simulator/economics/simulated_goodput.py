"""Goodput of a scenario measured by simulation: the ``reliability:`` block joined with the
simulated step time (the ``reliability`` result keys, shown by ``clustersim simulate``).

Inputs, each from one place: the step time from the engine's simulated steps (their mean);
the state a checkpoint writes and a returning peer downloads from the memory model's bytes per
parameter (:func:`simulator.economics.cost.checkpoint_bytes_per_parameter`: weights, fp32 master
and optimizer moments, 14 B for mixed-precision Adam) unless ``economics.checkpoint_bytes_per_parameter``
says otherwise; storage bandwidths and the restart time from ``reliability`` or else ``economics``
(Narayanan et al. 2021 Sec. 5.10's per-node read and write rates). The timeline itself is
:mod:`simulator.economics.job_timeline`; next to a synchronous job's simulated goodput this reports
the analytic first-order Young/Daly value for the same inputs (``goodput_analytic``) so the two
can be compared.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from simulator.economics import goodput as gp
from simulator.economics.cost import checkpoint_bytes_per_parameter
from simulator.economics.job_timeline import (
    Cluster,
    draw_job_outages,
    job_interruption_rate_per_hour,
    simulate_elastic_job,
    simulate_sync_job,
)
from simulator.economics.reliability import ReliabilitySpec, resolve_processes
from simulator.engine.failures import OutageLimitError
from simulator.errors import ConfigError

if TYPE_CHECKING:
    from simulator.scenario import Scenario

#: Strategy kinds whose data-parallel group shrinks around a failed replica instead of restarting.
ELASTIC_KINDS = ("local_sgd", "parameter_server")
#: How far past the failure-free time a job given in steps is simulated before it is called unfinished.
STEPS_HORIZON_FACTOR = 20.0


def state_bytes(scenario: Scenario, num_parameters: float) -> float:
    """Bytes of model state a checkpoint holds (and a replica downloads): parameters x bytes each."""
    per = scenario.economics.checkpoint_bytes_per_parameter or checkpoint_bytes_per_parameter(
        scenario.training.precision, scenario.training.optimizer)
    return num_parameters * per


def _period_steps(scenario: Scenario) -> int:
    strategy = scenario.strategy
    return int(getattr(strategy, "local_steps", 1) or 1)


def time_lost(report: dict[str, Any]) -> dict[str, float]:
    """The ``lost_*_s`` entries of a report by cause (redo, restart, ...): with ``useful_s`` they add up to
    ``wall_s``."""
    return {k[len("lost_"):-len("_s")]: v for k, v in report.items() if k.startswith("lost_") and k.endswith("_s")}


def simulated_goodput(scenario: Scenario, step_s: float, num_parameters: float) -> dict[str, Any]:
    """Simulate the job's timeline with the scenario's failures (module docstring); a JSON-ready dict
    of scalars (``lost_<cause>_s``: the wall time lost to each cause)."""
    spec: ReliabilitySpec = scenario.reliability
    econ = scenario.economics
    processes = resolve_processes(spec, scenario.node.gpus_per_node)
    cluster = Cluster(scenario.num_gpus, scenario.node.gpus_per_node, spec.rack_nodes)
    n_nodes = cluster.num_nodes
    ckpt_bytes = state_bytes(scenario, num_parameters)
    write_bw = (spec.checkpoint_write_gb_per_s_per_node or econ.checkpoint_write_gb_per_s_per_node) * n_nodes * 1e9
    read_bw = (spec.checkpoint_read_gb_per_s_per_node or econ.checkpoint_read_gb_per_s_per_node) * n_nodes * 1e9
    if econ.storage_max_gb_per_s is not None:
        write_bw = min(write_bw, econ.storage_max_gb_per_s * 1e9)
        read_bw = min(read_bw, econ.storage_max_gb_per_s * 1e9)
    write_s = ckpt_bytes / write_bw
    restart_minutes = spec.restart_minutes if spec.restart_minutes is not None else econ.restart_overhead_minutes
    restart_s = restart_minutes * 60.0 + ckpt_bytes / read_bw
    rate_h = job_interruption_rate_per_hour(processes, cluster)
    mtbf_s = 3600.0 / rate_h if rate_h > 0 else math.inf
    if spec.checkpoint_interval_minutes is not None:
        interval_s = spec.checkpoint_interval_minutes * 60.0
    elif math.isfinite(mtbf_s):
        interval_s = gp.young_daly_interval_s(write_s, mtbf_s)
    else:
        interval_s = math.inf
    checkpoint_steps = max(1, round(interval_s / step_s)) if math.isfinite(interval_s) else 2**62
    if spec.steps is not None:
        total_steps, horizon_s = spec.steps, STEPS_HORIZON_FACTOR * spec.steps * step_s + 30 * 86400.0
    else:
        total_steps, horizon_s = None, (spec.days if spec.days is not None else gp.LLAMA3_SNAPSHOT_DAYS) * 86400.0
    kind = scenario.strategy_kind
    elastic = kind in ELASTIC_KINDS
    try:
        outages = draw_job_outages(processes, cluster, horizon_s, spec.seed,
                                   "after_repair" if elastic else "immediate")
    except OutageLimitError as exc:  # name the field that set the horizon (the engine layer knows none)
        field = "reliability.steps" if spec.steps is not None else "reliability.days"
        raise ConfigError(field, f"{exc.reason} ({field} sets the {horizon_s:.3g} s drawn over)") from None
    report: dict[str, Any] = {
        "seed": spec.seed,
        "recovery": "elastic: the group shrinks, a returning replica downloads its state" if elastic
                    else "synchronous: restart from the last checkpoint",
        "job_mtbf_hours": mtbf_s / 3600.0 if math.isfinite(mtbf_s) else None,
        "state_gb": ckpt_bytes / 1e9,
        "step_time_s": step_s,
    }
    if elastic:
        report.update(_elastic(scenario, spec, outages, step_s, ckpt_bytes, total_steps, horizon_s))
        return _with_time_to_train(scenario, report)
    timeline = simulate_sync_job(outages, step_s=step_s, checkpoint_steps=checkpoint_steps, checkpoint_s=write_s,
                                 restart_s=restart_s, total_steps=total_steps, horizon_s=horizon_s,
                                 spare_nodes=spec.spare_nodes)
    tau = checkpoint_steps * step_s
    analytic = gp.goodput_fraction(mtbf_s, write_s, tau, restart_s)
    report.update({
            "goodput": timeline.goodput,
            "goodput_analytic": analytic,
            "analytic_model": "first-order Young/Daly (simulator/economics/goodput.py): Poisson failures, fixed restart",
            "simulated_days": timeline.wall_s / 86400.0,
            "steps_done": timeline.steps_done,
            "finished": timeline.finished if total_steps is not None else None,
            "failures": timeline.failures,
            "failures_during_recovery": timeline.failures_during_recovery,
            "checkpoint_interval_s": tau if checkpoint_steps < 2**62 else None,
            "checkpoint_interval_steps": checkpoint_steps if checkpoint_steps < 2**62 else None,
            "checkpoint_write_s": write_s,
            "restart_s": restart_s,
            "wall_s": timeline.wall_s,
            "useful_s": timeline.useful_s,
            "lost_redo_s": timeline.redo_s,
            "lost_restart_s": timeline.restart_s,
            "lost_waiting_for_spares_s": timeline.waiting_for_spares_s,
            "lost_checkpoint_s": timeline.checkpoint_s})
    return _with_time_to_train(scenario, report)


def _with_time_to_train(scenario: Scenario, report: dict[str, Any]) -> dict[str, Any]:
    """With ``training.tokens``: the failure-free time to train over the simulated goodput."""
    par, seq = scenario.parallelism, scenario.seq_length
    tokens = scenario.training.tokens
    report["effective_time_to_train_days"] = None
    if tokens and seq and report["goodput"] > 0:
        ideal_s = tokens / (par.global_batch_size * seq) * report["step_time_s"]
        report["effective_time_to_train_days"] = ideal_s / report["goodput"] / 86400.0
    return report


def _elastic(scenario: Scenario, spec: ReliabilitySpec, outages, step_s: float, ckpt_bytes: float,
             total_steps: int | None, horizon_s: float) -> dict[str, Any]:
    """The elastic job: a replica is dp's unit; it downloads the whole replica's state on return."""
    replicas = scenario.parallelism.dp
    gpus_per_replica = scenario.num_gpus // replicas
    node = scenario.node
    per_gpu_bw = spec.download_gb_per_s_per_gpu or (
        node.nics_per_node * node.nic_bandwidth_gbit_per_s / 8.0 * node.nic_efficiency / node.gpus_per_node)
    download_s = ckpt_bytes / (gpus_per_replica * per_gpu_bw * 1e9)
    strategy = scenario.strategy
    waits = getattr(strategy, "mode", "sync") != "async"
    timeline = simulate_elastic_job(outages, step_s=step_s, period_steps=_period_steps(scenario), replicas=replicas,
                                    gpus_per_replica=gpus_per_replica, download_s=download_s,
                                    timeout_s=spec.collective_timeout_s if waits else 0.0,
                                    total_steps=total_steps, horizon_s=horizon_s)
    per_replica = 1.0 / replicas  # replica-seconds as seconds of the whole job
    return {"goodput": timeline.goodput,
            "goodput_analytic": None,
            "analytic_model": None,
            "simulated_days": timeline.wall_s / 86400.0,
            "steps_done": timeline.steps_done,
            "finished": timeline.finished if total_steps is not None else None,
            "failures": timeline.failures,
            "replicas": replicas,
            "period_steps": _period_steps(scenario),
            "download_s": download_s,
            "collective_timeout_s": spec.collective_timeout_s if waits else 0.0,
            "wall_s": timeline.wall_s,
            "useful_s": timeline.useful_replica_s * per_replica,
            "lost_redo_s": timeline.lost_replica_s * per_replica,
            "lost_replicas_out_s": timeline.out_replica_s * per_replica,
            "lost_collective_timeout_s": timeline.timeout_s}
