"""The shared run: a foreground scenario and its ``co_located_jobs`` on the same GPUs, one engine.

How (DeepPool, Park et al. 2022, MLSys, Sec. 5; the field: simulator/colocation/spec.py):

1. Each job is first simulated alone (full mode): its step time alone, the reference for its
   slowdown, and the pace that sizes the background's plan.
2. Every job is compiled in full mode (every rank an actor, so that GPU r holds rank r of each job;
   ranks fill the nodes in the same order in every job). Each background job is unrolled for
   enough steps to outlast the foreground (``_background_steps``; doubled and rerun if it ran out).
3. The background's actors and rendezvous are renamed ``job{i}/...`` so that nothing is shared by
   name except what is physical: the compute-stream kernels of GPU r of every job run on the engine's
   shared executor ``gpu{r}`` (priority: the foreground 0, a job its ``priority``; the background's
   ``interferes``: its ``interference_slowdown``), and the transfers keep their port names
   (``rank{r}:nic_tx``, ...), so the jobs' traffic shares the GPU's links max-min fairly.
4. The engine runs until the foreground's last task is done (simulator/engine/engine.py,
   ``until_done``); the background is cut there.

What is measured: the foreground's step times as usual (its plan, timed in the shared run); a
background job's throughput as the steps it got through while the foreground ran (its completed
steps plus the share of the next step's kernel work already done, :func:`_progress_steps`) over
the foreground's makespan; under one step is reported with a note (run the foreground longer). The cluster total is given two
ways: the model TFLOP/s per GPU of all jobs together, and the normalised throughput
Σ_j (throughput shared / throughput alone) (the "system throughput" of multiprogram workloads,
Eyerman & Eeckhout, IEEE Micro 2008), > 1 when sharing gains.

Published data: DeepPool's repository reports one run, in its README, as an example of its output
(../shared/published/seeds/deeppool_readme_example_run.csv: vgg16_8_32_2.0_DP, 8 GPUs, global batch
32, 13.57 ms/iter, 0.00 background img/s). It is no check of this module: no background job ran,
the GPU and precision are not stated and the README quotes it as an output format, not a result
(the simulator gives 7.8 ms for that layout on 8 A100s in bf16, 36 ms in fp32 without TF32).

Not modelled: kernels of two jobs running side by side on one GPU's SMs (spatial sharing); a
background kernel runs only when the foreground has none ready, so the background's share is a
bound from below of what finer sharing gives. Memory: each job's analytic peak per GPU is added
(conservative where the peaks sit on different GPUs) and checked against the HBM.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from simulator.colocation.spec import CoLocatedJob
from simulator.engine.engine import Engine, Task
from simulator.errors import ConfigError
from simulator.strategies.plan import MEMORY_COUNTER, Plan
from simulator.strategies.registry import get_kind

MAX_BACKGROUND_STEPS = 10_000
#: Headroom on the background's unrolled steps beyond the bound from the foreground alone.
STEP_HEADROOM = 1.25


def alone(scenario):
    """The scenario as a job of its own (no co-located jobs)."""
    return dataclasses.replace(scenario, co_located=())


def with_steps(scenario, steps: int):
    return dataclasses.replace(scenario, simulation=scenario.simulation.model_copy(update={"steps": steps}))


def memory_per_gpu(scenario) -> tuple[float, list[float]]:
    """(the sum of every job's analytic peak bytes per GPU, each job's peak bytes, foreground first)."""
    peaks = []
    for job in (alone(scenario), *(j.scenario for j in scenario.co_located)):
        _, peak, _ = get_kind(job.strategy_kind).memory(job)
        peaks.append(peak.total_bytes)
    return sum(peaks), peaks


def shared_memory_fits(scenario) -> tuple[bool, str | None]:
    """Whether every job's peak together fits a GPU's HBM minus the reserve."""
    from simulator.memory.analytic import usable_hbm_bytes

    total, peaks = memory_per_gpu(scenario)
    usable = usable_hbm_bytes(scenario)
    if total <= usable:
        return True, None
    parts = " + ".join(f"{p / 2**30:.1f}" for p in peaks)
    return False, (f"the co-located jobs need {parts} = {total / 2**30:.1f} GiB per GPU of "
                   f"{usable / 2**30:.1f} GiB usable")


def _check_covers_gpus(plan: Plan, scenario, field: str) -> None:
    ranks = set(plan.actors.values())
    if ranks != set(range(scenario.num_gpus)) or len(ranks) != len(plan.actors):
        raise ConfigError(field, f"the {scenario.strategy_kind} kind simulates {len(plan.actors)} actors for "
                                 f"{scenario.num_gpus} GPUs; co-location pairs the jobs GPU by GPU and needs every "
                                 "rank simulated (kinds spmd, local_sgd, parameter_server)")


def _background_steps(fg_alone_makespan_s: float, job_alone_step_s: float, slowdowns: float) -> int:
    """Steps that a background job cannot finish before the foreground does: it runs no faster than
    alone, and the foreground takes at most its time alone x (1 + every job's slowdown), with headroom."""
    if not job_alone_step_s or not math.isfinite(job_alone_step_s):
        return 1
    bound = fg_alone_makespan_s * (1.0 + slowdowns) * STEP_HEADROOM / job_alone_step_s
    return max(2, min(MAX_BACKGROUND_STEPS, math.ceil(bound) + 1))


def _share(plan: Plan, priority: int, interferes: float, prefix: str | None) -> dict[tuple[str, str], list[Task]]:
    """Put the plan's compute kernels on the executor of their GPU and, for a background job, rename
    its actors and rendezvous (ports keep their physical names). Returns the renamed streams."""
    streams: dict[tuple[str, str], list[Task]] = {}
    for (actor, stream), tasks in plan.streams.items():
        gpu = f"gpu{plan.actors[actor]}"
        for task in tasks:
            if stream == "compute" and task.demands is None and task.duration_s > 0:
                task.shares, task.priority, task.interferes = gpu, priority, interferes
            if prefix is not None:
                task.actor = prefix + task.actor
                if task.rendezvous is not None:
                    task.rendezvous = prefix + task.rendezvous
        streams[(prefix + actor if prefix else actor, stream)] = tasks
    return streams


def _completed_steps(plan: Plan, until_s: float) -> int:
    """Steps of a background plan whose every closing task ended by ``until_s``."""
    done = 0
    for tasks in plan.step_ends:
        if not all(t.end_s <= until_s for t in tasks):  # NaN: not finished
            break
        done += 1
    return done


def _progress_steps(plan: Plan, until_s: float) -> float:
    """How many steps a background plan got through by ``until_s``: its completed steps k plus the
    share of one step's kernel work done beyond them (its compute-stream kernels that ended, over one
    step's worth), kept within [k, k + 1]. Every step of a plan does the same work."""
    done = _completed_steps(plan, until_s)
    kernels = [t for tasks in plan.compute_tasks.values() for t in tasks]
    per_step = sum(t.duration_s for t in kernels) / max(1, plan.steps)
    if per_step <= 0:
        return float(done)
    worked = sum(t.duration_s for t in kernels if t.end_s <= until_s) / per_step
    return min(max(worked, float(done)), done + 1.0)


def _job_row(name: str, priority: int, job_alone, steps_per_s: float | None, shared_steps: int,
             job: CoLocatedJob | None) -> dict[str, Any]:
    alone_step = job_alone.step_time_s
    shared_step = 1.0 / steps_per_s if steps_per_s else None  # none completed: no step time
    row = {
        "scenario": name, "priority": priority, "model": job_alone.run.get("model"),
        "parallelism": {k: job_alone.parallelism[k] for k in ("tp", "pp", "dp")},
        "sample": job_alone.sample,
        "step_time_alone_s": alone_step, "step_time_shared_s": shared_step,
        "samples_per_s_alone": job_alone.samples_per_s,
        "samples_per_s_shared": job_alone.samples_per_step * steps_per_s if steps_per_s is not None else None,
        "tokens_per_s_alone": job_alone.tokens_per_s,
        "tokens_per_s_shared": (job_alone.tokens_per_step * steps_per_s
                                if steps_per_s is not None and job_alone.tokens_per_step else None),
        "model_tflops_per_gpu_alone": job_alone.model_tflops_per_gpu,
        "model_tflops_per_gpu_shared": (job_alone.model_flops_per_step * steps_per_s / job_alone.num_gpus / 1e12
                                        if steps_per_s is not None else None),
        "relative_throughput": alone_step * steps_per_s if steps_per_s is not None and alone_step else None,
        "steps_shared": shared_steps,
        "peak_memory_gib": job_alone.peak_memory_gib,
    }
    if job is not None:
        row.update(interference_slowdown=job.interference_slowdown, interference_source=job.interference_source,
                   interference_assumed=job.interference_assumed)
    return row


def run_co_located(scenario, detail: bool = False):
    """Time the foreground's plan with its background jobs on the same GPUs. Returns what
    ``simulate._run_plan`` returns: (foreground makespan, its timed plan, its critical rank's breakdown,
    the result's additions -- ``engine`` and ``co_location``, the per-job figures and totals --, the engine)."""
    from simulator.simulate import critical_actor, simulate, time_breakdown

    foreground = alone(scenario)
    fg_alone = simulate(foreground, mode="full")
    jobs = sorted(scenario.co_located, key=lambda j: j.priority)
    jobs_alone = [simulate(j.scenario, mode="full") for j in jobs]
    slowdowns = sum(j.interference_slowdown for j in jobs)
    steps = [_background_steps(fg_alone.makespan_s, a.step_time_s, slowdowns) for a in jobs_alone]
    for _attempt in range(6):
        fg_kind = get_kind(foreground.strategy_kind)
        fg_plan = fg_kind.compile(foreground, mode="full", detail=detail)
        _check_covers_gpus(fg_plan, foreground, "strategy.kind")
        streams = _share(fg_plan, 0, 0.0, None)
        counters = {(a, MEMORY_COUNTER): b for a, b in fg_plan.memory_base_bytes.items()}
        plans = []
        for i, (job, n) in enumerate(zip(jobs, steps, strict=True)):
            index = scenario.co_located.index(job)
            job_scenario = with_steps(job.scenario, n)
            plan = get_kind(job_scenario.strategy_kind).compile(job_scenario, mode="full", detail=False)
            _check_covers_gpus(plan, job_scenario, f"co_located_jobs.{index}.scenario.strategy.kind")
            prefix = f"job{i + 1}/"
            streams.update(_share(plan, job.priority, job.interference_slowdown, prefix))
            counters.update({(prefix + a, MEMORY_COUNTER): b for a, b in plan.memory_base_bytes.items()})
            plans.append(plan)
        engine = Engine(fg_plan.topology.port_capacity)
        fg_tasks = [t for tasks in fg_plan.streams.values() for t in tasks]
        makespan = engine.run(streams, counters, until_done=fg_tasks)
        ran_out = [i for i, p in enumerate(plans)
                   if _completed_steps(p, makespan) == len(p.step_ends) and steps[i] < MAX_BACKGROUND_STEPS]
        if not ran_out:
            break
        for i in ran_out:  # a background job ran out of work before the foreground ended: give it more
            steps[i] = min(MAX_BACKGROUND_STEPS, 2 * steps[i])
    fg_plan.mode = "full"
    fg_plan.other_streams = {key: tasks for key, tasks in streams.items() if key[0] not in fg_plan.actors}
    fg_steps_per_s = fg_plan.steps / makespan if makespan else None
    rows = [_job_row(scenario.name, 0, fg_alone, fg_steps_per_s, fg_plan.steps, None)]
    rows[0]["role"] = "foreground"
    notes = []
    for job, job_alone, plan in zip(jobs, jobs_alone, plans, strict=True):
        progress = _progress_steps(plan, makespan)
        rate = progress / makespan if makespan > 0 else None  # 0: starved by higher priorities
        if progress < 1.0:
            notes.append(f"{job.scenario.name} got through {progress:.2f} of a step during the foreground's "
                         f"{fg_plan.steps} steps: raise the foreground's simulation.steps for a steadier figure")
        row = _job_row(job.scenario.name, job.priority, job_alone, rate, round(progress, 3), job)
        row["role"] = "background"
        rows.append(row)
    total_tflops = sum(r["model_tflops_per_gpu_shared"] or 0.0 for r in rows)
    info = {
        "engine": "full",
        "co_location": {
            "jobs": rows,
            "model_tflops_per_gpu_total": total_tflops,
            "normalized_throughput": sum(r["relative_throughput"] or 0.0 for r in rows),
            "peak_memory_gib_total": sum(r["peak_memory_gib"] for r in rows),
            "interference_assumed": [j.scenario.name for j in jobs if j.interference_assumed],
            "notes": notes,
        },
        "co_located_normalized_throughput": sum(r["relative_throughput"] or 0.0 for r in rows),
        "co_located_model_tflops_per_gpu_total": total_tflops,
        "foreground_step_time_alone_s": fg_alone.step_time_s,
    }
    breakdown = time_breakdown(fg_plan, critical_actor(fg_plan), makespan)
    return makespan, fg_plan, breakdown, info, engine
