"""Test configuration: property tests are derandomized on CI so a run is reproducible
(locally they explore new examples each run; set HYPOTHESIS_PROFILE=dev to do so on CI too)."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# The on-disk cache of finished points (simulator/explore/cache.py) goes to a fresh folder per
# test session, so that no test reads a result another run (or another code version) wrote.
if "CLUSTERSIM_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CLUSTERSIM_CACHE_DIR"] = tempfile.mkdtemp(prefix="clustersim-test-cache-")
