"""Layout ranking and OOM prediction against Hagemann 2023 and the Ultra-Scale Playbook
(validation/layout_ranking.py). The case mapping is unit-tested on rows; the validation tests
compute the issue's metrics on the held-out half (the framework profiles are fitted on the other
half) and FAIL below its targets (Spearman >= 0.8 per group on average, >= 90% OOM classified
right, median |error| of tokens/s/GPU <= 15%).

OOM classification runs on every held-out row (memory model only); the Playbook's throughput
error on every held-out finished run (~30 s) and on chosen parts of them, the Hagemann ranking on
a deterministic subset of each group (the full report: ``python -m validation.layout_ranking``)."""

from __future__ import annotations

import copy
import math
import pickle

import pandas as pd
import pytest

from validation import layout_ranking as lr


@pytest.fixture(scope="module", autouse=True)
def _each_case_simulated_once():
    """Several tests report on overlapping runs (the Playbook's held-out one- and two-node runs and its
    pipelines across nodes are subsets of every held-out finished run; the Hagemann subset is ranked
    by two tests): :func:`lr.predict_throughput` simulates each distinct input once per module. A
    case's row depends only on what ``predict_throughput`` passes the simulator (its scenario mapping,
    the memory overhead, its memory variant) and its mapping error, so that is the key (pickled:
    an unequal input only misses the memo); every test still gets the rows it got, as fresh copies."""
    original = lr.predict_throughput
    memo: dict[bytes, dict] = {}

    def once(cases, workers=None, overhead=None):
        dumped = overhead.model_dump() if overhead is not None else None
        keys = [pickle.dumps((c.raw, dumped, c.memory_variant, c.mapping_error)) for c in cases]
        todo = {k: c for k, c in zip(keys, cases, strict=True) if k not in memo}
        for k, row in zip(todo, original(list(todo.values()), workers, overhead), strict=True):
            memo[k] = row
        return [copy.deepcopy(memo[k]) for k in keys]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lr, "predict_throughput", once)
        yield


def _hagemann_row(trial_id: int) -> dict:
    frame = pd.read_csv(lr.HAGEMANN_CSV)
    return frame[frame.trial_id == trial_id].iloc[0].to_dict()


def test_hagemann_mapping_of_the_70_percent_mfu_run():
    frame = pd.read_csv(lr.HAGEMANN_CSV)
    row = frame.loc[67].to_dict()  # LLaMA 13B, 64 GPUs, tp 1 pp 1 mbs 1, FA2 + RMS kernel, no checkpointing
    case = lr.hagemann_case(row)
    assert case.raw == {
        "name": f"hagemann-{row['trial_id']}",
        "model": "llama-13b",
        "cluster": {"node": "dgx-a100-80g", "fabric": "fat-tree", "num_gpus": 64},
        "parallelism": {"tp": 1, "pp": 1, "dp": "auto", "virtual_stages": 1, "schedule": "1f1b",
                        "sequence_parallel": False, "zero_stage": 1, "recompute": "none",
                        "micro_batch_size": 1, "global_batch_size": 2048},
        "training": {"seq_length": 2048, "precision": "bf16", "attention": "flash", "optimizer": "adamw",
                     "grad_dtype": "bf16"},
    }
    assert case.memory_variant == "fused_rmsnorm"
    assert case.split_key == "Llama 13B|64|1|1|1|False|none|2048|flash_attention2 + RMS kernel"
    assert not case.measured_oom
    assert case.measured["mfu"] == pytest.approx(0.7057311797718144)
    assert case.measured["tokens_per_s_per_gpu"] == pytest.approx(4 * 2**20 / 26.53954972161187 / 64)
    assert case.group == ("Llama 13B", 64, 2048, "flash_attention2 + RMS kernel")


def test_hagemann_mapping_rules():
    frame = pd.read_csv(lr.HAGEMANN_CSV)
    cases = [lr.hagemann_case(r) for r in frame.to_dict("records")]
    dropped = [r for r, c in zip(frame.to_dict("records"), cases, strict=True) if c is None]
    assert len(dropped) == 20 and {r["avg_step_time_s"] for r in dropped} == {"Kernel not available", "Other Error"}
    kept = [c for c in cases if c is not None]
    assert sum(c.measured_oom for c in kept) == 563
    for row, case in zip(frame.to_dict("records"), cases, strict=True):
        if case is None:
            continue
        par = case.raw["parallelism"]
        seq = case.raw["training"]["seq_length"]
        assert par["global_batch_size"] * seq == 4 * 2**20
        assert par["tp"] == row["tensor_parallel(model_parallel_size)"] and par["pp"] == row["pipeline_parallel"]
        assert par["recompute"] == ("full" if row["activation_checkpointing_type"] == "every_layer" else "none")
        attention = case.raw["training"]["attention"]
        assert attention == ("standard" if row["kernel"] in ("torch", "fused") else "flash")
        assert par["sequence_parallel"] == (row["sequence_parallel"] == 1.0 and par["tp"] > 1)
    eight_k = [c for c in kept if c.raw["training"]["seq_length"] == 8192]
    assert eight_k and all(c.raw["parallelism"]["global_batch_size"] == 512 for c in eight_k)


def test_ultrascale_mapping_first_row():
    frame = pd.read_csv(lr.ULTRASCALE_CSV)
    case = lr.ultrascale_case(0, frame.loc[0].to_dict())
    assert case.raw["model"] == "llama-1b"
    assert case.raw["cluster"] == {"node": "p5-h100-efa", "fabric": "fat-tree", "num_gpus": 8}
    assert case.raw["parallelism"] == {"tp": 1, "pp": 2, "dp": 4, "virtual_stages": 1, "schedule": "1f1b",
                                       "sequence_parallel": False, "zero_stage": 1, "recompute": "none",
                                       "micro_batch_size": 4, "global_batch_size": 256,
                                       # the DP scaling figure's choice (validation/calibrate_efa.py)
                                       "overlap_grad_reduce": False,
                                       # nanotron's cost balance: the LM head (V·h) weighs as ~4 of
                                       # llama-1b's 16 blocks, so the last of 2 stages gets 6 blocks
                                       "last_stage_layers": 6}
    assert case.raw["training"]["attention"] == "flash"
    assert case.raw["training"]["seq_length"] == 4096
    assert case.measured == pytest.approx({"tokens_per_s_per_gpu": 38895.0, "mfu": 0.443, "memory_gb": 41.8})
    cases = lr.ultrascale_cases()
    assert len(cases) == 3287 and sum(c.measured_oom for c in cases) == 1529
    assert {c.raw["model"] for c in cases} == {"llama-1b", "llama-3b", "llama3-8b", "llama3-70b"}
    for c in cases:  # the printed layout multiplies out to the GPUs and the batch to grad-accum steps
        p = c.raw["parallelism"]
        assert p["tp"] * p["pp"] * p["dp"] == c.raw["cluster"]["num_gpus"]


def test_the_sweeps_models_keep_no_dropout_masks():
    # nanotron's Llama has no dropout; LLaMA trains without it (the Aleph Alpha codebase's setting is
    # not published: validation/layout_ranking.py says so). The memory profiles are fitted that way.
    from workloads.catalog import MODELS

    for name in (*lr.HAGEMANN_MODELS.values(), *lr.ULTRASCALE_MODELS.values()):
        assert MODELS.get(name).dropout is False, name


def test_nanotron_partition_by_compute_cost():
    # llama-1b: 16 blocks of cost c and the LM head of V·h = 3.91 c (nanotron get_block_compute_costs);
    # total 19.91 c. A rank moves on once the running cost passes total·(rank+1)/pp.
    from workloads.catalog import MODELS

    model = MODELS.get("llama-1b")
    assert model.vocab_size * model.hidden_size / lr._layer_cost(model) == pytest.approx(3.9140625)
    assert lr.nanotron_stage_layers(model, 2) == [10, 6]        # 10 c > 9.96 c: rank 1 gets 6 + head
    assert lr.nanotron_stage_layers(model, 4) == [5, 5, 5, 1]
    assert lr.nanotron_stage_layers(model, 8) == [3, 2, 3, 2, 3, 2, 1, 0]  # the last rank: head only
    assert lr.nanotron_stage_layers(model, 16) is None          # some rank gets no block at all
    # the simulator's nearest split: same busiest-rank cost first (pp 2: [10, 6] exactly)
    assert lr.first_last_stage_layers(model, 2, [10, 6]) == (None, 6)
    assert lr.first_last_stage_layers(model, 4, [5, 5, 5, 1]) == (None, 1)


def test_metric_functions():
    assert lr.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert lr.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert lr.spearman([1, 2, 3], [5, 5, 5]) != lr.spearman([1, 2, 3], [5, 5, 5])  # NaN
    # ties get average ranks: ranks x = 1, 2.5, 2.5, 4 ; y = 1, 2, 3, 4
    assert lr.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    m = lr.confusion([True, True, False, False, False], [True, False, False, True, False])
    assert m == {"oom_predicted_oom": 1, "oom_predicted_fits": 1, "ok_predicted_oom": 1, "ok_predicted_fits": 2}
    assert lr.accuracy(m) == pytest.approx(3 / 5)


def _spread(cases: list, per_group: int) -> list:
    """``per_group`` runs per group, evenly spaced over the measured ranking (deterministic)."""
    out = []
    groups: dict = {}
    for c in cases:
        groups.setdefault(c.group, []).append(c)
    for _, members in sorted(groups.items(), key=lambda kv: str(kv[0])):
        members.sort(key=lambda c: c.measured["tokens_per_s_per_gpu"])
        if len(members) < per_group:
            continue
        step = (len(members) - 1) / (per_group - 1)
        out += [members[round(i * step)] for i in range(per_group)]
    return out


def _largest_group_per_model_and_gpus(cases: list) -> list:
    """The issue's model x GPU-count groups, each represented by its best-populated kernel/seq group."""
    runs = [c for c in cases if not c.measured_oom]
    sizes: dict = {}
    for c in runs:
        sizes[c.group] = sizes.get(c.group, 0) + 1
    best: dict = {}
    for g, n in sizes.items():
        key = g[:2]
        if n > sizes.get(best.get(key), 0):
            best[key] = g
    keep = set(best.values())
    return [c for c in runs if c.group in keep]


# --------------------------------------------------------------------------- split and profiles


@pytest.mark.parametrize("source", ["hagemann", "ultrascale"])
def test_the_split_is_deterministic_by_layout_and_about_half(source):
    cases, _ = lr.calibrated(source)
    held = lr.heldout(cases)
    fit = lr.fit_half(cases)
    # runs of a layout some calibration figure shares (odd md5) are in neither half
    calibration_only = [c for c in cases if c.used_in_calibration and lr.is_heldout(c.split_key)]
    assert len(held) + len(fit) + len(calibration_only) == len(cases) and 0.4 < len(held) / len(cases) < 0.6
    assert len(calibration_only) <= 3
    assert {id(c) for c in held}.isdisjoint({id(c) for c in fit})
    by_key: dict = {}
    for c in cases:  # repeated measurements of one layout fall on the same side
        by_key.setdefault(c.split_key, set()).add(c.heldout)
    assert all(len(sides) == 1 for sides in by_key.values())


def test_profiles_are_the_fit_on_the_fit_half():
    # validation/profiles/*.yaml hold what validation/calibrate_frameworks.py fits (memory fits are
    # cheap to redo; the compute fit simulates ~100x30 runs and is only checked for provenance).
    cf = pytest.importorskip("validation.calibrate_frameworks")
    for source, fitted in (("hagemann", cf.fit_hagemann_memory()), ("ultrascale", cf.fit_playbook_memory())):
        _, profile = lr.calibrated(source)
        written = profile.memory_overhead
        assert written.states_factor == pytest.approx(fitted.states_factor, abs=2e-3)
        assert written.optimizer_factor == pytest.approx(fitted.optimizer_factor, abs=2e-3)
        assert written.activations_factor.keys() == fitted.activations_factor.keys()
        for k, v in fitted.activations_factor.items():
            assert written.activations_factor[k] == pytest.approx(v, abs=2e-3)
        assert written.later_microbatch_factor == pytest.approx(fitted.later_microbatch_factor, abs=2e-3)
        assert written.constant_gib == pytest.approx(fitted.constant_gib, abs=0.01)
        assert "fit half" in written.fitted_on
    _, profile = lr.calibrated("ultrascale")
    assert "single-node" in profile.compute_efficiency["fitted_on"]
    assert "fit half" in profile.compute_efficiency["fitted_on"]
    # nanotron's host floor: a value for every tp degree of the runs it is fitted on, and the rule
    # for other degrees is the run-weighted line through them, as fit_playbook_pipeline_floor writes.
    floor = profile.compute_efficiency["cross_node_pipeline_floor"]
    runs = cf.playbook_cross_node_pipeline_runs(lr.fit_half(lr.ultrascale_cases()))
    counts = {}
    for c in runs:
        counts[c.raw["parallelism"]["tp"]] = counts.get(c.raw["parallelism"]["tp"], 0) + 1
    assert sorted(floor["per_layer_us_by_tp"]) == sorted(counts)
    rewritten = cf._with_pipeline_floor({}, floor["per_layer_us_by_tp"], counts)["cross_node_pipeline_floor"]
    assert rewritten == floor
    _, profile = lr.calibrated("hagemann")
    assert "fit half" in profile.compute_efficiency["fitted_on"]
    assert "fit_hagemann_compute" in profile.node_overrides["intra_node"]["source"]
    assert "fit_hagemann_compute" in profile.node_overrides["source"] and "fit half" in profile.fabric["source"]


def test_a_profile_rescales_catalog_constants_and_says_so():
    _, profile = lr.calibrated("hagemann")
    case = lr.hagemann_case(_hagemann_row(132173), profile)  # any row: the node is the same for all
    node = case.raw["cluster"]["node"]
    catalog_node = lr._catalog_yaml("nodes", "dgx-a100-80g")
    catalog_eff = lr._catalog_yaml("accelerators", "a100-sxm-80g")["efficiency"]
    assert node["name"] == "dgx-a100-80g" and node["nics_per_node"] == catalog_node["nics_per_node"]
    fitted = node["intra_node"]["collective_efficiency"]
    assert 0 < fitted < catalog_node["intra_node"]["collective_efficiency"]
    assert node["intra_node"]["bandwidth_per_gpu_gb_per_s"] == catalog_node["intra_node"]["bandwidth_per_gpu_gb_per_s"]
    scale = node["accelerator"]["efficiency"]["gemm_curve"][-1]["efficiency"] / catalog_eff["gemm_curve"][-1]["efficiency"]
    for mine, theirs in zip(node["accelerator"]["efficiency"]["gemm_curve"], catalog_eff["gemm_curve"], strict=True):
        assert mine["efficiency"] == pytest.approx(theirs["efficiency"] * scale, abs=1e-3)
    from hardware_specs.schema import Node

    Node.model_validate({**node, "accelerator": node["accelerator"]["name"]})  # a valid spec
    assert 0 < node["nic_efficiency"] <= catalog_node["nic_efficiency"]
    from hardware_specs.schema import FatTree

    fabric = FatTree.model_validate(case.raw["cluster"]["fabric"])
    assert fabric.oversubscription >= 1 and fabric.pod_size_nodes == 8
    assert lr.hagemann_case(_hagemann_row(132173)).raw["cluster"]["fabric"] == "fat-tree"
    assert lr.hagemann_case(_hagemann_row(132173)).raw["cluster"]["node"] == "dgx-a100-80g"  # no profile: catalog
    merged = lr._merged({"a": {"b": 1, "c": 2}, "d": 3}, {"a": {"b": 5}, "e": 6})
    assert merged == {"a": {"b": 5, "c": 2}, "d": 3, "e": 6}


# --------------------------------------------------------------------------- the targets


@pytest.mark.parametrize("source", ["hagemann", "ultrascale"])
def test_oom_classification_of_the_heldout_half_at_least_90_percent(source):
    # Held-out half only (the profile's memory overhead was fitted on the other half).
    # Measured 2026-12-05 (profiles refitted without dropout masks: LLaMA has none): Hagemann 95.0% (276
    # oom->oom, 11 oom->fits, 14 ok->oom, 199 ok->fits; 95.4% with the masks); Ultra-Scale 93.6% (663, 99, 6,
    # 874; 93.7% with them; 84 layouts nanotron cannot partition count as OOM).
    cases, profile = lr.calibrated(source)
    report = lr.oom_report(lr.heldout(cases), profile.memory_overhead)
    print(f"{source}: {100 * report['accuracy']:.1f}% right, confusion {report['confusion']}")
    assert report["accuracy"] >= lr.TARGET_OOM_ACCURACY, report["confusion"]


def test_nanotrons_peak_memory_is_predicted_within_10_percent_on_the_heldout_half():
    # The profile maps the analytic breakdown to nanotron's reported peak (fit half's gpu_memory_GB);
    # held-out, 2026-12-05 (no dropout masks: nanotron's Llama has none): median 8.7%, 90th
    # percentile 30.0% over 879 finished runs (8.8% / 29.4% with the masks counted).
    cases, profile = lr.calibrated("ultrascale")
    held = [c for c in lr.heldout(cases) if not c.measured_oom]
    report = lr.memory_error(lr.oom_report(held, profile.memory_overhead), held)
    assert report["n"] > 800 and report["median"] <= 0.10, report


def test_fitting_the_later_microbatch_factor_pays_off_on_the_heldout_half():
    # fit_hagemann_memory frees beta (what each micro-batch waiting for its backward costs against
    # the one in process); with beta held at 1 the same fit classifies the held-out half worse and
    # predicts more of its measured runs OOM. 2026-12-05: 95.0% and 14 against 93.2% and 18 (with dropout
    # masks, 2026-12-03: 95.4% and 12 against 92.8% and 20).
    cf = pytest.importorskip("validation.calibrate_frameworks")
    cases = lr.hagemann_cases()
    free, fixed = cf.fit_hagemann_memory(cases), cf.fit_hagemann_memory(cases, fit_later_microbatch_factor=False)
    assert fixed.later_microbatch_factor == 1.0 and 0 < free.later_microbatch_factor < 1
    with_beta, without = (lr.oom_report(lr.heldout(cases), o) for o in (free, fixed))
    assert with_beta["accuracy"] > without["accuracy"]
    assert with_beta["confusion"]["ok_predicted_oom"] < without["confusion"]["ok_predicted_oom"]


def test_the_plain_memory_model_alone_misses_the_oom_target():
    # Without the fitted framework overhead the analytic breakdown under-predicts nanotron's
    # measured peaks (~0.65x): the target is met by the fitted profile, not by the plain model.
    cases, _ = lr.calibrated("ultrascale")
    report = lr.oom_report(lr.heldout(cases))
    assert report["accuracy"] < lr.TARGET_OOM_ACCURACY


@pytest.mark.xfail(strict=True, reason="issue 4 open: held-out mean Spearman 0.72 here (48 runs), 0.73 over all 213 "
                   "held-out runs, target 0.8 (2026-12-05, profile refitted without dropout masks; 0.76 / 0.70 "
                   "with them): there 14 measured runs, often their group's fastest, are "
                   "predicted OOM and rank last; ranked by their simulated rates instead the same runs reach 0.90 "
                   "(0.88 over all 213): the memory classifier, fitted on OOM labels alone, is what falls short")
def test_hagemann_layout_ranking_spearman():
    cases, profile = lr.calibrated("hagemann")
    chosen = _spread(_largest_group_per_model_and_gpus(lr.heldout(cases)), per_group=6)
    assert len({c.group[:2] for c in chosen}) == 8  # every model x GPU-count group is represented
    report = lr.ranking_report(chosen, workers=2, overhead=profile.memory_overhead)
    print({g: round(r, 3) for g, r in report["groups"].items()})
    assert not math.isnan(report["mean_spearman"])
    assert report["mean_spearman"] >= lr.TARGET_SPEARMAN, report["groups"]


def test_hagemann_heldout_throughput_within_15_percent_and_better_ranked_than_with_catalog_constants():
    # The profile's compute and network constants (GEMM curve x s, per-kernel overhead L, NVLink
    # collective efficiency x c, NIC efficiency x n, fabric oversubscription o) are fitted on the
    # fit half's tokens/s (validation/calibrate_frameworks.py fit_hagemann_compute); this is the
    # held-out check. Measured 2026-12-03 on these 48 runs: median |error| 5.4% (catalog
    # constants and fabric: 27.4%), mean Spearman 0.76 (catalog: 0.52); over all 213 held-out runs
    # 6.7% (30.4%) and 0.70 (0.48). The throughput model's own ranking (every run ranked by its
    # simulated rate, the memory verdict set aside) meets the 0.8: 0.90 here, 0.88 over 213.
    cases, profile = lr.calibrated("hagemann")
    chosen = _spread(_largest_group_per_model_and_gpus(lr.heldout(cases)), per_group=6)
    fitted = lr.ranking_report(chosen, workers=2, overhead=profile.memory_overhead)
    catalog_cases = {c.case_id: c for c in lr.hagemann_cases()}
    catalog = lr.ranking_report([catalog_cases[c.case_id] for c in chosen], workers=2, overhead=profile.memory_overhead)
    print(f"fitted: {100 * fitted['median_abs_error']:.1f}%, {fitted['mean_spearman']:.3f} "
          f"({fitted['mean_spearman_if_run']:.3f} by simulated rate alone); "
          f"catalog: {100 * catalog['median_abs_error']:.1f}%, {catalog['mean_spearman']:.3f}")
    assert fitted["median_abs_error"] <= lr.TARGET_MEDIAN_ABS_ERROR
    assert fitted["mean_spearman"] > catalog["mean_spearman"]
    assert fitted["mean_spearman_if_run"] >= lr.TARGET_SPEARMAN


def test_ultrascale_tokens_per_gpu_median_error():
    # Every held-out finished run. Measured 2026-12-03: median |error| 13.2% over the 874 of 880
    # predicted to fit (467 within 15%; fit half 13.1%); per node count 7.6 / 7.3 / 8.0 / 9.6 /
    # 12.1 / 17.8% on 1-32 nodes and 254% on 64, where most runs are 2-10x below any prediction
    # and the sweep disagrees with itself (test below). With nanotron's host floor as one line
    # a + b·tp instead of a value per tp degree: 15.4%; without any floor: 83%.
    cases, profile = lr.calibrated("ultrascale")
    runs = [c for c in lr.heldout(cases) if not c.measured_oom]
    report = lr.ranking_report(runs, workers=2, overhead=profile.memory_overhead)
    print(f"median |error| {100 * report['median_abs_error']:.1f}% over {len(report['errors'])} rows")
    assert report["median_abs_error"] <= lr.TARGET_MEDIAN_ABS_ERROR


def test_the_sweep_agrees_with_itself_only_on_one_and_two_nodes():
    # Repeated measurements and ZeRO-0/ZeRO-1 pairs of one layout: within 1% at 1-2 nodes, while
    # from 4 nodes on >= 20% of the pairs are more than 2x apart. This bounds what any model can
    # show against the multi-node rows (validation/layout_ranking.py ultrascale_measurement_consistency).
    spread = lr.ultrascale_measurement_consistency().set_index("nodes")
    assert list(spread.index) == [1, 2, 4, 8, 16, 32, 64]
    assert (spread.loc[[1, 2], "median_rel_diff"] < 0.02).all()
    assert (spread.loc[[4, 8, 16, 32, 64], "share_over_2x"] >= 0.2).all()


def test_ultrascale_heldout_one_and_two_node_runs_meet_the_targets():
    # Where the sweep is self-consistent (1-2 nodes), every held-out finished run: measured
    # 2026-12-03 median |error| 7.4% over 118 of 120 runs, mean Spearman 0.91 (before nanotron's
    # host floor for pipelines across nodes: 9.0%, Spearman 0.89). No held-out run is used by a
    # fit (the compute profile is fitted on the fit half's 1-node runs, nanotron's latency per
    # inter-node call on its pp 1 runs, its host floor on its pp > 1 runs on 2-16 nodes, the EFA laws
    # on the Playbook's microbenchmark and DP figure).
    cases, profile = lr.calibrated("ultrascale")
    runs = [c for c in lr.heldout(cases) if not c.measured_oom and c.group[1] in (1, 2)]
    assert len(runs) == 120
    report = lr.ranking_report(runs, workers=2, overhead=profile.memory_overhead)
    print(f"median |error| {100 * report['median_abs_error']:.1f}%, mean Spearman {report['mean_spearman']:.3f}")
    assert report["median_abs_error"] <= lr.TARGET_MEDIAN_ABS_ERROR
    assert report["mean_spearman"] >= lr.TARGET_SPEARMAN
    assert report["unpredicted"] <= 2


def test_ultrascale_heldout_pipelines_across_nodes_meet_the_target_with_the_host_floor():
    # Held-out finished runs with pp > 1 on 2-16 nodes, the domain of nanotron's host-side floor
    # per layer (simulator/cost/host_floor.py), fitted on the fit half's runs of that domain
    # (validation/calibrate_frameworks.py fit_playbook_pipeline_floor). Measured 2026-12-03:
    # median |error| 8.3% over the 378 of 383 runs predicted to fit (tp > 2: 7.8% over 243); with
    # the floor's rule for unlisted tp degrees (the line 3.6·tp ms through the fitted values)
    # instead of the value fitted per degree 15.5%; without any floor 81% (tp > 2: 159%): 2-15x
    # too fast.
    cases, profile = lr.calibrated("ultrascale")
    runs = [c for c in lr.heldout(cases) if not c.measured_oom and 2 <= c.group[1] <= 16
            and c.raw["parallelism"]["pp"] > 1]
    assert len(runs) == 383
    floor = profile.compute_efficiency["cross_node_pipeline_floor"]
    assert "fit half" in floor["fitted_on"] and "pp > 1" in floor["fitted_on"]
    assert "fit_playbook_pipeline_floor" in floor["source"]
    report = lr.ranking_report(runs, workers=2, overhead=profile.memory_overhead)
    without = {k: v for k, v in profile.compute_efficiency.items() if k != "cross_node_pipeline_floor"}
    bare = copy.deepcopy(runs)
    for c in bare:
        c.raw["cluster"]["node"] = lr.profiled_node(lr.ULTRASCALE_NODE, without, profile.node_overrides)
    report_without = lr.ranking_report(bare, workers=2, overhead=profile.memory_overhead)
    rule_only = copy.deepcopy(profile.compute_efficiency)
    rule_only["cross_node_pipeline_floor"]["per_layer_us_by_tp"] = {}
    for c in bare:
        c.raw["cluster"]["node"] = lr.profiled_node(lr.ULTRASCALE_NODE, rule_only, profile.node_overrides)
    report_rule = lr.ranking_report(bare, workers=2, overhead=profile.memory_overhead)
    print(f"median |error| {100 * report['median_abs_error']:.1f}% over {len(report['errors'])} runs; "
          f"the rule alone {100 * report_rule['median_abs_error']:.1f}%; "
          f"without the floor {100 * report_without['median_abs_error']:.1f}%")
    assert report["median_abs_error"] <= lr.TARGET_MEDIAN_ABS_ERROR
    assert report["median_abs_error"] < report_rule["median_abs_error"]  # the per-degree values pay off
    assert report_without["median_abs_error"] > 0.5
    assert report["unpredicted"] <= 5
