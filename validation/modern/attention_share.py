"""How much of a simulated step is the fused attention kernel, and what attention rate a row implies.

For each case the step is simulated twice on its profile's constants: as fitted and with the fused
attention kernel's efficiency halved (``attention_scale`` / 2). The difference is the step's
attention time ``t_attn`` (the kernel is compute-bound at these lengths: its time doubles). If the
rest of the step is priced right, the measured step ``t_meas = t_sim · (1 + error)`` leaves
``t_meas - (t_sim - t_attn)`` for attention, and

    implied = attention_scale · t_attn / (t_meas - t_sim + t_attn)

is the fused attention rate the row implies, as a fraction of the catalog kernel (the accelerator's
``attention`` spec: FlashAttention-2 paper Fig 7 on H100). Rows where attention is a small share of
the step say little (an error of the GEMMs lands on the attention term); rows where it is most of the
step pin it down. This is the analysis behind the framework profiles' ``attention_scale``
(validation/modern/profiles.py): on H100, llm-foundry's and torchtitan's 16K-256K-token rows imply
0.5-0.6 of the FA2-paper kernel, NeMo's long-context rows 0.9-1.0.

    python -m validation.modern.attention_share --case-set llmfoundry --accelerator h100 --min-share 0.3
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from typing import Any

from validation.case_set_option import add_case_set_option, require_case_set
from validation.modern.case import ModernCase, outcome
from validation.modern.profiles import load_groups, with_constants
from validation.modern.registry import SETS, built, simulate_many


@dataclass(frozen=True)
class AttentionShare:
    case: ModernCase
    relative_error: float | None   # simulated / measured - 1, with the fitted constants
    share: float | None            # attention time / simulated step time
    implied: float | None          # fused attention rate the row implies / the catalog kernel's


def attention_shares(cases: list[ModernCase], groups: dict[str, dict[str, Any]],
                     workers: int | None = 2) -> list[AttentionShare]:
    """Each case's attention share and implied attention rate (see the module docstring)."""
    fitted, halved = [], []
    for c in cases:
        constants = dict(groups.get(c.profile_group) or {})
        scale = constants.get("attention_scale", 1.0)
        fitted.append(with_constants(c, {**constants, "attention_scale": scale}))
        halved.append(with_constants(c, {**constants, "attention_scale": scale / 2}))
    results = simulate_many(fitted + halved, workers)
    out = []
    for c, full, half in zip(cases, results[:len(cases)], results[len(cases):], strict=True):
        error = outcome(c, full).relative_error
        t_sim, t_half = full.get("step_time_s"), half.get("step_time_s")
        if error is None or not t_sim or not t_half:
            out.append(AttentionShare(c, error, None, None))
            continue
        t_attn = t_half - t_sim
        left = t_sim * (1 + error) - t_sim + t_attn
        scale = (groups.get(c.profile_group) or {}).get("attention_scale", 1.0)
        implied = scale * t_attn / left if left > 0 and t_attn > 0 else None
        out.append(AttentionShare(c, error, t_attn / t_sim, implied))
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_case_set_option(parser, "case_set", sorted(SETS), repeatable=False)
    parser.add_argument("--accelerator", default="", help="only cases whose accelerator name contains this")
    parser.add_argument("--half", choices=("heldout", "fit", "all"), default="all")
    parser.add_argument("--min-share", type=float, default=0.3, help="attention share the summary needs")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    require_case_set(parser, args.case_set)
    cases = [c for c in built(args.case_set)[0] if args.accelerator in c.accelerator
             and (args.half == "all" or (args.half == "heldout") == c.heldout)]
    rows = attention_shares(cases, load_groups(SETS[args.case_set].profile_name), args.workers)
    for r in rows:
        print(f"  row {r.case.row:4d} {r.case.label[:70]:70s} error {_fmt(r.relative_error, '+7.1%')} "
              f"attention share {_fmt(r.share, '4.2f')} implied/catalog kernel {_fmt(r.implied, '5.2f')}")
    pinned = [r.implied for r in rows if r.share is not None and r.share >= args.min_share and r.implied]
    if pinned:
        print(f"{len(pinned)} rows with attention share >= {args.min_share:.2f}: implied attention rate "
              f"median {statistics.median(pinned):.2f}, range {min(pinned):.2f}-{max(pinned):.2f} of the catalog kernel")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
