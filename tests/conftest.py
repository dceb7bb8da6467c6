"""Test configuration: property tests are derandomized on CI so a run is reproducible
(locally they explore new examples each run; set HYPOTHESIS_PROFILE=dev to do so on CI too)."""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
