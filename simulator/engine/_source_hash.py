"""The fingerprint that ties a compiled engine module to the source it was built from (setup.py embeds it in
``simulator/engine/_compiled_<name>`` as ``_SOURCE_SHA256``; :mod:`simulator.engine` uses the compiled module
only where it equals the fingerprint of the ``<name>.py`` and ``<name>.pxd`` beside it). Standard library only:
setup.py loads this file by path, before the package can be imported."""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_sha256(directory: str | Path, name: str) -> str:
    """SHA-256 of ``name.py``, a NUL byte, and ``name.pxd`` (empty where there is none) in ``directory``: any
    edit of the Python source or of its Cython declarations changes it."""
    directory = Path(directory)
    pxd = directory / f"{name}.pxd"
    digest = hashlib.sha256((directory / f"{name}.py").read_bytes())
    digest.update(b"\0")
    digest.update(pxd.read_bytes() if pxd.is_file() else b"")
    return digest.hexdigest()
