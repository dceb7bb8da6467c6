"""The cyclic garbage collector paused while a command starts up.

Start-up (importing the modules, building pydantic's validators, reading the catalogs and the
scenario) allocates a few hundred thousand objects that live to the end of the run and are not
garbage, yet CPython's collector, run every 700 net allocations (``gc.get_threshold()``), traverses
them again and again: ~70 collections, 12-17 ms of a default ``clustersim simulate`` (measured with
``gc.callbacks``), and the young ones once more in every later collection. :func:`paused_gc` switches
the collector off for that phase, then moves every object alive to the permanent generation
(``gc.freeze()``: ignored by all future collections, CPython docs of the ``gc`` module) and switches
it back on, so the simulation runs with the collector as usual, over its own objects.

``gc.freeze()`` is done once per process (while nothing is frozen yet): a fresh ``clustersim`` process
holds only start-up state then. A program that calls :func:`simulator.cli.main` many times in one
process (the tests) freezes once, on its first call; later calls only pause the collector, so garbage
of earlier runs is never frozen repeatedly.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_gc() -> Iterator[None]:
    """Run the block with the cyclic collector off; afterwards freeze what is alive (once per process)
    and turn the collector back on (left off where the caller had turned it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
        if was_enabled:
            gc.enable()
