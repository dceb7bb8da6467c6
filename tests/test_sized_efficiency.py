"""Efficiencies fitted per microbenchmark size (hardware_specs.schema.SizedEfficiency): the attention factor by
one attention GEMM's multiply-adds and the loss kernel by its forward op's bytes, written by ``clustersim
calibrate`` from the rows it fits and read by simulator/cost/compute.py at the op's own size."""

from __future__ import annotations

import copy
import csv

import pytest
from pydantic import ValidationError

from hardware_specs.schema import SizedEfficiency
from simulator.cost.calibration import (
    _dispatch_run,
    _interp_curve,
    _simulated_fwd_bwd_s,
    build_profile,
    load_profile_specs,
    read_microbench,
    write_profile,
)
from simulator.cost.compute import ComputeModel
from tests.test_calibration import LAUNCH, synthetic_microbench
from tests.test_eager_dispatch import HARNESS
from workloads.graph import Op


def test_a_table_reads_log_linear_in_size_and_clamps_at_its_ends():
    table = SizedEfficiency(points=[{"size": 1e6, "efficiency": 0.5}, {"size": 1e8, "efficiency": 0.9}],
                            fitted_on="rows")
    assert table.at(1e7) == pytest.approx(0.7)  # half way in log size
    assert table.at(1e6) == 0.5 and table.at(1e3) == 0.5
    assert table.at(1e8) == 0.9 and table.at(1e12) == 0.9
    with pytest.raises(ValidationError, match="strictly increasing size"):
        SizedEfficiency(points=[{"size": 1e8, "efficiency": 0.9}, {"size": 1e6, "efficiency": 0.5}], fitted_on="x")
    with pytest.raises(ValidationError):
        SizedEfficiency(points=[{"size": 1e6, "efficiency": 1.5}], fitted_on="x")


#: F.cross_entropy forward + backward per micro-batch size: a size-dependent rate (bytes/s on the 36 bytes per logit)
LOSS_RATES = {1: 12e9, 2: 10e9, 4: 6e9, 8: 9e9}


def _with_sized_loss(folder):
    """loss.csv rows without a gauge (the rows' own times count) at LOSS_RATES: each size its own rate."""
    rows = []
    for b, rate in LOSS_RATES.items():
        e = b * 128 * 4096
        for rank in (0, 1):
            rows.append({"kernel": "cross_entropy_fwd_bwd", "precision": "fp32", "micro_batch_size": b,
                         "elements": e, "bytes": "", "median_s": 2 * LAUNCH + 36 * e / rate,
                         "over_gauge_median": "", "rank": rank})
    with (folder / "microbench" / "loss.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return folder


def test_the_loss_is_fitted_per_size_and_priced_at_the_runs_own_size(tmp_path):
    """Each loss.csv size gets its own efficiency (by the forward op's 12 bytes per logit); the simulated step at
    micro-batch 4 moves, against the pooled number, by exactly the loss's 36 bytes per logit at mb 4's own rate
    (the backward op, twice the bytes, is looked up at its forward's)."""
    profile = build_profile(read_microbench(_with_sized_loss(synthetic_microbench(tmp_path / "a"))))
    acc = profile["node"]["accelerator"]
    hbm = acc["hbm_bandwidth_gb_per_s"] * 1e9
    kernels = acc["efficiency"]["memory_kernels"]
    table = kernels["by_kernel_forward_bytes"]["cross_entropy"]
    assert [p["size"] for p in table["points"]] == [12.0 * b * 128 * 4096 for b in LOSS_RATES]
    for p, rate in zip(table["points"], LOSS_RATES.values(), strict=True):
        assert p["efficiency"] == pytest.approx(rate / hbm, rel=1e-3)
    assert "loss.csv" in table["fitted_on"] and "cross_entropy_fwd_bwd" in table["fitted_on"]
    pooled = kernels["by_kernel"]["cross_entropy"]  # the median over sizes stays for readers without the table
    assert pooled == pytest.approx(1 / ((1 / 10e9 + 1 / 9e9) / 2) / hbm, rel=1e-3)  # median of 8 s/byte

    scalar = copy.deepcopy(profile)
    del scalar["node"]["accelerator"]["efficiency"]["memory_kernels"]["by_kernel_forward_bytes"]
    run = _dispatch_run(HARNESS, 4)
    launch_us = acc["efficiency"]["kernel_launch_overhead_us"]
    e = 4 * 128 * 4096
    assert _simulated_fwd_bwd_s(profile, run, launch_us) - _simulated_fwd_bwd_s(scalar, run, launch_us) == \
        pytest.approx(36 * e / LOSS_RATES[4] - 36 * e / (pooled * hbm), rel=5e-3)
    # written and read back through the schema
    node, _ = load_profile_specs(write_profile(profile, tmp_path / "p.yaml"))
    assert node.accelerator.efficiency.memory_kernels.by_kernel_forward_bytes["cross_entropy"].at(12.0 * e) == \
        pytest.approx(LOSS_RATES[4] / hbm, rel=1e-3)


#: the factor each sdpa_fwd_bwd shape (b·h, s, d) runs at over the GEMM curve
ATTENTION_FACTORS = {(16, 128, 64): 0.6, (64, 128, 64): 0.9, (64, 256, 64): 1.0}


def _with_sdpa(folder, factors=ATTENTION_FACTORS):
    """sdpa_fwd_bwd rows in gemm.csv timed so that each shape's fitted factor is ATTENTION_FACTORS' (the inverse of
    calibration.fit_compute's attention model: 3x the two GEMMs at factor x curve, softmax's 9 passes, launches)."""
    base = build_profile(read_microbench(folder))
    acc = base["node"]["accelerator"]
    eff = acc["efficiency"]
    peak = acc["peak_tflops"]["fp32"] * 1e12
    eff_bw = acc["hbm_bandwidth_gb_per_s"] * 1e9 * eff["memory_bound_efficiency"]
    launch_s = LAUNCH  # the bare add: the fits' launch term
    path = folder / "microbench" / "gemm.csv"
    with path.open() as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames, list(reader)
    for (bh, s, d), factor in factors.items():
        gemm_s = 12.0 * bh * s * s * d / (peak * _interp_curve(eff["gemm_curve"], 2.0 * s * s * d / 1e9) * factor)
        t = gemm_s + 9 * bh * s * s * 4 / eff_bw + 2 * launch_s + 6 * launch_s
        for rank in (0, 1):
            rows.append({**rows[0], "kind": "sdpa_fwd_bwd", "layout": "", "batch": bh, "m": s, "n": s, "k": d,
                         "median_s": t, "rank": rank})
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return folder


def test_the_attention_factor_is_fitted_per_size_and_read_at_the_ops_own_size(tmp_path):
    """Each sdpa_fwd_bwd shape's factor goes into the table under b·h·s·s·d; an attention GEMM of a fitted shape
    takes exactly that shape's factor (forward and backward), one between two shapes the log-linear mix, and a
    profile without the table its pooled factor (the median)."""
    profile = build_profile(read_microbench(_with_sdpa(synthetic_microbench(tmp_path / "a"))))
    eff = profile["node"]["accelerator"]["efficiency"]
    table = eff["attention_efficiency_by_gemm_macs"]
    assert [p["size"] for p in table["points"]] == [float(bh * s * s * d) for bh, s, d in ATTENTION_FACTORS]
    for p, factor in zip(table["points"], ATTENTION_FACTORS.values(), strict=True):
        assert p["efficiency"] == pytest.approx(factor, rel=2e-3)
    assert "sdpa_fwd_bwd" in table["fitted_on"] and "gemm.csv" in table["fitted_on"]
    assert eff["attention_efficiency_factor"] == pytest.approx(0.9, rel=2e-3)  # the pooled median stays

    sized = load_profile_specs(write_profile(profile, tmp_path / "sized.yaml"))[0].accelerator
    scalar_profile = copy.deepcopy(profile)
    del scalar_profile["node"]["accelerator"]["efficiency"]["attention_efficiency_by_gemm_macs"]
    for factor in (0.6, 0.75):
        scalar_profile["node"]["accelerator"]["efficiency"]["attention_efficiency_factor"] = factor
        scalar = load_profile_specs(write_profile(scalar_profile, tmp_path / f"s{factor}.yaml"))[0].accelerator
        if factor == 0.6:  # the harness's shape: 4 sequences x 4 heads of 128 x 64
            ops = [Op("attn_scores", "attention", 2.0 * 16 * 128 * 128 * 64, 1e6, 128, 128, 64, 16),
                   Op("attn_values.grad", "attention", 4.0 * 16 * 128 * 128 * 64, 2e6, 128, 64, 128, 16)]
        else:  # half way in log size between 16 and 64 sequences x heads: 32 x 128 x 128 x 64
            ops = [Op("attn_scores", "attention", 2.0 * 32 * 128 * 128 * 64, 1e6, 128, 128, 64, 32)]
        for op in ops:
            assert ComputeModel(sized, "fp32").time_s(op) == pytest.approx(ComputeModel(scalar, "fp32").time_s(op))
        assert scalar.efficiency.attention_efficiency_by_gemm_macs is None


def test_one_size_writes_no_table(tmp_path):
    """With a single attention shape the pooled factor is that shape's: no table is written."""
    profile = build_profile(read_microbench(_with_sdpa(synthetic_microbench(tmp_path / "a"),
                                                       {(16, 128, 64): 0.6})))
    eff = profile["node"]["accelerator"]["efficiency"]
    assert "attention_efficiency_by_gemm_macs" not in eff
    assert eff["attention_efficiency_factor"] == pytest.approx(0.6, rel=2e-3)


def test_a_framework_attention_scale_scales_the_per_size_table_too():
    """``scaled_efficiency_block`` (training.framework's factors): where a calibrated profile carries
    ``attention_efficiency_by_gemm_macs``, the table is what compute.py reads, so the framework's
    attention scale applies to each of its points (capped at 1), as it does to the pooled factor."""
    from simulator.cost.framework import scaled_efficiency_block

    block = {"gemm_curve": [{"gflop": 1.0, "efficiency": 0.5}], "attention_efficiency_factor": 0.9,
             "attention_efficiency_by_gemm_macs": {"points": [{"size": 1e6, "efficiency": 0.6},
                                                              {"size": 1e9, "efficiency": 0.95}],
                                                   "fitted_on": "attention rows"}}
    scaled = scaled_efficiency_block(block, 1.0, None, attention_scale=1.1)
    assert scaled["attention_efficiency_factor"] == 0.99
    assert [p["efficiency"] for p in scaled["attention_efficiency_by_gemm_macs"]["points"]] == [0.66, 1.0]
    assert scaled["attention_efficiency_by_gemm_macs"]["fitted_on"].endswith("x 1.1000 (framework profile)")
    assert block["attention_efficiency_by_gemm_macs"]["points"][0]["efficiency"] == 0.6  # the input untouched


def test_simulate_names_the_per_size_attention_table_as_its_source(tmp_path):
    """A run on a profile with ``attention_efficiency_by_gemm_macs`` prices eager attention from that table
    (compute.py), so its provenance names the table's rows, not the pooled factor as ASSUMED; without the
    table the pooled factor stays ASSUMED."""
    from simulator.cost.provenance import ASSUMED, efficiency_provenance
    from simulator.scenario import load_scenario

    profile = build_profile(read_microbench(_with_sdpa(synthetic_microbench(tmp_path / "a"))))
    scalar_profile = copy.deepcopy(profile)
    del scalar_profile["node"]["accelerator"]["efficiency"]["attention_efficiency_by_gemm_macs"]
    provenance = {}
    for name, prof in (("sized", profile), ("scalar", scalar_profile)):
        path = write_profile(prof, tmp_path / f"{name}.yaml")
        sc = load_scenario({"model": {"name": "t", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                      "vocab_size": 256, "seq_length": 32},
                            "cluster": {"profile": str(path), "num_gpus": 1},
                            "parallelism": {"dp": 1, "micro_batch_size": 2, "global_batch_size": 2},
                            "training": {"precision": "fp32", "attention": "standard"}})
        provenance[name] = efficiency_provenance(sc)
    assert "sdpa_fwd_bwd" in provenance["sized"]["attention_efficiency_by_gemm_macs"]
    assert "attention_efficiency_factor" not in provenance["sized"]
    assert provenance["scalar"]["attention_efficiency_factor"] == ASSUMED
    assert "attention_efficiency_by_gemm_macs" not in provenance["scalar"]
