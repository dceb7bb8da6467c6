"""The A100 catalog entry holds exactly the fit of validation/calibrate_a100.py."""

from hardware_specs.catalog import ACCELERATORS
from validation.calibrate_a100 import fit


def test_a100_efficiency_is_the_recorded_fit():
    result = fit()
    spec = ACCELERATORS.get("a100-sxm-80g").efficiency
    assert [(p.gflop, p.efficiency) for p in spec.gemm_curve] == result.curve()
    assert spec.memory_bound_efficiency == result.memory_bound_efficiency
    assert "korthikanti2022_table4" in spec.fitted_on
    # the fit reproduces the four per-layer times it was fitted on within 2%
    assert max(abs(e) for e in result.residuals.values()) < 0.02
