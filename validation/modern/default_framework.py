"""How far the catalog constants alone are from held-out runs of each framework: what a run that names no
``training.framework`` is told (issue 23; session 9 audit, gap 3).

A scenario without ``training.framework`` runs as ``megatron-core``: the catalog constants (kernel
microbenchmarks, the rates Megatron-Core with Transformer Engine reaches), no framework factor. On held-out
runs of other frameworks those constants are much too optimistic (torchtitan's H100 rows by about a third,
vTrain's Megatron-DeepSpeed single-node rows by 37%, Lambda's ResNet-50 by 60%), and nothing in the output
said so. ``clustersim simulate`` now prints a WARNING with these figures for the run's accelerator and model
family (simulator/cost/default_framework.py) and carries them in ``--json`` (``default_framework``).

The figures are computed here, once, and shipped as data (:data:`SHIPPED`,
``hardware_specs/frameworks/default_heldout.csv``): one line per held-out row (set-aside rows left out, as in
the sets' figures) of every framework set of ``python -m validation.modern``
(:data:`validation.modern.framework_table.FRAMEWORK_SETS`), simulated with the catalog constants alone
(:func:`validation.modern.profiles.resolved_scenario` with no group: the row's own settings kept -- attention
kernel, overlaps, recompute -- and no fitted factor; the same simulation as the sets' "catalog constants only"
figures and tests/test_catalog_only_validation.py). Each line names the row's framework (its fitted group's
framework tag: ``torchtitan``, ``dle-tf1-xla``, ``automodel`` ...), the catalog part it ran on (a variant board
counts under its catalog part, the board named), the model family (``llm``: decoder transformers; ``cnn``: the
CNN sets), the precision and the relative error of the simulated rate (positive: predicted faster than
measured). Nothing is fitted on them and no constant is tuned to them.

``python -m validation.modern.default_framework`` prints the summary per part, family and framework;
``--write`` simulates the rows again (~1,000 rows, about a CPU-minute) and writes :data:`SHIPPED`
(``python -m validation.modern.by_accelerator --write`` writes it too). tests/test_catalog_only_validation.py
compares it with the rows its own catalog-only runs compute, so it cannot go stale unnoticed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hardware_specs.framework import FOLDER
from simulator.cost.default_framework import SHIPPED

FIELDS = ("set", "row", "framework", "accelerator", "board", "family", "precision", "relative_error", "fits")
#: Sets whose rows are CNNs (family ``cnn``); the other framework sets are decoder transformers (``llm``).
CNN_SETS = ("cnn_dle", "cnn_lambda")
STALE_HINT = (f"{SHIPPED.relative_to(FOLDER.parents[1])} is stale: run `python -m validation.modern.default_framework "
              "--write` (or `python -m validation.modern.by_accelerator --write`, which writes it too)")


def family(case_set: str) -> str:
    return "cnn" if case_set in CNN_SETS else "llm"


def framework_tag(case) -> str:
    """The framework a row ran with: the ``training.framework`` name of its shipped profile where there is one
    (validation/modern/shipped.py: ``llm-foundry`` for the ``llmfoundry`` groups), else its fitted group's tag
    (``automodel``, ``dle-tf1-xla``); a group that fits another constant counts under its framework (DLE's
    EfficientNet rows are DLE PyTorch runs)."""
    from validation.modern.registry import SETS
    from validation.modern.shipped import FRAMEWORKS

    tag = case.profile_group.split("|")[0]
    for suffix in SETS[case.case_set].fit_elsewhere:
        tag = tag.removesuffix(suffix)
    return next((name for name, (_, prefix, _) in FRAMEWORKS.items() if prefix == tag), tag)


def heldout_cases(name: str) -> list:
    """The set's held-out rows its figures count (not set aside)."""
    from validation.modern.registry import built

    return [c for c in built(name)[0] if c.heldout and not c.set_aside]


def line(case, outcome) -> dict:
    """One shipped line of a case and its catalog-only outcome."""
    from validation.modern.by_accelerator import catalog_part

    error = outcome.relative_error
    return {"set": case.case_set, "row": case.row, "framework": framework_tag(case),
            "accelerator": catalog_part(case.accelerator), "board": case.accelerator, "family": family(case.case_set),
            "precision": case.precision, "relative_error": "" if error is None else f"{error:.5f}",
            "fits": int(bool(outcome.fits))}


def catalog_only_lines(workers: int | None = 2) -> list[dict]:
    """Every held-out row of the framework sets simulated with the catalog constants alone, as shipped lines."""
    from validation.modern.case import outcome
    from validation.modern.framework_table import FRAMEWORK_SETS
    from validation.modern.profiles import resolved_scenario
    from validation.modern.registry import simulate_many

    cases = [c for name in FRAMEWORK_SETS for c in heldout_cases(name)]
    results = simulate_many([resolved_scenario(c, {}) for c in cases], workers)
    return [line(c, outcome(c, r)) for c, r in zip(cases, results, strict=True)]


def write(lines: list[dict], path: Path = SHIPPED) -> Path:
    from validation.modern.by_accelerator import write_csv

    return write_csv(lines, FIELDS, path)


def stale_lines(name: str, current: list[tuple[int, float | None, bool]], path: Path = SHIPPED) -> list[str]:
    """What differs between the shipped lines of set ``name`` and ``current`` (row, relative error, fits) from a
    fresh catalog-only run of its held-out rows (:func:`validation.modern.by_accelerator.stale_rows`'s check:
    missing or extra rows, errors apart by more than its tolerance, a changed fit). Empty when current."""
    from simulator.cost.default_framework import load
    from validation.modern.by_accelerator import SET_LINE, stale_rows

    shipped = [{"set": r.set, "line": SET_LINE, "row": r.row, "relative_error": r.relative_error, "fits": r.fits}
               for r in load(path) if r.set == name]
    return stale_rows(name, SET_LINE, current, shipped)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.modern.default_framework",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help=f"simulate the held-out rows with the catalog constants alone and write {SHIPPED.name}")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {write(catalog_only_lines(args.workers))}")
    from simulator.cost.default_framework import load, summaries

    rows = load()
    for part in sorted({r.accelerator for r in rows}):
        for fam in ("llm", "cnn"):
            lines = summaries(rows, part, fam)
            if lines:
                print(f"{part} ({fam}): " + "; ".join(s.text() for s in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
