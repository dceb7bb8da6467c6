"""clustersim's Python API: simulate, search and sweep from a script or a notebook.

    import clustersim

    result = clustersim.simulate("examples/mixtral-8x7b-ep8-h100.yaml", parallelism__ep=4)
    result.step_time_s, result.mfu          # figures with their units in the name
    result.to_frame()                       # one row, flat columns (pandas)
    rows = clustersim.search("examples/mixtral-8x7b-ep8-h100.yaml", num_gpus=64, space={"tp": [2, 4]})

Overrides are keyword arguments: a dotted scenario path with ``__`` for each dot
(``parallelism__tp=4`` is ``--set parallelism.tp=4``), or a nested mapping merged into the
scenario (``parallelism={"tp": 4, "pp": 2}``). Bad input raises
:class:`simulator.errors.ConfigError` naming the field, as the command line does.

Nothing heavy (pandas, simpy, matplotlib) is imported until a function is called.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas

    from simulator.report.result import SimulationResult
    from simulator.scenario import Scenario

__all__ = ["ConfigError", "load_scenario", "search", "simulate", "sweep", "__version__"]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clustersim")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    if name == "ConfigError":
        from simulator.errors import ConfigError

        return ConfigError
    raise AttributeError(f"module 'clustersim' has no attribute {name!r}")


def _override_items(overrides: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``{"parallelism__tp": 4, "training": {"precision": "fp8"}}`` -> dotted paths and values."""
    items: list[tuple[str, Any]] = []
    for key, value in overrides.items():
        path = f"{prefix}{key.replace('__', '.')}"
        if isinstance(value, dict) and value:
            items += _override_items(value, f"{path}.")
        else:
            items.append((path, value))
    return items


def _raw(source: Any, overrides: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    from simulator.scenario import load_raw, set_path

    raw, base = load_raw(Path(source) if isinstance(source, str) else source)
    for path, value in _override_items(overrides):
        _check_not_set_lines(path, value)
        set_path(raw, path, value)
    return raw, base


def _check_not_set_lines(key: str, value: Any) -> None:
    """``set=["parallelism.dp=4"]`` or ``overrides=[...]`` (the command line's ``--set`` lines, or
    ``simulator.scenario.load_scenario``'s list) is refused with the form this API takes: it read as a scenario field
    and said "input: expected a list, got ['parallelism.dp=4']" or "overrides: unknown key"."""
    from simulator.errors import ConfigError
    from simulator.scenario import ScenarioFile

    if "." in key or key in ScenarioFile.model_fields:
        return
    if isinstance(value, list | tuple) and value and all(isinstance(v, str) and "=" in v for v in value):
        example = value[0].split("=", 1)
        raise ConfigError(key, f"not a scenario field: overrides are keyword arguments, a dotted path with __ for each "
                               f"dot ({example[0].replace('.', '__')}={example[1]} for --set {value[0]}), or a "
                               "mapping merged into the scenario (parallelism={'tp': 4})")


#: The command-line options the core's errors name, and the keyword arguments they are here (``search(num_gpus=0)``
#: said "--gpus: must be a positive integer", ``space={"tp": [0]}`` "--space tp: ...").
_OPTION_ARGUMENTS = (("--gpus", "num_gpus"), ("--space", "space"), ("--constraint", "constraints"),
                     ("--workers", "workers"), ("--dask", "dask"), ("--out", "out"), ("--resume", "resume"),
                     ("--force", "force"))


def _as_arguments(exc: Exception) -> Exception:
    """A ConfigError naming a command-line option, renamed to this API's keyword argument (others unchanged)."""
    from simulator.errors import ConfigError

    if isinstance(exc, ConfigError):
        for option, argument in _OPTION_ARGUMENTS:
            if exc.field == option or exc.field.startswith(option + " "):
                reason = exc.reason.replace("pass --resume", "pass resume=True").replace("--force", "force=True")
                return ConfigError(argument + exc.field[len(option):].replace(" ", ".", 1), reason)
    return exc


def load_scenario(source: str | Path | dict[str, Any] | None = None, **overrides: Any) -> Scenario:
    """A resolved, checked scenario from a YAML path, a mapping, or (``None``) the built-in default."""
    from simulator.scenario import Scenario, build_scenario

    if isinstance(source, Scenario):
        if overrides:
            raise TypeError("overrides apply to a path or a mapping, not to a resolved Scenario")
        return source
    raw, base = _raw(source, overrides)
    return build_scenario(raw, base)


def simulate(scenario_or_path: Any = None, *, mode: str | None = None, trace: str | Path | None = None,
             **overrides: Any) -> SimulationResult:
    """Simulate one training step. ``trace`` writes a Chrome trace (Perfetto) of it.

    Returns a :class:`simulator.report.result.SimulationResult`: ``step_time_s``, ``tokens_per_s``,
    ``mfu``, ``peak_memory_gib``, ``time_breakdown_s``, ... ; ``to_frame()`` gives one pandas row,
    ``to_dict()`` the ``clustersim simulate --json`` object (its ``warnings``, ``notes`` and
    ``efficiency_provenance`` too; all but ``memory_series_bytes``); in a notebook it shows as the command's
    table, WARNINGs included."""
    from simulator.errors import ConfigError
    from simulator.simulate import simulate as _simulate

    if mode not in (None, "symmetric", "full"):  # as `clustersim simulate --mode`; any other was run as symmetric
        raise ConfigError("mode", f"must be 'symmetric' or 'full' (or None: simulation.mode), got {mode!r}")
    scenario = load_scenario(scenario_or_path, **overrides)
    if trace is not None:
        from simulator.report.output_path import check_output_path
        from simulator.report.trace import write_chrome_trace

        check_output_path(trace, "trace")
    result = _simulate(scenario, mode=mode, detail=trace is not None)
    from simulator.commands.simulate import annotate

    annotate(result, scenario)  # provenance, WARNINGs and NOTEs: what `clustersim simulate` says of the run
    if trace is not None:
        write_chrome_trace(result, trace)
    return result


def search(scenario_or_path: Any = None, *, num_gpus: int | None = None, space: dict[str, Any] | None = None,
           constraints: dict[str, Any] | None = None, workers: int | None = 1, dask: str | None = None,
           **overrides: Any) -> pandas.DataFrame:
    """Every valid layout of the scenario on ``num_gpus`` GPUs, simulated and ranked (best first).

    ``space`` maps a layout field to its candidates (``{"tp": [4, 8], "recompute": ["full"]}``),
    ``constraints`` to a limit (``{"max_memory_gib": 70}``); see ``clustersim search --help``.
    Returns one row per layout with the columns of ``clustersim search --csv`` (``rank``, ``layout.tp``,
    ``step_time_s``, ``fits``, ``infeasible_reason``, ``warnings``, ``notes``, ...). ``workers=1`` runs in this
    process."""
    import pandas as pd
    from pydantic import ValidationError

    from simulator.errors import from_pydantic
    from simulator.explore.search import SearchConstraints, SearchSpace
    from simulator.explore.search import search as _search
    from simulator.report.search_table import flat_rows

    try:
        space_spec = SearchSpace.model_validate(space or {})
    except ValidationError as exc:
        raise from_pydantic(exc, "space", schema=SearchSpace) from None
    try:
        limits = SearchConstraints.model_validate(constraints or {})
    except ValidationError as exc:
        raise from_pydantic(exc, "constraints", schema=SearchConstraints) from None
    raw, base = _raw(scenario_or_path, overrides)
    if base is not None:
        from simulator.explore.sweep import absolutize

        raw = absolutize(raw, base)
    from simulator.errors import ConfigError

    try:
        rows = _search(raw, num_gpus=num_gpus, space=space_spec, constraints=limits, workers=workers, dask=dask)
    except ConfigError as exc:
        raise _as_arguments(exc) from None
    columns, flat = flat_rows(rows)  # the columns of `clustersim search --csv`: rank, warnings, notes too
    return pd.DataFrame(flat, columns=columns)


def sweep(sweep_or_path: str | Path | dict[str, Any], out: str | Path, *, resume: bool = False,
          force: bool = False, workers: int | None = None, dask: str | None = None,
          progress: bool = False) -> pandas.DataFrame:
    """Run a sweep file (or mapping, see ``examples/sweeps/``), stream its rows to ``out`` (.csv or
    .parquet) and return them as a DataFrame, one row per point."""
    from simulator.errors import ConfigError
    from simulator.explore.sweep import load_sweep, read_results, run_sweep

    spec = load_sweep(sweep_or_path)
    try:
        run_sweep(spec, Path(out), resume=resume, force=force, workers=workers, dask=dask, progress=progress)
    except ConfigError as exc:
        raise _as_arguments(exc) from None
    return read_results(out)
