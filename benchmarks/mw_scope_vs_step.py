"""A ``%%distribute --step`` cell against TensorFlow's custom training loop typed into a scope
cell, on the same 2 workers (``%distribute multiworker --workers 2``), in one run.

Both train the same model on the same data with the same optimizer, ``--steps`` steps a cell:

* step: the step cell (nbdist's loop: per-replica loss and gradient norm every step,
  all-reduce timing sampled, rows streamed to the kernel);
* loop: the loop of TensorFlow's custom-training tutorial (``strategy.run`` in a
  ``tf.function``, the summed loss fetched every step), defined once in a setup cell and run
  by a scope cell.

Rounds interleave the two sides after one untimed cell of each (tracing). The time of a cell
is its wall time in the kernel, dispatch included. Prints each round and the ratio of
steps/s (step / loop) over all rounds; goal >= 0.95.

    python benchmarks/mw_scope_vs_step.py [--rounds 5] [--steps 400]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from cluster_cells import SETUP, STEP, TUTORIAL_STEP  # noqa: E402 - the cluster tests' cells
from common import ipython_shell, ok  # noqa: E402

LOOP = """%%distribute
iterator = iter(strategy.experimental_distribute_dataset(long_ds))
total = 0.0
for _ in range({steps}):
    total += float(tutorial_step(iterator))
"""


def timed(ip, code: str) -> float:
    started = time.perf_counter()
    ok(ip, code)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    ip = ipython_shell()
    ok(ip, "%load_ext nbdist")
    ok(ip, "%distribute multiworker --workers 2")
    ok(ip, SETUP)
    ok(ip, TUTORIAL_STEP)
    step = STEP.format(data="long_ds", flags=f"--steps {args.steps}")
    loop = LOOP.format(steps=args.steps)
    timed(ip, step)
    timed(ip, loop)
    sides: dict[str, list[float]] = {"step": [], "loop": []}
    for i in range(args.rounds):
        order = ("step", "loop") if i % 2 == 0 else ("loop", "step")
        for side in order:
            sides[side].append(timed(ip, step if side == "step" else loop))
        print(f"round {i + 1}: step {args.steps / sides['step'][-1]:6.1f} steps/s, "
              f"loop {args.steps / sides['loop'][-1]:6.1f} steps/s", flush=True)
    ok(ip, "%distribute stop")
    ratio = sum(sides["loop"]) / sum(sides["step"])
    per_round = [b / a for a, b in zip(sides["step"], sides["loop"], strict=True)]
    print(f"step cell / tutorial loop, steps/s over {args.rounds} rounds of {args.steps} "
          f"steps: {ratio:.3f} (per round {min(per_round):.3f}..{max(per_round):.3f}, "
          f"median {statistics.median(per_round):.3f}; goal >= 0.95)")


if __name__ == "__main__":
    main()
