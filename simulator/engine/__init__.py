"""The discrete-event engine: tasks on streams, rendezvous, the flow network. It knows nothing of GPUs or strategies.

An optional compiled build of the same source: setup.py compiles ``engine.py`` and ``network.py`` (typed by the
``.pxd`` files beside them) with Cython into ``_compiled_engine`` / ``_compiled_network``, each carrying the
SHA-256 of the source it was built from. Importing this package puts a compiled module in the place of
``simulator.engine.<name>`` only where that fingerprint equals the ``.py`` and ``.pxd`` here now, so a binary built
from an older source is never used after an edit (the pure-Python module runs until it is rebuilt, e.g. by
``pip install -e .``). ``CLUSTERSIM_ENGINE=python`` forces the pure-Python modules. Both builds give the same
results bit for bit (tests/test_engine_compiled.py). :data:`ENGINE_BUILD` says which one runs (``clustersim
--version`` prints it); :data:`ENGINE_BUILD_NOTES` why a compiled module was not used.
"""

from __future__ import annotations

import importlib
import os
import sys

from simulator.engine._source_hash import source_sha256

_COMPILED = ("network", "engine")  # network first: the compiled engine imports simulator.engine.network
ENGINE_BUILD = "pure Python"
ENGINE_BUILD_NOTES: list[str] = []


def _select() -> str:
    """Put each compiled module whose fingerprint matches its source in ``sys.modules`` under the source's name;
    return what runs: "compiled (Cython)" (both), "partly compiled (...)" or "pure Python"."""
    if os.environ.get("CLUSTERSIM_ENGINE", "").strip().lower() in ("python", "pure", "py"):
        ENGINE_BUILD_NOTES.append("CLUSTERSIM_ENGINE=python")
        return "pure Python"
    here = os.path.dirname(os.path.abspath(__file__))
    used = []
    for name in _COMPILED:
        try:
            compiled = importlib.import_module(f"{__name__}._compiled_{name}")
        except ImportError as exc:  # not built (no compiler, or not installed), or built for another interpreter
            ENGINE_BUILD_NOTES.append(f"{name}: no compiled module ({exc})")
            continue
        try:
            expected = source_sha256(here, name)
        except OSError as exc:
            ENGINE_BUILD_NOTES.append(f"{name}: source unreadable ({exc})")
            continue
        if getattr(compiled, "_SOURCE_SHA256", None) != expected:
            ENGINE_BUILD_NOTES.append(f"{name}: compiled module built from another {name}.py/.pxd (rebuild: pip install -e .)")
            continue
        sys.modules[f"{__name__}.{name}"] = compiled
        globals()[name] = compiled  # the package's attribute too, as an import of the submodule would set it
        used.append(name)
    if len(used) == len(_COMPILED):
        return "compiled (Cython)"
    return f"partly compiled (Cython: {', '.join(used)})" if used else "pure Python"


ENGINE_BUILD = _select()
