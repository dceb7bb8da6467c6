"""Test configuration: property tests are derandomized on CI so a run is reproducible
(locally they explore new examples each run; set HYPOTHESIS_PROFILE=dev to do so on CI too).

No property test is timed: Hypothesis's per-example deadline (200 ms by default) and its
``too_slow`` health check are timing assertions that a loaded machine fails (the suite must pass
on a busy 2-core host, its test processes sharing the cores), so both profiles turn them off.
Performance is measured in benchmarks/, not asserted here."""

import os

import pytest
from hypothesis import HealthCheck, settings

_UNTIMED = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("ci", derandomize=True, print_blob=True, **_UNTIMED)
settings.register_profile("dev", print_blob=True, **_UNTIMED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The on-disk cache of finished points (simulator/explore/cache.py) goes to a fresh folder per
# test process, so that no test reads a result another run (or another code version) wrote. Under
# pytest-xdist every worker inherits the controller's environment, so a folder this file made (the
# marker variable says so) is replaced by the worker's own: a test's cache hits and misses depend
# only on the tests of its own process. A folder the user set is kept, for every worker.
if "CLUSTERSIM_CACHE_DIR" not in os.environ or os.environ.get("CLUSTERSIM_TEST_FRESH_CACHE") == "1":
    import tempfile

    _worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["CLUSTERSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"clustersim-test-cache-{_worker}-")
    os.environ["CLUSTERSIM_TEST_FRESH_CACHE"] = "1"


@pytest.fixture
def torchvision():
    """torchvision, imported as the model importer imports it (also where its C++ extension cannot
    load: workloads/networks/torch_import.py); the test skips where torch or torchvision is missing."""
    pytest.importorskip("torch")
    from workloads.networks.torch_import import import_torchvision
    try:
        return import_torchvision()
    except ImportError:
        pytest.skip("torchvision is not installed")


# Under pytest-xdist (the README's test command: `-n 2 --dist loadfile --no-loadscope-reorder`) each
# file runs whole on one worker (its module-scoped fixtures computed once), and files are handed out
# in collection order as workers free up. The files below take longest (2026-12-06, CPU seconds per
# file, the test process's and its subprocesses', of a 2-worker run): they are collected first,
# longest first, so that the two workers finish together rather than one running a long file alone
# at the end. The real-run harness goes first: its two ranks take both cores (at a raised priority)
# for about a minute, whatever else runs; test_harness.py's own jobs wait for each of its jobs
# (validation/harness/launcher.py: one timed job at a time). A file missing from the list only runs later; a name that
# no longer exists is ignored.
LONGEST_FILES_FIRST = (
    "test_harness_e2e.py", "test_layout_ranking.py", "test_plan_cli.py", "test_search_bounds.py", "test_harness.py",
    "test_torch_import.py", "test_command_warnings.py", "test_planners_on_examples.py", "test_pase_planner.py",
    "test_modern_validation.py", "test_derived_parts.py", "test_conv_calibration.py", "test_validation_exit_codes.py",
    "test_catalog_only_validation.py", "test_deeppool_model.py", "test_networks.py", "test_kind_layout_fields.py",
    "test_search_split.py", "test_newcomer_walk.py", "test_newcomer_output.py", "test_ds3lab.py",
    "test_search_ranking.py", "test_search_checks.py", "test_examples.py", "test_cli.py", "test_search_space.py",
)


def pytest_collection_modifyitems(config, items):
    """Longest files first, under pytest-xdist only (a plain run keeps the files' order); the sort
    is stable, so tests keep their order inside a file and every worker collects the same list."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    first = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))
