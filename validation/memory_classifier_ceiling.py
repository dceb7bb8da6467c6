"""How far any classifier fitted on Hagemann's OOM labels could take the layout ranking.

The Hagemann ranking target (mean Spearman >= 0.8, ``validation/layout_ranking.py``) is missed
because measured runs that the memory classifier calls OOM rank last, and they are often their
group's fastest. The sweep has OOM labels but no memory readings. This asks whether a better
classifier fitted on the same labels could close the gap.

It fits a gradient-boosted tree classifier on the fit half's labels. Its features are the
analytic breakdown of the heaviest stage (states, activations, micro-batches in flight), the
layout and the run's settings, and optionally the profile's own margin (framework peak minus
usable HBM). The tree is not a memory model. It is only an upper reference for what the labels
allow.

On the held-out half, each classifier's verdict then ranks the measured runs by their
simulated rate, with predicted OOM last, as the target counts them:
- the profile;
- the tree, without and with the profile's margin;
- an oracle that knows the measured labels.

Measured 2026-12-04 on 213 held-out runs:

| classifier | OOM right | ok→oom | oom→fits | mean Spearman |
|---|---|---|---|---|
| profile | 95.4% | 12 | 11 | 0.703 |
| tree | 96.2% | 9 | 10 | 0.743 |
| tree + margin | 97.6% | 8 | 4 | 0.750 |
| oracle | 100% | 0 | 0 | 0.876 |

A classifier that beats the profile on accuracy still leaves the ranking near 0.75. The runs
it gets wrong are the same near-boundary runs, including the pairs that contradict each
other (see ``layout_ranking``'s docstring). With these labels alone, the target is out of
reach; closing it needs memory readings.

Needs scikit-learn. It is not a core dependency of clustersim; install it with
``pip install -e ".[analysis]"``. Run ``python -m validation.memory_classifier_ceiling [--workers N]``
(~15 s).
"""

from __future__ import annotations

import argparse
import sys

from validation import layout_ranking as lr
from validation.calibrate_frameworks import _breakdowns

FEATURES = ("states_gib", "activations_gib", "activations_per_microbatch_gib", "in_flight", "analytic_peak_gib",
            "tp", "pp", "micro_batch_size", "seq", "sequence_parallel", "full_recompute", "standard_attention",
            "fused_rmsnorm", "num_gpus", "params_b", "layers_per_stage")


def features(cases: list[lr.Case], overhead) -> dict[str, dict[str, float]]:
    """Per case id, the features of its heaviest stage (by the analytic breakdown) and the
    profile's margin ``margin_gib`` (framework peak minus usable HBM; > 0 predicts OOM)."""
    from simulator.memory.analytic import GIB, microbatches_in_flight, usable_hbm_bytes
    from simulator.memory.overhead import framework_peak
    from workloads.counting import total_params

    out = {}
    for case, sc, stages in _breakdowns(cases):
        par = sc.parallelism
        totals = [b.total_bytes for b in stages]
        i = max(range(len(stages)), key=totals.__getitem__)
        b = stages[i]
        in_flight = max(1.0, microbatches_in_flight(par.schedule, par.pp, i, par.num_micro_batches,
                                                    par.virtual_stages))
        _, peak = framework_peak(sc, overhead, case.memory_variant)
        out[case.case_id] = {
            "states_gib": (b.weights_bytes + b.gradients_bytes + b.optimizer_bytes + b.other_bytes) / GIB,
            "activations_gib": b.activations_bytes / GIB,
            "activations_per_microbatch_gib": b.activations_bytes / GIB / in_flight,
            "in_flight": in_flight, "analytic_peak_gib": b.total_bytes / GIB,
            "tp": par.tp, "pp": par.pp, "micro_batch_size": par.micro_batch_size, "seq": sc.training.seq_length,
            "sequence_parallel": float(par.sequence_parallel), "full_recompute": float(par.recompute == "full"),
            "standard_attention": float(sc.training.attention == "standard"),
            "fused_rmsnorm": float(str(case.memory_variant).startswith("fused")), "num_gpus": sc.num_gpus,
            "params_b": total_params(sc.model) / 1e9, "layers_per_stage": sc.model.num_layers / par.pp,
            "margin_gib": (peak - usable_hbm_bytes(sc)) / GIB,
        }
    return out


def mean_spearman(runs: list[lr.Case], rate_if_run: dict[str, float], predicted_oom: dict[str, bool]) -> float:
    """Mean Spearman over the groups, as ``lr.ranking_report`` counts it: runs predicted OOM rank last."""
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for case in runs:
        value = 0.0 if predicted_oom[case.case_id] else rate_if_run[case.case_id]
        groups.setdefault(case.group, []).append((value, case.measured["tokens_per_s_per_gpu"]))
    return lr.mean_finite(lr.group_spearman(groups).values())


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        from sklearn.ensemble import GradientBoostingClassifier
    except ImportError:
        print('error: scikit-learn is needed for this analysis (pip install -e ".[analysis]")', file=sys.stderr)
        return 2
    cases, profile = lr.calibrated("hagemann")
    if profile is None:
        print(f"error: no profile at {lr.HAGEMANN_PROFILE}", file=sys.stderr)
        return 2
    overhead = profile.memory_overhead
    feats = features(cases, overhead)
    fit = [c for c in lr.fit_half(cases) if c.case_id in feats]
    held = [c for c in lr.heldout(cases) if c.case_id in feats]
    runs = [c for c in held if not c.measured_oom]
    table = lr.ranking_report(runs, args.workers, "tokens_per_s_per_gpu", overhead)["table"]
    rate_if_run = {str(k): v or 0.0 for k, v in zip(table["case_id"], table["predicted_tokens_per_s_per_gpu_if_run"],
                                                      strict=True)}

    verdicts = {"profile": {c.case_id: feats[c.case_id]["margin_gib"] > 0 for c in held}}
    for label, columns in (("tree", FEATURES), ("tree + margin", (*FEATURES, "margin_gib"))):
        model = GradientBoostingClassifier(random_state=0).fit(
            [[feats[c.case_id][k] for k in columns] for c in fit], [c.measured_oom for c in fit])
        predicted = model.predict([[feats[c.case_id][k] for k in columns] for c in held])
        verdicts[label] = {c.case_id: bool(p) for c, p in zip(held, predicted, strict=True)}
    verdicts["oracle"] = {c.case_id: c.measured_oom for c in held}

    print(f"held-out: {len(held)} runs ({len(runs)} measured ok); classifiers fitted on {len(fit)} fit-half labels")
    print(f"{'classifier':<15} {'OOM right':>9} {'ok->oom':>8} {'oom->fits':>9} {'mean Spearman':>14}")
    for label, verdict in verdicts.items():
        matrix = lr.confusion([c.measured_oom for c in held], [verdict[c.case_id] for c in held])
        print(f"{label:<15} {100 * lr.accuracy(matrix):8.1f}% {matrix['ok_predicted_oom']:>8} "
              f"{matrix['oom_predicted_fits']:>9} {mean_spearman(runs, rate_if_run, verdict):>14.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
