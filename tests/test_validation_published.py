"""Validation against published measurements: each case fails past its set's tolerance.

Narayanan et al. 2021 Table 1 (TFLOP/s per GPU including recompute, all ten rows) and
Korthikanti et al. 2022 Tables 3/5 (iteration times with selective recompute + SP and with
full recompute). The A100 efficiencies were fitted on Korthikanti Table 4 only
(validation/calibrate_a100.py), never on these rows.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

from validation.published_cases import CASE_SETS, run_case

ALL_CASES = [(name, case) for name in CASE_SETS for case in CASE_SETS[name].cases()]


def _run(item):
    name, case = item
    return run_case(case, CASE_SETS[name].tolerance_per_case)


@pytest.fixture(scope="module")
def results():
    with ProcessPoolExecutor(max_workers=2) as pool:
        return dict(zip([(n, c.name) for n, c in ALL_CASES], pool.map(_run, ALL_CASES), strict=True))


@pytest.mark.parametrize("case_set,case_name", [(n, c.name) for n, c in ALL_CASES])
def test_case_within_tolerance(results, case_set, case_name):
    r = results[(case_set, case_name)]
    assert abs(r.relative_error) <= CASE_SETS[case_set].tolerance_per_case, (
        f"{case_name}: published {r.published}, simulated {r.simulated:.2f} ({100 * r.relative_error:+.1f}%)")


@pytest.mark.parametrize("case_set", list(CASE_SETS))
def test_case_set_mean_error(results, case_set):
    errors = [abs(r.relative_error) for (n, _), r in results.items() if n == case_set]
    assert len(errors) == len(CASE_SETS[case_set].cases())
    assert sum(errors) / len(errors) <= CASE_SETS[case_set].tolerance_mean_abs


def test_every_published_row_is_a_case():
    assert len(CASE_SETS["narayanan2021_table1"].cases()) == 10
    assert len(CASE_SETS["korthikanti2022_table3_5"].cases()) == 8


def test_calibration_rows_are_not_validation_rows():
    from validation.published_cases import FITTED_ON

    assert "korthikanti2022_table4_layer_times.csv" in FITTED_ON
    for case_set in CASE_SETS.values():
        assert "table4" not in case_set.name


@pytest.mark.parametrize("case_set", list(CASE_SETS))
def test_cached_errors_are_current(results, case_set):
    # the table per accelerator (docs/validation.md) reads validation/modern/heldout_errors.csv (tests/test_accelerator_table.py)
    from validation.modern.by_accelerator import SET_LINE, STALE_HINT, stale_rows

    names = [c.name for c in CASE_SETS[case_set].cases()]
    current = [(row, results[(case_set, name)].relative_error, None) for row, name in enumerate(names)]
    assert not stale_rows(case_set, SET_LINE, current), (STALE_HINT, stale_rows(case_set, SET_LINE, current)[:5])
