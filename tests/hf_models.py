"""``transformers`` for the tests that build its models on the meta device (the parameter-count
oracles). transformers imports torchvision where it is installed, and the torchvision the test command
installs (PyPI's CUDA build beside a CPU torch) imports only as the model importer imports it
(``workloads/networks/torch_import.py``), so that comes first."""

from __future__ import annotations

import importlib

import pytest


def transformers_or_none():
    """The ``transformers`` module with torch, or None where either is not installed."""
    try:
        importlib.import_module("torch")
    except ImportError:
        return None
    from workloads.networks.torch_import import import_torchvision
    try:
        import_torchvision()
    except ImportError:
        pass  # no torchvision: transformers does not import it
    try:
        return importlib.import_module("transformers")
    except ImportError:
        return None


def transformers_or_skip():
    """The ``transformers`` module; the test skips where torch or transformers is not installed."""
    module = transformers_or_none()
    if module is None:
        pytest.skip("needs torch and transformers")
    return module
