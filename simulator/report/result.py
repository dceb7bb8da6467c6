"""The result of simulating one training step, and how it is shown (JSON, table, timeline).

Definitions (DESIGN.md, "Definitions that must not drift"):
- model FLOPs per step: counted per op, fwd + bwd (for a dense GPT this equals Korthikanti
  2022 Eq. 7, 72·B·L·s·h²·(1 + s/(6h) + V/(12·h·L)));
- hardware FLOPs add the recomputed forward work;
- MFU = model FLOPs / (step time · GPUs · dense peak); HFU uses hardware FLOPs.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

BREAKDOWN_KEYS = ("compute", "recompute", "host_stall", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm",
                  "pipeline_bubble", "optimizer", "input_wait")


@dataclass(frozen=True)
class TimelineEvent:
    rank_class: str
    stream: str
    name: str
    category: str
    start_s: float
    end_s: float
    args: tuple[tuple[str, Any], ...] = ()  # for the trace: bytes moved, group size, ...
    flow_to: str | None = None               # a pipeline send: the rank class that receives it


@dataclass
class SimulationResult:
    scenario_name: str
    num_gpus: int
    num_parameters: int
    parallelism: dict[str, Any]
    step_time_s: float | None          # the mean over the simulated steps (makespan / steps)
    tokens_per_step: int | None  # None for a model without a sequence (images)
    model_flops_per_step: float
    hardware_flops_per_step: float
    peak_tflops_per_gpu: float
    peak_memory_gib: float
    peak_memory_stage: int
    memory_gib: dict[str, float]
    memory_per_stage_gib: list[float]
    hbm_gib: float
    fits: bool
    infeasible_reason: str | None
    time_breakdown_s: dict[str, float]
    layer_split: list[int]
    layers_per_stage: list[int]
    mode: str
    tokens_to_train: float | None = None
    steps: int = 1                # the steps run (a kind may round the request up: local_sgd to whole periods)
    steps_requested: int | None = None  # ``simulation.steps`` as asked (None: as run)
    steps_rounding: str | None = None   # why the two differ ("one whole period of H = 16")
    step_times_s: list[float] = field(default_factory=list)  # each simulated step
    makespan_s: float | None = None                          # end of the last task of the last step
    samples_per_step: int = 0     # the global batch: sequences, images, sentences
    sample: str = "sequence"      # what one sample is (the model's ``sample`` word)
    # Memory over time (engine counters): the simulated peak per actor (rank class), and each actor's
    # (time s, bytes) series; the analytic peak is ``peak_memory_gib``.
    simulated_peak_memory_gib: dict[str, float] = field(default_factory=dict)
    memory_series_bytes: dict[str, list[tuple[float, float]]] = field(default_factory=dict, repr=False)
    actor_stage: dict[str, int] = field(default_factory=dict, repr=False)  # rank class -> pipeline stage
    extra: dict[str, Any] = field(default_factory=dict)
    # (layers whose FLOPs are counted, all layers) where some are not (a profile's blocks measured as a
    # whole, whose lines give no shapes): they count 0, so TFLOP/s and MFU count the others (a lower
    # bound, said in a NOTE: workloads/networks/profiles.py uncounted_flops_note); None: all counted
    flops_counted_layers: tuple[int, int] | None = None
    run: dict[str, Any] = field(default_factory=dict)  # model, node, accelerator, sequence, precision
    # the parameters the layout holds where they differ from the model's own ``num_parameters``: a
    # transformer's vocabulary padded to make_vocab_size_divisible_by x tp (Megatron); None: the same
    num_parameters_padded: int | None = None
    # the parameters trained where not all are: LoRA's adapters (training.finetune, workloads/lora.py), the base
    # frozen; None: every parameter is trained
    num_trained_parameters: int | None = None
    # the ``parallelism:`` fields the strategy kind reads (simulator/strategies/registry.py, layout_fields_read),
    # which the table's layout line shows; None: every field (spmd). Not in --json (its ``parallelism`` is whole)
    layout_fields_read: frozenset[str] | None = field(default=None, repr=False)
    busiest_stage: int | None = None  # the stage that waits least, when not the critical rank's
    busiest_stage_breakdown_s: dict[str, float] = field(default_factory=dict)
    timeline_builder: Callable[[], list[TimelineEvent]] | None = field(default=None, repr=False)
    _timeline_cache: list[TimelineEvent] | None = field(default=None, repr=False)

    @property
    def timeline(self) -> list[TimelineEvent]:
        """Every task of the simulated step as an event (built on first use: sweeps never pay for it)."""
        if self._timeline_cache is None:
            self._timeline_cache = self.timeline_builder() if self.timeline_builder else []
        return self._timeline_cache

    @property
    def padded_differs(self) -> bool:
        """Whether the layout holds more parameters than the model's own (a padded vocabulary)."""
        return self.num_parameters_padded is not None and self.num_parameters_padded != self.num_parameters

    @property
    def tokens_per_s(self) -> float | None:
        """Tokens per second, only where the model has a sequence."""
        return self.tokens_per_step / self.step_time_s if self.step_time_s and self.tokens_per_step else None

    @property
    def samples_per_s(self) -> float | None:
        """Samples (``sample``: sequences, images, ...) per second."""
        return self.samples_per_step / self.step_time_s if self.step_time_s else None

    def _tflops_per_gpu(self, flops: float) -> float | None:
        """None where there is no step time or no counted FLOPs (a measured profile none of whose
        layers gives its shapes: a 0.0 would read as a result). FLOPs counted for only some layers
        give a figure over those (the others count 0; the run's NOTE says which)."""
        if not self.step_time_s or not flops:
            return None
        return flops / (self.step_time_s * self.num_gpus) / 1e12

    @property
    def model_tflops_per_gpu(self) -> float | None:
        return self._tflops_per_gpu(self.model_flops_per_step)

    @property
    def hardware_tflops_per_gpu(self) -> float | None:
        return self._tflops_per_gpu(self.hardware_flops_per_step)

    @property
    def mfu(self) -> float | None:
        value = self.model_tflops_per_gpu
        return value / self.peak_tflops_per_gpu if value is not None else None

    @property
    def hfu(self) -> float | None:
        value = self.hardware_tflops_per_gpu
        return value / self.peak_tflops_per_gpu if value is not None else None

    @property
    def time_to_train_days(self) -> float | None:
        if not self.tokens_to_train or not self.tokens_per_s:
            return None
        return self.tokens_to_train / self.tokens_per_s / 86400

    def to_dict(self) -> dict[str, Any]:
        """The ``clustersim simulate --json`` object."""
        out = {
            "scenario": self.scenario_name,
            **{k: v for k, v in self.run.items() if k != "seq_length_source"},
            "num_gpus": self.num_gpus,
            "num_parameters": self.num_parameters,
            **({"num_parameters_padded": self.num_parameters_padded} if self.padded_differs else {}),
            **({"num_trained_parameters": self.num_trained_parameters}
               if self.num_trained_parameters is not None else {}),
            "parallelism": self.parallelism,
            "step_time_s": self.step_time_s,
            "steps": self.steps,
            "steps_requested": self.steps_requested if self.steps_requested is not None else self.steps,
            "steps_run": self.steps,
            "steps_rounding": self.steps_rounding,
            "step_times_s": self.step_times_s,
            "makespan_s": self.makespan_s,
            "samples_per_s": self.samples_per_s,
            "sample": self.sample,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "flops_counted_layers": list(self.flops_counted_layers) if self.flops_counted_layers else None,
            "peak_memory_gib": self.peak_memory_gib,
            "peak_memory_stage": self.peak_memory_stage,
            "simulated_peak_memory_gib": max(self.simulated_peak_memory_gib.values(), default=None),
            "simulated_peak_memory_per_rank_gib": self.simulated_peak_memory_gib,
            "hbm_gib": self.hbm_gib,
            "fits": self.fits,
            "memory_gib": self.memory_gib,
            "memory_per_stage_gib": self.memory_per_stage_gib,
            "time_breakdown_s": self.time_breakdown_s,
            "busiest_stage": self.busiest_stage,
            "busiest_stage_breakdown_s": self.busiest_stage_breakdown_s or None,
            "time_to_train_days": self.time_to_train_days,
            "layer_split": self.layer_split,
            "layers_per_stage": self.layers_per_stage,
            "simulation_mode": self.mode,
            "infeasible_reason": self.infeasible_reason,
        }
        out.update(self.extra)
        return out

    def to_flat_dict(self) -> dict[str, Any]:
        """``to_dict()`` with nested mappings as ``outer.inner`` keys (``parallelism`` as ``layout.*``):
        every value a scalar or a list, every name with its unit."""
        flat: dict[str, Any] = {}

        def put(key: str, value: Any) -> None:  # a mapping inside a mapping (framework_profile's factors) too
            if isinstance(value, dict):
                for inner, v in value.items():
                    put(f"{key}.{inner}", v)
            else:
                flat[key] = value

        for key, value in self.to_dict().items():
            put("layout" if key == "parallelism" else key, value)
        return flat

    def to_frame(self):
        """One row of a pandas DataFrame with flat columns (see :meth:`to_flat_dict`)."""
        import pandas as pd

        return pd.DataFrame([self.to_flat_dict()])

    def _repr_html_(self) -> str:
        """The summary table as HTML, so that a notebook shows a result readably."""
        from html import escape

        return f"<pre>{escape(render_table(self))}</pre>"

    def __repr__(self) -> str:
        return (f"SimulationResult({self.scenario_name!r}, {self.num_gpus} GPUs, step_time_s="
                f"{_fmt(self.step_time_s, '.4g')}, mfu={_fmt(self.mfu, '.3f')}, fits={self.fits})")

    def timeline_dicts(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.timeline]


def finite_json(value: Any) -> Any:
    """A value for JSON, which has no NaN or Infinity: non-finite floats become null (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:{spec}}{unit}"


def _seconds_spec(value: float | None) -> str:
    """The format of a step time in the table: three decimals from one second up, else four significant
    digits. Three decimals alone printed a 3.85 ms VGG-16 step as "0.004 s" (and the per-step list of a
    40-step run as "0.008, 0.008, ..."), one significant digit where the header and --json say 3.849 ms."""
    return ".3f" if value is None or not math.isfinite(value) or abs(value) >= 1 else ".4g"


def _breakdown_unit(step_time_s: float | None) -> tuple[float, str]:
    """Scale and unit of the time-breakdown lines: seconds from a one-second step up, else milliseconds.
    In seconds with three decimals a 0.126 s ResNet-50 step printed its 0.225 ms gradient all-reduce as
    "dp_comm 0.000 s 0.2%" (and an 8.3 ms VGG-16 step every line as 0.00x s), while `plot` and --json
    give 0.000225 s."""
    if step_time_s is None or not math.isfinite(step_time_s) or abs(step_time_s) >= 1:
        return 1.0, "s"
    return 1e3, "ms"


def _breakdown_lines(breakdown: dict[str, float], total: float, scale: float, unit: str) -> list[str]:
    """One line per kind of work with time: its time in ``unit`` and its share of ``total``."""
    lines = []
    for key in BREAKDOWN_KEYS:
        value = breakdown.get(key) or 0.0
        if value > 0:
            lines.append(f"    {key:<16} {scale * value:10.3f} {unit:<2} {100 * value / total:5.1f}%")
    return lines


def _step_list(result: SimulationResult) -> str:
    """The ``(mean of N steps: t1, t2, ... s)`` after the step time of a run of several steps. Past eight steps
    the slowest is named too when it is not among the eight shown: DiLoCo's outer step (the 16th of 16) used to
    hide behind "1.262, 1.262, ..." under a mean of 1.265."""
    if result.steps <= 1:
        return ""
    spec = _seconds_spec(result.step_time_s)
    times = list(result.step_times_s)
    text = f" (mean of {result.steps} steps: {', '.join(_fmt(t, spec) for t in times[:8])}"
    if len(times) > 8:
        text += ", ..."
        slowest = max(range(len(times)), key=lambda i: times[i])
        if slowest >= 8 and _fmt(times[slowest], spec) != _fmt(max(times[:8]), spec):
            return text + f" s; slowest: step {slowest + 1}, {_fmt(times[slowest], spec)} s)"
    elif result.steps > 8:
        text += ", ..."
    return text + " s)"


def _economics_inputs_line(extra: dict[str, Any]) -> str:
    """What the "with failures" line's cost, energy and goodput rest on (simulator/economics/cost.py). The
    price and PUE are the ``economics:`` block's, by default assumptions (2 USD a GPU-hour, PUE 1.2); the
    interruptions Llama 3's Table 5 rates unless the block gives its own. Before this line the dollars
    appeared with no word of the price they came from."""
    gpu_hours = extra.get("gpu_hours")
    price = extra["cost_usd"] / gpu_hours if gpu_hours else None
    mtbf = extra.get("job_mtbf_hours")
    failures = (f"one interruption every {mtbf:,.1f} h" if mtbf is not None and math.isfinite(mtbf)
                else "no interruptions")
    interval = extra.get("checkpoint_interval_min")
    checkpoints = f", a checkpoint every {interval:,.0f} min" if interval is not None and math.isfinite(interval) else ""
    return (f"                 from {_fmt(price, ',.2f')} USD per GPU-hour, {_fmt(extra.get('avg_power_kw'), ',.0f')} kW "
            f"average with cooling (PUE), {failures}{checkpoints} (an economics: block sets each; unset, "
            "assumed: docs/commands.md)")


def _split_note(choice: dict | None) -> str:
    """``pp_split: balanced``: which cut the schedule estimate took, with the even cut's estimate."""
    if not choice:
        return ""
    from simulator.strategies.spmd.split import describe_split

    return f" ({describe_split(choice)})"


def _run_lines(result: SimulationResult) -> list[str]:
    run = result.run
    if not run:
        return []
    seq = ""
    if run.get("seq_length"):
        seq = f", sequence {run['seq_length']:,}"
        if run.get("seq_length_source") not in (None, "training.seq_length", "the model's seq_length"):
            seq += f" (from {run['seq_length_source']}; set training.seq_length to change it)"
        if run.get("document_tokens"):  # training.packing: the attention core and its model FLOPs per document
            seq += (f" packed with documents of {run['document_tokens']:,} tokens (attention per document; model "
                    "FLOPs count each document's square)")
    priced = result.extra.get("precision_priced")  # fp8 asked, no GEMM of the model in fp8_gemms (a WARNING says)
    precision = run["precision"] + (f" (priced as {priced}: no GEMM in fp8_gemms)" if priced else "")
    return [f"  model          {run['model']}{seq}, {precision}",
            _hardware_line(run, result), *_framework_lines(run, result.extra.get("framework_profile"),
                                                           result.extra.get("node_groups"))]


def _framework_lines(run: dict[str, Any], profile: dict[str, Any] | list | None,
                     groups: list[dict[str, Any]] | None = None) -> list[str]:
    """``training.framework``: the profile, whether its factors were fitted here, carried over or assumed
    (with the command's ``framework_profile``: in words, with the factors and rows). A mixed cluster has one
    entry per node group: printed once when every group's is the same, else each after its accelerator."""
    if profile:
        choices = profile if isinstance(profile, list) else [profile]
        texts = [f"none named: {c['note']}" if c.get("profile_applies") is False
                 else f"{c['name']} ({c['state']}): {c['note']}" for c in choices]
        if len(set(texts)) == 1:
            texts = texts[:1]
        elif groups and len(groups) == len(texts):
            texts = [f"{g['accelerator']}: {t}" for g, t in zip(groups, texts, strict=True)]
        lines = [f"  framework      {t}" for t in texts]
        if choices[0].get("settings_applied"):
            lines.append(f"                 its settings (the scenario left them out): "
                         f"{', '.join(choices[0]['settings_applied'])}")
        return lines
    if run.get("framework"):
        return [f"  framework      {run['framework']} ({run['framework_state']})"]
    return []


def _hardware_line(run: dict[str, Any], result) -> str:
    groups = result.extra.get("node_groups")
    if not groups:
        return f"  hardware       {run['num_nodes']} x {run['node']} ({run['accelerator']}), {result.num_gpus} GPUs"
    parts = [f"{g['nodes']} x {g['node']} ({g['accelerator']}, ranks {g['ranks'][0]}-{g['ranks'][1]})" for g in groups]
    return f"  hardware       {' + '.join(parts)}, {result.num_gpus} GPUs (mixed; mean peak over ranks)"


def _co_location_lines(result: SimulationResult) -> list[str]:
    """The jobs sharing the GPUs (simulator/colocation/run.py): each one's throughput alone and shared."""
    info = result.extra.get("co_location")
    if not info:
        return []
    lines = ["", f"  co-located jobs on the same {result.num_gpus} GPUs (a lower priority runs only when the higher "
                 "ones leave a GPU idle)",
             f"    {'job':<30} {'prio':>4} {'step alone':>11} {'step shared':>12} {'samples/s alone':>16} "
             f"{'shared':>10} {'relative':>9}"]
    for job in info["jobs"]:
        lines.append(f"    {job['scenario'][:30]:<30} {job['priority']:>4} {_fmt(job['step_time_alone_s'], '.4f', ' s'):>11} "
                     f"{_fmt(job['step_time_shared_s'], '.4f', ' s'):>12} {_fmt(job['samples_per_s_alone'], ',.1f'):>16} "
                     f"{_fmt(job['samples_per_s_shared'], ',.1f'):>10} {_fmt(job['relative_throughput'], '.3f'):>9}")
    lines.append(f"    cluster total: {_fmt(info['model_tflops_per_gpu_total'], '.1f')} model TFLOP/s per GPU; "
                 f"normalised throughput {_fmt(info['normalized_throughput'], '.3f')} (sum of relative; 1 = the "
                 "foreground alone)")
    lines.append(f"    memory per GPU: every job's peak together {_fmt(info['peak_memory_gib_total'], '.2f')} GiB")
    for job in info["jobs"][1:]:
        source = "ASSUMED (not measured)" if job.get("interference_assumed") else f"source: {job['interference_source']}"
        lines.append(f"    interference: while {job['scenario']} waits on a GPU, higher-priority kernels there run "
                     f"at 1/(1+{job['interference_slowdown']:g}); {source}")
    lines += [f"    note: {note}" for note in info.get("notes", [])]
    return lines


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


def _reliability_lines(rel: dict[str, Any]) -> list[str]:
    """The ``reliability`` block's simulated goodput, failures and where the time was lost."""
    span = f"{rel['simulated_days']:,.2f} days, {rel['steps_done']:,} steps"
    if rel.get("finished") is False:
        span += ", NOT FINISHED"
    analytic = (f"; analytic Young/Daly {100 * rel['goodput_analytic']:.1f}%"
                if rel.get("goodput_analytic") is not None else "")
    lines = [f"  goodput        {100 * rel['goodput']:.1f}% simulated ({span}, seed {rel['seed']}){analytic}"
             + (f"; time to train {rel['effective_time_to_train_days']:,.1f} days"
                if rel.get("effective_time_to_train_days") is not None else ""),
             f"                 {rel['recovery']}",
             f"                 failures seen  {rel['failures']:,}" + (
                 f" ({rel['failures_during_recovery']:,} during restarts)" if rel.get("failures_during_recovery")
                 else "") + (f", job MTBF {rel['job_mtbf_hours']:.2f} h" if rel.get("job_mtbf_hours") else "")]
    lost = {k[len("lost_"):-len("_s")]: v for k, v in rel.items() if k.startswith("lost_") and k.endswith("_s")}
    lines.append("                 time lost      " + ", ".join(f"{k.replace('_', ' ')} {_hours(v)}"
                                                            for k, v in lost.items()) +
                 f" (of {_hours(rel['wall_s'])} wall)")
    if rel.get("checkpoint_interval_s"):
        lines.append(f"                 checkpoints    every {rel['checkpoint_interval_steps']} steps "
                     f"({rel['checkpoint_interval_s']:.0f} s), {rel['checkpoint_write_s']:.1f} s each "
                     f"({rel['state_gb']:,.0f} GB); restart {rel['restart_s']:.0f} s")
    analytic_value = rel.get("goodput_analytic")
    if analytic_value is not None and abs(rel["goodput"] - analytic_value) > 0.02:
        reasons = []
        if lost.get("waiting_for_spares"):
            reasons.append(f"{_hours(lost['waiting_for_spares'])} waiting for spare nodes (the formula's restart is "
                           "fixed)")
        if rel.get("failures_during_recovery") and rel.get("job_mtbf_hours") and \
                rel["restart_s"] > 0.1 * rel["job_mtbf_hours"] * 3600:
            reasons.append("restarts long against the MTBF (the formula is first order in restart/MTBF)")
        lines.append(f"                 vs formula     {100 * (rel['goodput'] - analytic_value):+.1f} pp"
                     + (": " + "; ".join(reasons) if reasons else " (a short run: few failures)"))
    if rel.get("download_s") is not None:
        lines.append(f"                 a returning replica downloads {rel['state_gb']:,.0f} GB in "
                     f"{rel['download_s']:.1f} s; collective timeout {rel['collective_timeout_s']:g} s")
    return lines


def _flop_lines(result: SimulationResult) -> list[str]:
    """TFLOP/s and MFU, or n/a with the reason where the model counts no FLOPs."""
    if result.step_time_s and not result.model_flops_per_step:
        why = ("n/a (the model counts no FLOPs: no layer of the measured per-layer profile gives its shapes, "
               "blocks named without them)")
        return [f"  TFLOP/s/GPU    {why}", "  MFU / HFU      n/a"]
    return [f"  TFLOP/s/GPU    {_fmt(result.model_tflops_per_gpu, '.1f')} model, "
            f"{_fmt(result.hardware_tflops_per_gpu, '.1f')} hardware (peak {result.peak_tflops_per_gpu:g})",
            f"  MFU / HFU      {_fmt(result.mfu and result.mfu * 100, '.1f', '%')} / "
            f"{_fmt(result.hfu and result.hfu * 100, '.1f', '%')}"]


def _steps_rounded_lines(result: SimulationResult) -> list[str]:
    """Where the kind ran other than the steps asked (local_sgd rounds up to whole periods of H):
    "8 steps asked, 16 run (one whole period of H = 16)"."""
    asked = result.steps_requested
    if asked is None or asked == result.steps:
        return []
    why = f" ({result.steps_rounding})" if result.steps_rounding else ""
    return [f"  steps          {asked} step{'s' if asked != 1 else ''} asked, {result.steps} run{why}"]


def _summed_activation_lines(summed: dict[str, float] | None) -> list[str]:
    """cyclic_dp (simulator/strategies/cyclic_dp.py): the N workers' activations summed, min-max over the
    step, against data parallelism's (Fournier & Oyallon 2024, Sec. 3: flat instead of 0 to N peaks)."""
    if not summed:
        return []
    return [f"    {'activations sum':<16} {summed['cyclic_min']:.2f}-{summed['cyclic_max']:.2f} GiB over the step, "
            f"summed over the {summed['workers']} workers (data parallelism: {summed['data_parallel_min']:.2f}-"
            f"{summed['data_parallel_max']:.2f} GiB)"]


def _per_layer_split_lines(report: dict | None) -> list[str]:
    """per_layer (simulator/strategies/per_layer/kind.py, ``split_report``): what each layer really splits,
    and where a cut of the default folded into batch on layers that cannot make it."""
    if not report:
        return []
    runs = list(report["runs"].items())
    lines = ["  splits         " + ", ".join(f"{label} on {n} layer{'s' if n != 1 else ''}" for label, n in runs)]
    for fold in report["folded"]:
        total = sum(fold["layers"].values())
        kinds = ", ".join(f"{kind} x{n}" for kind, n in fold["layers"].items())
        lines.append(f"                 strategy.default {fold['default']} runs as {fold['runs']} on {total} "
                     f"layer{'s' if total != 1 else ''} that cannot make its cut: {kinds}")
    return lines


#: The ``parallelism:`` fields the layout line shows, in order, each with its label (None: the value alone).
LAYOUT_LINE: tuple[tuple[str, str | None], ...] = (
    ("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "ep"), ("virtual_stages", "vp"), ("schedule", None),
    ("zero_stage", "zero"), ("recompute", "recompute"), ("sequence_parallel", "sp"), ("micro_batch_size", "mbs"),
    ("global_batch_size", "gbs"))


def layout_text(par: dict[str, Any], read: frozenset[str] | None = None) -> str:
    """The layout line's ``tp=8 pp=8 dp=16 ... gbs=1536``: every field of :data:`LAYOUT_LINE` for spmd (``read``
    None), else only those the strategy kind reads (:func:`simulator.strategies.registry.layout_fields_read`):
    swarm runs GPipe whatever ``parallelism.schedule`` says, so its line has no schedule."""
    parts = []
    for name, label in LAYOUT_LINE:
        if read is not None and name not in read:
            continue
        value = par.get(name, 1) if name == "ep" else par[name]
        if name == "recompute" and par.get("recompute_modules"):
            value = f"{value}[{','.join(par['recompute_modules'])}]"
        parts.append(f"{label}={value}" if label else str(value))
    return " ".join(parts)


def _folded_note(result: SimulationResult) -> str:
    """", folded from 68 micro-batches" where the engine ran a long pipeline folded (the one count it ran; before the
    thirteenth session two counts, "from 66 and 67")
    (simulator/strategies/spmd/fold.py; ``engine_fold`` in --json): the table said nothing of it, though a folded
    result has no memory-over-time series and no timeline."""
    fold = result.extra.get("engine_fold")
    if not fold:
        return ""
    counts = fold["micro_batches_evaluated"]
    return f", folded from {' and '.join(str(m) for m in counts)} micro-batches"


def _stage_lines(result: SimulationResult) -> list[str]:
    """The layers of each pipeline stage: spmd's cut of ``parallelism.pp`` (its chunks under the interleaved
    schedule), or DAPPLE's stages and their replicas (replicated_pipeline: its strategy block's, not ``pp``); none
    for a kind that reads no ``pp`` (per_layer, subnetwork DP, cyclic DP: one stage, the whole model)."""
    extra = result.extra
    if extra.get("stage_layers") is not None and extra.get("stage_replicas") is not None:
        return [f"  layers/stage   {extra['stage_layers']} (replicas: {extra['stage_replicas']})"]
    if result.layout_fields_read is not None and "pp" not in result.layout_fields_read:
        return []
    return [f"  layers/stage   {result.layers_per_stage}" + (
        f" (chunks: {result.layer_split})" if len(result.layer_split) != len(result.layers_per_stage) else "")
        + _split_note(extra.get("pp_split_choice"))]


def parameter_count(params: float) -> str:
    """A parameter count as people say it: billions from 1 B up ("6.74 B"), millions below ("25.6 M")."""
    return f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"


def render_table(result: SimulationResult) -> str:
    """A readable summary for the terminal."""
    par = result.parallelism
    lines = [
        f"clustersim: {result.scenario_name} on {result.num_gpus} GPUs ({result.mode} mode, "
        f"{'fast path' if result.extra.get('engine') == 'fast' else 'engine'}{_folded_note(result)})",
        *_run_lines(result),
        f"  layout         {layout_text(par, result.layout_fields_read)}",
        *([f"  strategy       {result.run['strategy']} (the layout line shows the `parallelism:` fields it reads; its "
           "`strategy:` block sets the rest)"] if result.run.get("strategy", "spmd") != "spmd" else []),
        *_per_layer_split_lines(result.extra.get("per_layer_splits")),
        f"  parameters     {parameter_count(result.num_parameters)}" + (
            f" (held: {parameter_count(result.num_parameters_padded)}, "
            f"+{parameter_count(result.num_parameters_padded - result.num_parameters)} of vocabulary padded to a "
            f"multiple of make_vocab_size_divisible_by x tp, as Megatron pads it)" if result.padded_differs else "") + (
            f"; trained: {parameter_count(result.num_trained_parameters)} (LoRA adapters; the base frozen)"
            if result.num_trained_parameters is not None else ""),
        *_stage_lines(result),
        "",
        f"  step time      {_fmt(result.step_time_s, _seconds_spec(result.step_time_s), ' s')}{_step_list(result)}",
        *_steps_rounded_lines(result),
        f"  samples/s      {_fmt(result.samples_per_s, ',.1f')} ({result.sample}s)",
        *([f"  tokens/s       {_fmt(result.tokens_per_s, ',.0f')}" + (
            f" ({result.tokens_per_step // result.samples_per_step} tokens per {result.sample})"
            if result.sample == "image" and result.samples_per_step else "")] if result.tokens_per_step else []),
        *_flop_lines(result),
    ]
    if result.extra.get("stragglers"):
        extra = result.extra
        lines.append(f"  stragglers     {extra['stragglers']}: time factors drawn {extra['straggler_factor_min']:.2f}"
                     f"-{extra['straggler_factor_max']:.2f} (mean {extra['straggler_factor_mean']:.3f})")
    if result.time_to_train_days is not None:
        lines.append(f"  time to train  {result.time_to_train_days:.1f} days for {result.tokens_to_train:.3g} tokens")
        extra = result.extra
        if extra.get("effective_time_to_train_days") is not None:
            lines.append(f"  with failures  {extra['effective_time_to_train_days']:.1f} days (analytic goodput "
                         f"{100 * extra['goodput']:.1f}%), {extra['gpu_hours']:,.0f} GPU-hours, "
                         f"${extra['cost_usd']:,.0f}, {extra['energy_mwh']:,.0f} MWh")
            lines.append(_economics_inputs_line(extra))
    if result.extra.get("steps_to_target") is not None:
        extra = result.extra
        lines.append(f"  time to target {_fmt(extra.get('time_to_target_s'), ',.0f', ' s')} = "
                     f"{extra['steps_to_target']:,.0f} steps x step time")
        lines.append(f"                 source: {extra['convergence_source']}")
    if result.extra.get("reliability"):
        lines += _reliability_lines(result.extra["reliability"])
    if result.extra.get("fast_path_approximation"):
        lines.append(f"  fast path      approximate: {result.extra['fast_path_approximation']}")
    for i, line in enumerate(result.extra.get("framework_terms_dropped") or ()):  # strategies/framework_terms.py
        lines.append(f"  {'framework' if i == 0 else '':<14} {line}")
    lines += ["", "  where the step's time goes on the critical rank (the one that finishes last): busy time, "
                  "and exposed waits", "  (communication hidden under compute is not counted)"]
    total = sum(v for v in result.time_breakdown_s.values() if v) or 1.0
    if not any(result.time_breakdown_s.values()):
        lines.append("    - (not simulated)")
    scale, unit = _breakdown_unit(result.step_time_s)
    lines += _breakdown_lines(result.time_breakdown_s, total, scale, unit)
    if result.busiest_stage is not None and result.busiest_stage_breakdown_s:
        b = result.busiest_stage_breakdown_s
        busy_total = sum(v for v in b.values() if v) or 1.0
        lines += ["", f"  stage {result.busiest_stage}, the one that waits least (what bounds the pipeline: the "
                      "critical rank's bubble is its work)"]
        lines += _breakdown_lines(b, busy_total, scale, unit)
    lines += _co_location_lines(result)
    # which stage holds the most, where there are several (one stage: nothing to choose; "stage 0" on per_layer,
    # subnetwork DP or data parallelism named a stage the run does not have)
    lines += ["", "  memory per GPU" + (f" (stage {result.peak_memory_stage}, the highest peak)"
                                      if len(result.memory_per_stage_gib) > 1 else "")]
    for key, value in result.memory_gib.items():
        lines.append(f"    {key:<16} {value:10.2f} GiB")
    verdict = "fits" if result.fits else f"DOES NOT FIT: {result.infeasible_reason}"
    lines.append(f"    {'total':<16} {result.peak_memory_gib:10.2f} GiB of {result.hbm_gib:g} GiB HBM — {verdict}")
    if result.extra.get("sdp_memory_reduction") is not None:  # subnetwork_dp: a worker against data parallelism
        e = result.extra
        lines.append(f"    {'vs data par.':<16} {100 * e['sdp_memory_reduction']:9.1f}%  less per worker: model state "
                     f"{100 * e['sdp_model_state_reduction']:.1f}% less, activations "
                     f"{100 * e['sdp_activation_reduction']:.1f}% less")
    lines += _summed_activation_lines(result.extra.get("summed_activation_gib"))
    if result.simulated_peak_memory_gib:
        peaks = result.simulated_peak_memory_gib
        shown = ", ".join(f"{a} {v:.2f}" for a, v in list(peaks.items())[:8]) + (", ..." if len(peaks) > 8 else "")
        lines.append(f"    {'simulated peak':<16} {max(peaks.values()):10.2f} GiB (memory over time; per rank: {shown})")
    provenance = result.extra.get("efficiency_provenance")
    if provenance:
        from simulator.cost.provenance import (
            ASSUMED,
            CALIBRATED,
            DERIVED,
            STATED,
            assumed_note,
            provenance_state,
        )

        states = {k: provenance_state(v) for k, v in provenance.items()}
        calibrated = [k for k, (state, _) in states.items() if state == CALIBRATED]
        derived = [f"{k} ({source})" for k, (state, source) in states.items() if state == DERIVED]
        stated = [k for k, (state, _) in states.items() if state == STATED]
        assumed = [f"{k} ({assumed_note(k)})" if assumed_note(k) else k
                   for k, (state, _) in states.items() if state == ASSUMED]
        lines += ["", "  efficiencies   calibrated (fitted on rows measured on this part): " + (", ".join(calibrated) or "none"),
                  "                 derived (from another part or a ratio): " + (", ".join(derived) or "none"),
                  *(["                 stated (a datasheet or external figure, not fitted here): " + ", ".join(stated)]
                    if stated else []),
                  "                 ASSUMED (not measured): " + (", ".join(assumed) or "none")]
    for i, g in enumerate(result.extra.get("grouped_gemm", ())):  # MoE experts (simulator/cost/provenance.py)
        lines.append(f"  {'grouped GEMM' if i == 0 else '':<14} {g['accelerator']} {g['precision']}, {g['framework']}: "
                     f"{g['note']}")
    from simulator.report.messages import message_lines

    lines = [piece for line in lines for piece in wrap_table_line(line)]
    lines += message_lines(_warnings_under_table(result, framework_line_shown=bool(_framework_lines(
        result.run or {}, result.extra.get("framework_profile"), result.extra.get("node_groups")))),
        result.extra.get("notes", ()))
    return "\n".join(lines)


def _warnings_under_table(result: SimulationResult, framework_line_shown: bool) -> list[str]:
    """The run's WARNINGs as the table prints them: the no-framework WARNING without what the table's
    ``framework`` line already says (:func:`simulator.cost.default_framework.default_framework_warning`);
    ``--json`` keeps the whole text."""
    warnings = list(result.extra.get("warnings", ()))
    block = result.extra.get("default_framework")
    if not (block and framework_line_shown):
        return warnings
    from simulator.cost.default_framework import default_framework_warning

    whole = default_framework_warning(block)
    return [default_framework_warning(block, framework_line_shown=True) if w == whole else w for w in warnings]


#: Widest line of ``clustersim simulate``'s table (the no-framework WARNING's lines are at most 102 wide).
TABLE_WIDTH = 110
#: A table line's label: up to 28 columns of indent and words, then two or more spaces before its value.
_LABEL = re.compile(r"( *\S+(?: \S+)*? {2,})(?=\S)")


def wrap_table_line(line: str, width: int = TABLE_WIDTH) -> list[str]:
    """``line`` as lines of at most ``width`` columns where it has spaces to break at: the first keeps its label
    (``  efficiencies   ``, ``    simulated peak      ``), the rest are indented 2 past the column its value starts
    at (the leading spaces of a line without a label), as the no-framework WARNING's lines are under it. Words are
    never cut: a word longer than the width stays whole. Only the table is wrapped (``--json``, CSV and the
    messages after the table are not); a phrase may run across two lines, which :func:`unwrap_table` joins."""
    if len(line) <= width:
        return [line]
    start = _value_start(line)
    glued = _NUMBER_UNIT.sub(lambda m: m.group(1) + _GLUE, line[start:])  # "3.1 h" never split over two lines
    return [piece.replace(_GLUE, " ") for piece in
            textwrap.wrap(glued, width=width, initial_indent=line[:start], subsequent_indent=" " * (start + 2),
                          break_long_words=False, break_on_hyphens=False)]


#: A number and the unit after it, kept on one line by :func:`wrap_table_line` ("one interruption every 3.1" then
#: "h" on the next line, before): the space between them is replaced by ``_GLUE`` while wrapping.
_NUMBER_UNIT = re.compile(r"(\d) (?=(?:s|ms|us|h|min|days|GiB|GB|MB|kW|MWh|W|B|M|GB/s|Gb/s|TFLOP/s|%)(?:[\s,;:.)]|$))")
_GLUE = "\x00"


def _value_start(line: str) -> int:
    label = _LABEL.match(line)
    return label.end() if label and label.end() <= 28 else len(line) - len(line.lstrip(" "))


def unwrap_table(text: str, width: int = TABLE_WIDTH) -> list[str]:
    """The lines of a table :func:`render_table` printed, each wrapped line joined back into one (what a script
    that reads one line per field wants). A line continues the one above when it is indented 2 past that one's
    value column and its first word would not have fitted on the line above (how :func:`wrap_table_line` breaks),
    except a labelled line (``  model          ...``) under the title line, whose value column is 0 (a folded run's
    107-column title took the model line in); from the first WARNING or NOTE on, lines are kept as printed."""
    out: list[str] = []
    last = ""  # the physical line above
    messages = False  # the WARNINGs and NOTEs after the table keep their own lines (simulator/report/messages.py)
    for line in text.splitlines():
        body = line.lstrip(" ")
        messages = messages or body.startswith(("WARNING: ", "NOTE: "))
        if (not messages and out and body and len(line) - len(body) == _value_start(out[-1]) + 2
                and len(last) + 1 + len(_NUMBER_UNIT.sub(lambda m: m.group(1) + _GLUE, body).split(" ")[0]) > width
                and not (_value_start(out[-1]) == 0 and _LABEL.match(line))):  # the title, then a field's line
            out[-1] += " " + body
        else:
            out.append(line)
        last = line
    return out
