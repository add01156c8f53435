"""`--steps-per-call auto` vs the hand-written one-step-per-call loop, side by side.

The tiny MLP of benchmarks/overhead.py at 1 and 4 replicas, one process. Per round: the
hand-written loop (``hand_step(next(it))`` per step, as TensorFlow's custom-training guide
writes it, the loss fetched at the end) then a ``%%distribute --step --steps-per-call auto``
cell of the same number of steps (its trace reused after the first round, ``nbdist.
step.cache``). Printed per configuration: the whole-call CPU-time (user+sys, all threads)
and wall ratios cell / hand-written in steps per second (the goal is >= 1.5), and the K that
``auto`` chose.

    python benchmarks/steps_per_call.py [--rounds 5] [--steps 1500]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import mlp_on_strategy, nbdist_shell, ok, ratio, timed  # noqa: E402
from overhead import HAND, SETUP, STEP_BODY  # noqa: E402  (the same model and step)


def bench(ip, replicas: int, rounds: int, steps: int) -> None:
    import nbdist

    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "one_device" if replicas == 1
                      else f"mirrored --devices {replicas}")
    mlp_on_strategy(ip, steps)
    ok(ip, HAND)
    cell = f"%%distribute --step --data train_ds --steps-per-call auto\n{STEP_BODY}"
    hand_loop = ip.user_ns["hand_loop"]
    hand_loop(steps, 0)
    ok(ip, cell)   # warm-up: traces the step
    hand_side, cell_side, chosen = [], [], []
    for _ in range(rounds):
        hand_side.append(timed(lambda: hand_loop(steps, 0)))
        cell_side.append(timed(lambda: ok(ip, cell)))
        run = nbdist.runs[-1]
        assert run.steps_done == steps, run.summary()
        chosen += [n.split(" chose ")[1].split(" ")[0] for n in run.notes if " chose " in n]
    cpu, wall = ratio(hand_side, cell_side, 0), ratio(hand_side, cell_side, 1)
    per_round = ", ".join(f"{h[1] / c[1]:.2f}" for h, c in zip(hand_side, cell_side, strict=True))
    print(f"mlp x{replicas} replicas, {steps} steps, {rounds} rounds: --steps-per-call auto "
          f"vs hand-written one step per call: CPU-time ratio {cpu:.2f}, wall ratio {wall:.2f} "
          f"(per round wall: {per_round}); auto chose K = {', '.join(chosen)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    ip = nbdist_shell()
    ok(ip, SETUP)
    for replicas in (1, 4):
        bench(ip, replicas, args.rounds, args.steps)


if __name__ == "__main__":
    main()
