"""Benchmark: the fast path's ranking against the engine's, top 20, on every example a search runs on
(issue 24: "the ranking of every `search` in `examples/` is identical for the top 20"; not a test).

For every scenario in ``examples/`` that ``search`` ranks by the fast path's and the engine's step
(the ``spmd`` kind; not co-located jobs, whose kernels share GPUs, nor straggler draws, which the
fast path does not price), with the search space its comment gives (a ``clustersim search
examples/NAME.yaml --space ...`` line) or the default space:

- the engine's top 20: ``search(...)``, exact by branch and bound (simulator/explore/bounds.py);
- the fast path's top 20: ``search(..., timed_by="fast")``, the same branch and bound with the fast
  path in the engine's place (exact for its own top 20: the step-time bound is never above it);
- identical (the same layouts in the same order), or the first position where they differ, with
  both layouts' engine and fast-path step times (a tie within the fast path's error reorders them);
- the largest |fast / engine - 1| over the engine's top 20 (every such row carries both times) and
  whether it is within issue 24's tolerance (0.5% where no transfers contend, 3% where they do);
- CPU seconds of both searches (this process and its workers), cache off.

    python benchmarks/bench_search_ranking.py [--workers 2] [--only NAME ...] [--top 20]

Exits 1 if a ranking differs or an error is past its tolerance. tests/test_search_ranking.py keeps
the comparison on narrowed spaces in CI.

Last full run (2026-12-05, 3274ee8 + the step-time bound's last bucket, ``--workers 2``, nice 10, load
15-18 on 2 cores: 259 CPU-s, 1,835 s wall): 15 examples compared, every error within tolerance
(largest 0.68%, mixed-a100-t4, contended), 11 rankings identical; 4 differ, each at a near-tie the
fast path's contention correction orders the other way:

- deepseek-v3-h800 at #1: zb-h1 17,566.770 ms vs interleaved 17,567.416 ms by the engine (0.004%
  apart), 17,574.872 / 17,569.936 ms by the fast path (+0.046% / +0.014%);
- gpt3-175b-fp8-512-h100 at #5: 9,685.756 vs 9,689.610 ms (0.04% apart), fast path +0.118% on the first;
- mixed-a100-t4 at #3: 2,339.434 vs 2,346.757 ms (0.31% apart), fast path -0.68% on the second;
- mixtral-8x7b-ep8-h100 at #18: 7,973.203 vs 7,973.288 ms (0.001% apart), fast path -0.004% on the second.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NO_CONTENTION_TOL, CONTENTION_TOL = 0.005, 0.03
SHOWN = ("tp", "pp", "dp", "cp", "ep", "virtual_stages", "schedule", "micro_batch_size", "zero_stage", "recompute",
         "sequence_parallel")


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def searchable(path: Path) -> str | None:
    """Why ``search`` does not rank this example by both paths, or None if it does."""
    from simulator.errors import ConfigError
    from simulator.scenario import load_scenario

    try:
        scenario = load_scenario(str(path))
    except ConfigError as exc:
        return f"does not load: {exc}"
    if scenario.strategy_kind != "spmd":
        return f"strategy kind {scenario.strategy_kind} (the fast path covers spmd)"
    if scenario.co_located:
        return "co-located jobs (search refuses them)"
    if scenario.simulation.stragglers is not None:
        return "straggler draws (timed by the engine alone)"
    return None


def space_of(path: Path):
    """The space of the example's own ``clustersim search`` comment line, or the default, and its text."""
    from simulator.explore.search import SearchConstraints, SearchSpace, parse_assignments

    for line in path.read_text().splitlines():
        match = re.search(r"clustersim search\s+\S*" + re.escape(path.name) + r"(.*)", line)
        if line.lstrip().startswith("#") and match:
            words = shlex.split(match.group(1))
            spaces = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--space"]
            limits = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--constraint"]
            return (parse_assignments(spaces, SearchSpace, "--space", lists=True),
                    parse_assignments(limits, SearchConstraints, "--constraint", lists=False),
                    " ".join(f"--space {s}" for s in spaces + limits) or "its comment's")
    return SearchSpace(), SearchConstraints(), "default"


def _key(row) -> tuple:
    return tuple(sorted(row["parallelism"].items()))


def _short(row) -> str:
    p = row["parallelism"]
    return " ".join(f"{k}={p[k]}" for k in SHOWN if k in p)


def _ms(value) -> str:
    return "-" if value is None else f"{1e3 * value:.3f} ms"


def compare(path: Path, workers: int, top: int, say) -> bool:
    from simulator.explore.search import search
    from simulator.simulate import simulate_point

    space, constraints, label = space_of(path)
    cpu0 = cpu_seconds()
    engine = search(str(path), space=space, constraints=constraints, top_k=top, workers=workers)
    cpu1 = cpu_seconds()
    fast = search(str(path), space=space, constraints=constraints, top_k=top, workers=workers, timed_by="fast")
    cpu2 = cpu_seconds()
    by_engine = [r for r in engine if r.get("evaluated_by") == "engine" and r.get("fits")][:top]
    by_fast = [r for r in fast if r.get("evaluated_by") == "fast" and r.get("fits")][:top]
    k = min(top, len(by_engine))
    ok = True
    errors = []
    for row in by_engine:
        if row.get("fast_step_time_s") is not None:
            error = row["fast_step_time_s"] / row["engine_step_time_s"] - 1
            tol = CONTENTION_TOL if row.get("fast_path_approximation") else NO_CONTENTION_TOL
            errors.append((abs(error), error, tol, row))
    worst = max(errors, key=lambda e: e[0]) if errors else None
    within = all(e[0] <= e[2] for e in errors) and len(errors) == len(by_engine)
    ok &= within
    head = (f"{path.name} ({label} space): top {k}: engine {cpu1 - cpu0:.1f} CPU-s, fast path {cpu2 - cpu1:.1f} CPU-s; "
            f"fast/engine over the engine's top {k}: max |error| "
            f"{100 * worst[0]:.4f}% ({'within' if within else 'OUTSIDE'} tolerance)" if worst else
            f"{path.name}: nothing timed")
    same = [_key(r) for r in by_engine[:k]] == [_key(r) for r in by_fast[:k]]
    if same:
        say(head + "; ranking IDENTICAL")
        return ok
    first = next(i for i in range(k) if i >= len(by_fast) or _key(by_engine[i]) != _key(by_fast[i]))
    say(head + f"; ranking DIFFERS first at #{first + 1}")
    engine_rows = {_key(r): r for r in engine}
    fast_rows = {_key(r): r for r in fast}
    for label_, row in (("engine's", by_engine[first]), ("fast path's", by_fast[first] if first < len(by_fast) else None)):
        if row is None:
            say(f"    the fast path's #{first + 1}: none")
            continue
        e_row, f_row = engine_rows.get(_key(row)), fast_rows.get(_key(row))
        e_s = e_row.get("engine_step_time_s") if e_row else None
        if e_s is None:  # skipped by the engine's bound: time it
            e_s = simulate_point({**_raw(path), "parallelism": {**row["parallelism"], "dp": "auto"}})["step_time_s"]
        f_s = f_row.get("fast_step_time_s") if f_row else None
        say(f"    the {label_} #{first + 1}: {_short(row)}: engine {_ms(e_s)}, fast path {_ms(f_s)}")
    return False


def margin_runs(path: Path, workers: int, top: int, say) -> None:
    """What a fast-path-first search would pay for an engine top k as exact as the search's: every
    candidate that could be in the engine's top k given the fast path's agreement tolerance
    (|fast/engine - 1| <= 0.5% where no transfers contend, 3% where they do) is timed by the engine.
    Candidate i can be in the engine's top k only if its least possible engine time fast_i / (1 + tol_i)
    is at most U, the k-th smallest of the greatest possible ones fast_j / (1 - tol_j); those are counted
    (the fast path's ranking is grown until the next fast time is past U·1.03), beside the engine runs the
    search's lower-bound rule needed."""
    from simulator.explore.search import search
    from simulator.report.search_table import summarize

    space, constraints, _ = space_of(path)
    engine = search(str(path), space=space, constraints=constraints, top_k=top, workers=workers)
    bound_rule = summarize(engine)["engine_resimulated"]
    depth = 2 * top
    while True:
        fast = [r for r in search(str(path), space=space, constraints=constraints, top_k=depth, workers=workers,
                                  timed_by="fast") if r.get("evaluated_by") == "fast" and r.get("fits")]
        if len(fast) < top:
            say(f"    {path.name}: fewer than {top} layouts fit")
            return

        def tol(row) -> float:
            return CONTENTION_TOL if row.get("fast_path_approximation") else NO_CONTENTION_TOL

        # seconds per sample (the global batch may be a searched field), best first as the search ranks them
        per = [1.0 / (r.get("samples_per_s") or r["tokens_per_s"]) for r in fast]
        ceiling = sorted(p / (1 - tol(r)) for p, r in zip(per, fast, strict=True))[top - 1]
        inside = [r for p, r in zip(per, fast, strict=True) if p / (1 + tol(r)) <= ceiling]
        if len(fast) < depth or per[-1] / (1 + CONTENTION_TOL) > ceiling:
            break
        depth *= 2
    say(f"    margin rule: {len(inside)} engine runs (the fast path's top {len(fast)} timed to find them) against "
        f"{bound_rule} by the search's lower-bound rule: {len(inside) - bound_rule:+d}")


def _raw(path: Path) -> dict:
    from simulator.explore.sweep import absolutize
    from simulator.scenario import load_raw

    raw, base = load_raw(str(path))
    return absolutize(raw, base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--only", nargs="*", help="example file names (default: every one)")
    parser.add_argument("--margin", action="store_true",
                        help="also count the engine runs a fast-path-first search with the agreement margin would need")
    args = parser.parse_args()
    os.environ["CLUSTERSIM_CACHE"] = "0"
    started, cpu0 = time.perf_counter(), cpu_seconds()
    status, compared, skipped = 0, 0, []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        if args.only and path.name not in args.only:
            continue
        why = searchable(path)
        if why:
            skipped.append(f"{path.name}: {why}")
            continue
        compared += 1
        status |= 0 if compare(path, args.workers, args.top, lambda line: print(line, flush=True)) else 1
        if args.margin:
            margin_runs(path, args.workers, args.top, lambda line: print(line, flush=True))
    print(f"\n{compared} examples compared, {len(skipped)} not searched by both paths "
          f"({', '.join(s.split(':')[0] for s in skipped)}); {time.perf_counter() - started:.0f} s wall, "
          f"{cpu_seconds() - cpu0:.0f} CPU-s; load average {os.getloadavg()[0]:.1f} at the end")
    return status


if __name__ == "__main__":
    sys.exit(main())
