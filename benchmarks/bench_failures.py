"""How long a simulation with failures takes (a benchmark, not a test: absolute times are noisy).

Llama 3 405B on 16,384 H100s in symmetric mode (examples/llama3-405b-16k-h100-failures.yaml: Llama 3
Table 5 rates, a rack process, 16 spare nodes), end to end through ``simulate()`` (scenario load,
the engine's step, the failure draws and the job timeline), for:

- 1,000 steps with failures (the issue's target: under a minute on 2 cores), at Llama 3's rates and
  at 10x them (so that a 2.3-hour job sees a dozen failures);
- the same with the engine unrolling 8 steps (``simulation.steps``) to take the step time from;
- the example's 54 days (~500,000 steps) and a year (~3.5 million steps).

    python benchmarks/bench_failures.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from simulator.scenario import load_scenario
from simulator.simulate import simulate

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama3-405b-16k-h100-failures.yaml"
STEPS_1000 = ["reliability.days=null", "reliability.steps=1000"]
CASES = {
    "1,000 steps, Llama 3 rates": STEPS_1000,
    "1,000 steps, 10x Llama 3 rates": [*STEPS_1000, "reliability.rate_scale=10"],
    "1,000 steps, 10x rates, engine unrolls 8 steps": [*STEPS_1000, "reliability.rate_scale=10",
                                                      "simulation.steps=8"],
    "54 days (example)": [],
    "365 days": ["reliability.days=365"],
}


def run(overrides: list[str], repeats: int) -> tuple[float, dict]:
    times, rel = [], {}
    for _ in range(repeats):
        start = time.perf_counter()
        result = simulate(load_scenario(EXAMPLE, overrides))
        times.append(time.perf_counter() - start)
        rel = result.extra["reliability"]
    return statistics.median(times), rel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case (16,384 GPUs, symmetric mode)':<48} {'median s':>9} {'steps':>10} {'failures':>9} {'goodput':>8}")
    for name, overrides in CASES.items():
        seconds, rel = run(overrides, args.repeats)
        print(f"{name:<48} {seconds:>9.3f} {rel['steps_done']:>10,} {rel['failures']:>9,} {100 * rel['goodput']:>7.1f}%")


if __name__ == "__main__":
    main()
