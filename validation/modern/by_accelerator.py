"""One row per catalog accelerator: what its efficiencies were calibrated on, what was carried from another
part, the held-out error end to end and on microbenchmarks, and what is still assumed (issue 23: "a README
table per accelerator: calibrated on what, held-out error, and what is still assumed").

Every cell is generated, none typed:

- *calibrated on / derived from / stated / still assumed*: the states :func:`simulator.cost.provenance.efficiency_provenance`
  gives (what ``clustersim simulate --json`` carries as ``efficiency_provenance`` / ``efficiency_states``) for a
  transformer (gpt-1.7b), a CNN (resnet50) and an MoE (mixtral-8x7b, also under torchtitan, the one framework with
  a measured grouped kernel) at every precision and FP8 recipe the part runs, on every catalog node that holds
  it, across two NVLink domains (so the cross-node constants are read too). A constant whose state differs between
  those runs is listed per run ("grouped_gemm in bf16 torchtitan"), its assumed remainder as "otherwise". Node constants (collectives) are
  named with their node. A part no catalog node holds gets no collective entry: its collectives are those of
  the node a user writes.
- *held-out error end to end*: the held-out rows of every ``python -m validation.modern`` set (the set's own
  figure, its fitted profile; set-aside rows left out, as in the set's figures) and every row of a set's
  "derived parts" line (as a user naming the row's framework gets them; no row of it is fitted on), by the
  catalog part the row ran on (a variant board such as torchtitan's H100 96 GB at 500 W counts under its
  catalog part, named). Simulating them takes ~40 CPU-s, so the per-row errors are cached in
  ``validation/modern/heldout_errors.csv`` (written by ``--write``); tests/test_modern_validation.py and
  tests/test_derived_parts.py compare the cache with the errors their own runs compute, so it cannot go stale.
  A part with no such row says "none".
- *held-out error on microbenchmarks*: the odd-md5 halves of validation/calibrate_microbench.py (GEMM,
  attention kernels, the grouped GEMM), validation/calibrate_collectives.py (collectives inside a node) and
  validation/calibrate_collectives_cross.py (across nodes; set-aside rows counted apart), recomputed here (< 1 s).

``python -m validation.modern.by_accelerator`` prints the rows; ``--markdown`` the table (as does
``python -m validation.modern --by-accelerator``); ``--write`` re-simulates the held-out rows, writes the cache and
replaces the table in docs/validation.md (between its two marker lines; it lived in README.md until the eleventh
session); ``--doc`` (alias ``--readme``) replaces the table from the cache alone.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

CACHE = Path(__file__).with_name("heldout_errors.csv")
#: The document that holds the table (between BEGIN and END); README.md until the eleventh session.
TABLE_DOC = Path(__file__).resolve().parents[2] / "docs" / "validation.md"
BEGIN = "<!-- accelerator table: python -m validation.modern.by_accelerator --write generates it; not edited by hand -->"
END = "<!-- end of the accelerator table -->"
CACHE_FIELDS = ("set", "line", "row", "accelerator", "precision", "relative_error", "fits")
SET_LINE, DERIVED_LINE = "set", "derived parts"

#: (model, training.framework or None) whose runs read the constants a run can use: attention (a transformer),
#: convolutions and pooling (a CNN), expert GEMMs (an MoE: dense GEMMs of an expert's shape by default, the grouped
#: kernel measured for torchtitan where a part has one).
MODELS = (("gpt-1.7b", None), ("resnet50", None), ("mixtral-8x7b", None), ("mixtral-8x7b", "torchtitan"))
#: (label, training settings) tried on every part: each precision, and each FP8 recipe (the block-scaled ones have
#: their own kernels: DeepGEMM, MXFP8, NVFP4); a setting the part cannot run is a ConfigError and skipped.
PRECISIONS = (("bf16", {"precision": "bf16"}), ("fp16", {"precision": "fp16"}), ("fp32", {"precision": "fp32"}),
              ("tf32", {"precision": "fp32", "tf32": True}),
              *((f"fp8 {recipe}", {"precision": "fp8", "fp8_recipe": recipe})
                for recipe in ("delayed", "current", "rowwise", "blockwise", "mxfp8", "nvfp4")))
NODE_COMPONENTS = ("intra_node_collectives", "intra_node_send_all_to_all", "inter_node_collectives")


# ------------------------------------------------------------------------------------------- end to end


def heldout_errors(workers: int | None = 2) -> list[dict]:
    """Every held-out row of every validation.modern set (not set aside), every derived-parts row (not set
    aside) and every case of ``clustersim validate`` (validation/published_cases.py: Narayanan 2021 Table 1 and
    Korthikanti 2022 Tables 3/5 on DGX A100 80 GB; the A100 was fitted on Korthikanti's Table 4 alone),
    simulated now: one dict per row with :data:`CACHE_FIELDS`."""
    from validation.modern.registry import SETS, derived_cases, evaluate, evaluate_derived

    out = published_errors()
    for name in SETS:
        for o in evaluate(name, "heldout", workers):
            if not o.case.set_aside:
                out.append(_cache_row(name, SET_LINE, o))
        if derived_cases(name):
            for u in evaluate_derived(name, workers)[1][0]:
                if not u.outcome.case.set_aside:
                    out.append(_cache_row(name, DERIVED_LINE, u.outcome))
    return out


def published_errors() -> list[dict]:
    """The cases of ``clustersim validate`` as cache rows (the error of the published quantity: TFLOP/s per GPU
    or iteration time; the magnitude is what the table reports)."""
    from hardware_specs.catalog import NODES, node_accelerator
    from simulator.scenario import load_scenario
    from simulator.simulate import simulate
    from validation.published_cases import CASE_SETS

    out = []
    for name, case_set in CASE_SETS.items():
        for row, case in enumerate(case_set.cases()):
            result = simulate(load_scenario(case.scenario))
            error = case.simulated_value(result) / case.published - 1
            out.append({"set": name, "line": SET_LINE, "row": row,
                        "accelerator": node_accelerator(NODES.get(case.scenario["cluster"]["node"])).name,
                        "precision": case.scenario["training"]["precision"], "relative_error": f"{error:.5f}",
                        "fits": int(bool(result.fits))})
    return out


def _cache_row(name: str, line: str, o) -> dict:
    error = o.relative_error
    return {"set": name, "line": line, "row": o.case.row, "accelerator": o.case.accelerator,
            "precision": o.case.precision, "relative_error": "" if error is None else f"{error:.5f}",
            "fits": int(bool(o.fits))}


def write_csv(rows: list[dict], fields: list[str] | tuple[str, ...], path: Path) -> Path:
    """``rows`` as a CSV with ``fields`` as its header (LF line ends: the files are committed and diffed)."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(fields), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_cache(rows: list[dict], path: Path = CACHE) -> Path:
    return write_csv(rows, CACHE_FIELDS, path)


def load_cache(path: Path = CACHE) -> list[dict]:
    with path.open(newline="") as f:
        return [{**r, "row": int(r["row"]), "fits": r["fits"] == "1",
                 "relative_error": float(r["relative_error"]) if r["relative_error"] else None}
                for r in csv.DictReader(f)]


#: How far a cached error may sit from a fresh run's (the cache keeps 5 decimals).
CACHE_TOLERANCE = 1e-4
STALE_HINT = ("validation/modern/heldout_errors.csv is stale: run `python -m validation.modern.by_accelerator --write` "
              "(re-simulates the held-out rows, rewrites the cache and the table per accelerator in docs/validation.md)")


def stale_rows(name: str, line: str, current: Iterable[tuple[int, float | None, bool | None]],
               cached: list[dict] | None = None) -> list[str]:
    """What differs between the cache's rows of set ``name`` on ``line`` and ``current`` (row, relative error,
    fits, or None where the run does not say) computed by a fresh run: missing or extra rows, errors apart by more
    than :data:`CACHE_TOLERANCE`, a changed fit. Empty when the cache is current."""
    cached = load_cache() if cached is None else cached
    have = {r["row"]: r for r in cached if r["set"] == name and r["line"] == line}
    out = []
    seen = set()
    for row, error, fits in current:
        seen.add(row)
        c = have.get(row)
        if c is None:
            out.append(f"{name} {line} row {row}: not cached")
        elif (error is None) != (c["relative_error"] is None) or (
                error is not None and abs(error - c["relative_error"]) > CACHE_TOLERANCE) or (fits is not None and bool(fits) != c["fits"]):
            out.append(f"{name} {line} row {row}: cached {c['relative_error']} fits {c['fits']}, now {error} fits {fits}")
    out += [f"{name} {line} row {row}: cached, no longer a held-out row" for row in sorted(set(have) - seen)]
    return out


def catalog_part(label: str) -> str:
    """The catalog accelerator of a row's accelerator label (a variant board counts under its base part)."""
    from validation.modern.shipped import VARIANTS

    return VARIANTS[label][0] if label in VARIANTS else label


def _pct(errors: list[float]) -> str:
    absolute = [abs(e) for e in errors]
    return f"{100 * statistics.median(absolute):.1f} / {100 * max(absolute):.1f}%"


def end_to_end_cell(part: str, rows: list[dict]) -> str:
    """"set n=N median / max |error|" per set, line and board of ``part``'s rows; "none" without rows."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        if catalog_part(r["accelerator"]) == part:
            groups.setdefault((r["set"], r["line"], r["accelerator"]), []).append(r)
    if not groups:
        return "none"
    cells = []
    for (name, line, label), group in sorted(groups.items()):
        errors = [r["relative_error"] for r in group if r["relative_error"] is not None]
        where = name + (" derived-parts line" if line == DERIVED_LINE else "")
        if label != part:
            where += f" (on {label})"
        text = f"{where} n={len(errors)} {_pct(errors)}" if errors else f"{where} n=0"
        precisions = sorted({r["precision"] for r in group})
        if len(precisions) > 1:  # BF16 and FP8 (or TF32 and FP16) apart, as the sets report them
            text += " (" + ", ".join(
                f"{p} n={len(e)} {_pct(e)}" for p in precisions
                if (e := [r["relative_error"] for r in group if r["precision"] == p and r["relative_error"] is not None])
            ) + ")"
        oom = sum(1 for r in group if r["relative_error"] is not None and not r["fits"])
        missing = len(group) - len(errors)
        if oom:
            text += f" ({oom} predicted OOM)"
        if missing:
            text += f" ({missing} not simulated)"
        cells.append(text)
    return "; ".join(cells)


# ------------------------------------------------------------------------------------------ microbenchmarks


@cache
def microbench_errors() -> tuple[tuple[str, str, float | None], ...]:
    """(catalog part, what was measured, relative error or None for a set-aside row) for every held-out
    microbenchmark row of the calibrations."""
    from hardware_specs.catalog import NODES, node_accelerator
    from validation import (
        calibrate_collectives,
        calibrate_collectives_cross,
        calibrate_conv,
        calibrate_microbench,
    )

    out: list[tuple[str, str, float | None]] = []
    for r in calibrate_microbench.gemm_heldout_table().itertuples():
        out.append((r.accelerator, f"GEMM {r.kernel} {r.precision}", r.error))
    for table in (calibrate_microbench.attention_heldout_table(), calibrate_microbench.triton_heldout_table()):
        for r in table.to_dict("records"):
            out.append((r["accelerator"], f"{r['kernel']} {r['pass']}", r["error"]))
    grouped = calibrate_microbench.grouped_run_table()
    for r in grouped[grouped.heldout].itertuples():
        out.append((calibrate_microbench.GROUPED_ACCELERATOR, f"grouped GEMM {r.precision}", r.error))
    for r in calibrate_conv.conv_errors("heldout", host="per_network").itertuples():
        out.append((calibrate_conv.ACCELERATOR, "TF32 convolution layers (DeepPool, its per-layer host floor)",
                    r.error))
    for r in calibrate_collectives.heldout_table().itertuples():
        out.append((node_accelerator(NODES.get(r.node)).name, f"collectives in {r.node}", r.error))
    for r in calibrate_collectives_cross.cross_heldout_table().itertuples():
        out.append((node_accelerator(NODES.get(r.node)).name, f"collectives across {r.node}",
                    None if r.set_aside else r.error))
    return tuple(out)


def microbench_cell(part: str) -> str:
    groups: dict[str, list[float | None]] = {}
    for name, what, error in microbench_errors():
        if name == part:
            groups.setdefault(what, []).append(error)
    if not groups:
        return "none"
    cells = []
    for what, errors in sorted(groups.items()):
        kept = [e for e in errors if e is not None]
        aside = len(errors) - len(kept)
        cells.append(f"{what} n={len(kept)} {_pct(kept)}" + (f" (+{aside} set aside)" if aside else ""))
    return "; ".join(cells)


# ------------------------------------------------------------------------------------------------ provenance


@dataclass(frozen=True)
class PartProvenance:
    """A catalog part's efficiency constants by state: component -> the data (calibrated), the part or ratio
    it was carried from (derived); the components stated by a datasheet or assumed."""

    name: str
    nodes: tuple[str, ...]
    frameworks: tuple[str, ...]   # "<framework> <precisions> (<rows>)" of the shipped profile entries fitted here
    calibrated: dict[str, str]
    derived: dict[str, str]
    stated: tuple[str, ...]
    assumed: tuple[str, ...]


def part_nodes(name: str) -> tuple[str, ...]:
    from hardware_specs.catalog import NODES, node_accelerator

    return tuple(sorted(n for n, node in NODES.all().items() if node_accelerator(node).name == name))


def _scenarios(name: str) -> Iterable[tuple[str | None, str, object]]:
    """(catalog node or None, precision label, scenario) for every node holding ``name`` (or DGX H100's links
    with it where none does), precision it runs and model of :data:`MODELS`, over two NVLink domains."""
    from hardware_specs.catalog import NODES
    from simulator.errors import ConfigError
    from simulator.scenario import load_scenario

    nodes: list[tuple[str | None, str | dict]] = [(n, n) for n in part_nodes(name)]
    if not nodes:
        nodes = [(None, {**NODES.get("dgx-h100").model_dump(exclude_none=True), "accelerator": name})]
    for label, node in nodes:
        domain = NODES.get(label).domain_gpus if label else 8
        for precision, training in PRECISIONS:
            for model, framework in MODELS:
                settings = dict(training, **({"framework": framework} if framework else {}))
                try:
                    yield label, precision + (f" {framework}" if framework else ""), load_scenario(
                        {"model": model, "cluster": {"node": node, "num_gpus": 2 * domain},
                         "parallelism": {"global_batch_size": 2 * domain}, "training": settings})
                except ConfigError:
                    continue  # a precision the part does not run


@cache
def part_provenance(name: str) -> PartProvenance:
    from simulator.cost.provenance import (
        ASSUMED,
        CALIBRATED,
        DERIVED,
        STATED,
        efficiency_provenance,
        provenance_state,
    )

    # component -> {(state, source): precision labels}: a constant one precision reads from a fit and another
    # assumes (B200's grouped kernel: bf16 and MXFP8 measured, fp16 not) is listed per precision
    seen: dict[str, dict[tuple[str, str], list[str]]] = {}
    for node, precision, scenario in _scenarios(name):
        for component, where in efficiency_provenance(scenario).items():
            if component == "framework_factors":
                continue  # a framework profile's entries: listed apart (framework_entries)
            if component in NODE_COMPONENTS:
                if node is None:
                    continue  # no catalog node: the collectives are those of the node the user writes
                component = f"{component}[{node}]"
            state, source = provenance_state(where)
            key = (state, short_source(where) if state == CALIBRATED else short_derivation(source))
            labels = seen.setdefault(component, {}).setdefault(key, [])
            if precision not in labels:
                labels.append(precision)
    states: dict[str, tuple[str, str]] = {}
    for component, by_state in seen.items():
        if len(by_state) == 1:
            states[component] = next(iter(by_state))
            continue
        for key, labels in by_state.items():  # the assumed remainder is "otherwise" (every other run)
            states[f"{component} otherwise" if key[0] == ASSUMED else f"{component} in {'/'.join(labels)}"] = key
    pick = lambda s: {c: v for c, (st, v) in sorted(states.items()) if st == s}  # noqa: E731
    frameworks = tuple(f"{framework} {precisions} ({_rows_of(short_source(fitted_on))})"
                       for framework, precisions, fitted_on in framework_entries(name))
    return PartProvenance(name, part_nodes(name), frameworks, pick(CALIBRATED), pick(DERIVED), tuple(pick(STATED)),
                          tuple(pick(ASSUMED)))


def framework_entries(name: str) -> list[tuple[str, str, str]]:
    """(framework, precisions, fitted_on) of every shipped framework profile entry fitted on rows of ``name``
    (hardware_specs/frameworks/; a variant board's entry counts under its catalog part): the factors a run
    naming that framework gets there (``training.framework``), calibrated on the framework's own rows."""
    from hardware_specs.framework import framework_names, framework_profile

    out = []
    for framework in framework_names():
        profile = framework_profile(framework)
        for entry in profile.entries if profile is not None else ():
            if catalog_part(entry.accelerator) == name and entry.fitted_on:
                recipes = f" {'/'.join(entry.fp8_recipes)}" if entry.fp8_recipes else ""
                out.append((framework, "/".join(entry.precisions) + recipes, entry.fitted_on))
    return out


def short_derivation(source: str) -> str:
    """What a derived constant was carried from, without the explanation the output prints in full."""
    if "implicit-GEMM shape" in source:
        return "its own precision's GEMM curve at the implicit-GEMM shape (no convolution measured)"
    if "(transferred" in source:
        return source.split(" (")[0].removesuffix(" x 1.00") + " (transferred)"
    return source.split(" (")[0]


_FILE = re.compile(r"([\w.-]+\.(?:csv\.gz|csv|ya?ml|py))")


def short_source(where: str) -> str:
    """The data file a calibrated constant was fitted on and how many of its rows: "gemm_microbench.csv row 6",
    "collectives_bandwidth.csv (14 rows)", "deeppool_a100_v1_layers.csv.gz (fit half)"."""
    match = _FILE.search(where)
    if match is None:
        return where[:60]
    name, rest = match.group(1), where[match.end():]
    numbers = re.match(r"\s*,?\s*rows?\s+((?:\d+(?:-\d+)?\s*,\s*)*\d+(?:-\d+)?)", rest)
    if numbers:
        rows = [p for p in numbers.group(1).split(",") if p.strip()]
        count = sum(int(b) - int(a) + 1 if "-" in p else 1 for p in rows
                    for a, b in [p.strip().split("-") if "-" in p else (p, p)])
        return f"{name} row {rows[0].strip()}" if count == 1 else f"{name} ({count} rows)"
    quoted = re.match(r"\s*rows?\s+((?:'[^']+'\s*,?\s*)+)", rest)
    if quoted:
        return f"{name} ({len(re.findall(chr(39) + '[^' + chr(39) + ']+' + chr(39), quoted.group(1)))} rows)"
    if "fit half" in where:
        count = re.search(r"(\d+) rows", where)
        return f"{name} ({count.group(1)} fit-half rows)" if count else f"{name} (fit half)"
    return name


_PER_PRECISION = re.compile(r"^(gemm|conv|linear)_(\w+)$")


def _rows_of(short: str) -> str:
    """"llmfoundry_throughput.csv (40 fit-half rows)" -> "40 fit-half rows of llmfoundry_throughput.csv"."""
    match = re.fullmatch(r"(\S+) \((.+)\)", short)
    return f"{match.group(2)} of {match.group(1)}" if match else short


def _grouped(components: Iterable[str]) -> str:
    """Component names folded: ``gemm (bf16, fp16)``, ``intra_node_collectives (dgx-h100, p5-h100-efa)``."""
    plain: list[str] = []
    by_base: dict[str, list[str]] = {}
    for c in components:
        if "[" in c:
            base, node = c[:-1].split("[")
            by_base.setdefault(base, []).append(node)
        elif match := _PER_PRECISION.match(c):
            if match.group(1) not in by_base:
                plain.append(match.group(1))
            by_base.setdefault(match.group(1), []).append(match.group(2))
        else:
            plain.append(c)
    names = [f"{c} ({', '.join(by_base.pop(c))})" if c in ("gemm", "conv", "linear") else c for c in plain]
    return ", ".join(names + [f"{base} ({', '.join(nodes)})" for base, nodes in by_base.items()])


def _by_value(mapping: dict[str, str]) -> str:
    if not mapping:
        return "none"
    values: dict[str, list[str]] = {}
    for component, value in mapping.items():
        values.setdefault(value, []).append(component)
    return "; ".join(f"{_grouped(components)}: {value}" for value, components in values.items())


# ------------------------------------------------------------------------------------------------ the table


HEADER = ("accelerator", "calibrated on (rows of that part)", "derived from (another part or a ratio)",
          "stated (a datasheet figure, not fitted)", "held-out error end to end: set n=rows, median / max abs. error",
          "held-out error on microbenchmarks", "still assumed")


def table_rows(cached: list[dict] | None = None) -> list[tuple[str, ...]]:
    """One row per catalog accelerator (``clustersim specs list``), in catalog order."""
    from hardware_specs.catalog import ACCELERATORS

    cached = load_cache() if cached is None else cached
    rows = []
    for name in ACCELERATORS.names():
        p = part_provenance(name)
        assumed = _grouped(p.assumed) or "none"
        if not p.nodes:
            assumed += " (no catalog node: collectives are those of the node a run writes)"
        calibrated = _by_value(p.calibrated)
        if p.frameworks:
            calibrated = ("" if calibrated == "none" else calibrated + "; ") + \
                f"training.framework factors: {', '.join(p.frameworks)}"
        rows.append((name, calibrated, _by_value(p.derived), _grouped(p.stated) or "none",
                     end_to_end_cell(name, cached), microbench_cell(name), assumed))
    return rows


def markdown(cached: list[dict] | None = None) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table_rows(cached)]
    return "\n".join(lines)


def doc_table(text: str | None = None) -> str:
    """The table between docs/validation.md's two marker lines."""
    text = TABLE_DOC.read_text() if text is None else text
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write_doc(table: str, path: Path = TABLE_DOC) -> Path:
    text = path.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.modern.by_accelerator",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the table (as docs/validation.md holds it)")
    parser.add_argument("--write", action="store_true",
                        help="simulate the held-out rows again (~40 CPU-s), write validation/modern/heldout_errors.csv "
                             "and replace the table in docs/validation.md; and write hardware_specs/frameworks/default_heldout.csv "
                             "(validation/modern/default_framework.py: the same rows with the catalog constants alone)")
    parser.add_argument("--doc", "--readme", dest="doc", action="store_true",
                        help="replace the table in docs/validation.md from the cached errors, no simulation (a spec's provenance "
                             "changed, no figure did)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.doc:
        print(f"wrote {write_doc(markdown())}")
        return 0
    if args.write:
        from validation.modern import default_framework

        print(f"wrote {write_cache(heldout_errors(args.workers))}")
        print(f"wrote {write_doc(markdown())}")
        # the same rows with the catalog constants alone: what a run naming no training.framework is told
        print(f"wrote {default_framework.write(default_framework.catalog_only_lines(args.workers))}")
        return 0
    if args.markdown:
        print(markdown())
        return 0
    for row in table_rows():
        print(row[0])
        for title, cell in zip(HEADER[1:], row[1:], strict=True):
            print(f"  {title}: {cell}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
