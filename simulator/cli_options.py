"""Command-line options that several ``clustersim`` commands share (one definition each)."""

from __future__ import annotations

from simulator.errors import ConfigError


def add_overrides(parser) -> None:
    """``--set key.path=value`` (repeatable): override a scenario field before validation."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a scenario field, e.g. --set parallelism.tp=4 (repeatable; YAML values: null unsets a field "
                             "that cannot be null, so it takes its default)")


def add_execution(parser, dask_help: str = "run on Dask: 'local' (a LocalCluster on 127.0.0.1) or tcp://host:port") -> None:
    """``--workers N`` and ``--dask ADDRESS``: where the simulations of a batch run."""
    parser.add_argument("--workers", type=int, default=None, help="worker processes (default: all cores)")
    parser.add_argument("--dask", metavar="ADDRESS", help=dask_help)


def check_workers(workers: int | None) -> None:
    if workers is not None and workers < 1:
        raise ConfigError("--workers", f"must be at least 1, got {workers}")
