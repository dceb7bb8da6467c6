"""Accelerators no row of this project measures, derived from their SXM sibling by one stated rule.

``python -m validation.derive_parts [--write]`` prints (``--write``: writes) the ``efficiency:`` block of
each part in :data:`DERIVED_PARTS` into ``hardware_specs/accelerators/<part>.yaml`` below the hand-written
datasheet head. tests/test_derived_parts.py checks that every file holds what this script derives from
its base's current spec, so a refit of the SXM part (validation/calibrate_microbench.py --write) that is
not carried here fails a test instead of drifting.

**The rule** (chosen before any row of these parts was simulated; the rows are held-out checks of it,
``python -m validation.modern --case-set cnn_lambda`` "derived parts"; nothing is fitted on them):

- *Peaks, HBM capacity and bandwidth, TDP*: the part's datasheet (:data:`DERIVED_PARTS`, ``source``). The
  datasheet peak already holds the part's clock and SM count: H100 PCIe 114 SMs at a 1,755 MHz boost against
  the SXM5's 132 at 1,980 MHz is 0.766 of its peak (756 / 989 = 0.764); the A100 PCIe runs the SXM4's
  108 SMs at the same 1,410 MHz boost (312 = 312). Each spec records its SMs and the clock its dense peak implies
  (``sm_count``, ``sm_clock_mhz``: H100 PCIe 114 x 1,620 MHz, SXM5 132 x 1,830, the same 0.764), for work counted
  in SM cycles (simulator/cost/compute.py), and ``derived_from`` names the sibling, whose framework entries the
  part takes (simulator/cost/framework.py).
- *Compute efficiencies* (the GEMM curves, convolutions by shape, attention kernels, the in-training and
  misaligned-GEMM factors) are fractions of the part's own peak, carried from the SXM sibling unchanged;
  a GEMM curve's size axis is scaled by the peak ratio, so a GEMM of the same *duration* keeps its
  efficiency (launch and tail effects are time, not FLOPs: the catalog's rule for every part whose curve
  was scaled from another's, e.g. ``v100-pcie-16g``, and validation/calibrate_microbench.py ``_curve``).
- *Memory-bound efficiencies* (``memory_bound_efficiency``, pooling/concat kernels, direct convolutions)
  are fractions of HBM bandwidth, carried unchanged onto the datasheet bandwidth.
- *Power*: not applied. The PCIe boards hold half (H100: 350 of 700 W) or three quarters (A100 80 GB: 300 of
  400 W; 40 GB: 250) of the SXM part's power for 0.86x (H100) or 1.0x (A100) of its SMs; no datasheet gives
  the clock a long GEMM sustains under that limit, and no such measurement exists here. Carrying the fraction
  of peak assumes the PCIe board holds its boost clock under load as the SXM board does: an optimistic
  assumption if the power limit bites, said in each file's ``notes`` and, in ``clustersim simulate``, as
  ``sustained_clock: assumed``.

Every ``fitted_on`` of the carried block gains the marker ``(derived by rule from <sibling>)``, so the
output lists those constants as *derived* (simulator/cost/provenance.py), never as calibrated.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from typing import Any

import yaml

SPECS = Path(__file__).resolve().parents[1] / "hardware_specs" / "accelerators"
MARKER = "# --- efficiency: derived by `python -m validation.derive_parts --write`"

#: part -> its SXM sibling (the spec the efficiencies are carried from).
DERIVED_PARTS: dict[str, str] = {
    "h100-pcie-80g": "h100-sxm-80g",
    "a100-pcie-80g": "a100-sxm-80g",
    "a100-pcie-40g": "a100-sxm-80g",
}

RULE = ("validation/derive_parts.py: fractions of peak carried from {base} (GEMM size axis x {ratio:.4g}, the bf16 "
        "peak ratio: same kernel duration, same efficiency), fractions of HBM bandwidth carried onto this part's "
        "datasheet bandwidth; the sustained clock under this board's power limit assumed to be the sibling's")


def _raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((SPECS / f"{name}.yaml").read_text())


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _mark(block: Any, base: str) -> Any:
    """Every ``fitted_on`` / ``*_fitted_on`` string in ``block`` with the derivation marker appended."""
    if isinstance(block, dict):
        out = {}
        for key, value in block.items():
            # misaligned_gemm_factor_source names the rows the factor was measured on: a fitted_on by another name
            if isinstance(value, str) and (key == "fitted_on" or key.endswith("_fitted_on")
                                           or key == "misaligned_gemm_factor_source"):
                out[key] = f"{value} (derived by rule from {base})"
            else:
                out[key] = _mark(value, base)
        return out
    if isinstance(block, list):
        return [_mark(v, base) for v in block]
    return block


def derived_efficiency(base_efficiency: dict[str, Any], base: str, ratio: float) -> dict[str, Any]:
    """The sibling's ``efficiency`` mapping carried to a part whose bf16 peak is ``ratio`` times its own
    (the module docstring's rule)."""
    eff = copy.deepcopy(base_efficiency)
    eff["gemm_curve"] = [{"gflop": _sig(p["gflop"] * ratio), "efficiency": p["efficiency"]} for p in eff["gemm_curve"]]
    for curve in (eff.get("gemm_curves") or {}).values():
        curve["points"] = [{"gflop": _sig(p["gflop"] * ratio), "efficiency": p["efficiency"]}
                           for p in curve["points"]]
        curve["source"] = f"{curve.get('source', '')}; {RULE.format(base=base, ratio=ratio)}"
    eff = _mark(eff, base)
    eff["source"] = f"{eff.get('source', '')}; {RULE.format(base=base, ratio=ratio)}"
    return eff


def efficiency_block(name: str) -> dict[str, Any]:
    """The derived ``efficiency:`` mapping of ``name`` from its sibling's current spec file."""
    base = DERIVED_PARTS[name]
    head = yaml.safe_load(_head(name))
    ratio = head["peak_tflops"]["bf16"] / _raw(base)["peak_tflops"]["bf16"]
    return derived_efficiency(_raw(base)["efficiency"], base, ratio)


def _head(name: str) -> str:
    text = (SPECS / f"{name}.yaml").read_text()
    return text[: text.index(MARKER)] if MARKER in text else text


def rendered(name: str) -> str:
    """The whole spec file of ``name``: its hand-written head and the derived block."""
    body = yaml.safe_dump({"efficiency": efficiency_block(name)}, sort_keys=False, width=200, default_flow_style=None)
    return _head(name).rstrip("\n") + "\n" + MARKER + f" from {DERIVED_PARTS[name]} (edit the script, not this " \
                                                      "block) ---\n" + body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m validation.derive_parts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the derived blocks into the spec files")
    args = parser.parse_args(argv)
    for name in DERIVED_PARTS:
        text = rendered(name)
        if args.write:
            (SPECS / f"{name}.yaml").write_text(text)
            print(f"wrote {SPECS / f'{name}.yaml'}")
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
