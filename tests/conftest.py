"""Test configuration: property tests are derandomized on CI so a run is reproducible
(locally they explore new examples each run; set HYPOTHESIS_PROFILE=dev to do so on CI too)."""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The on-disk cache of finished points (simulator/explore/cache.py) goes to a fresh folder per
# test session, so that no test reads a result another run (or another code version) wrote.
if "CLUSTERSIM_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CLUSTERSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="clustersim-test-cache-")


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
