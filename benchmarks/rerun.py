"""Re-running a `%%distribute --step` cell vs a hand-written epoch, interleaved in one process.

Same model (the tiny MLP of benchmarks/overhead.py), data and strategy (4 replicas by
default). After one warm-up of each side (the cell's first run traces its step, the
hand-written step is traced once), ``--rounds`` rounds of: one hand-written epoch
(``for batch in dist_ds: hand_step(batch)``, the loss fetched at the end) then one run of
the ``--steps``-step cell through a real IPython shell with the magic's own observer (the
dashboard, or its headless stand-in), which reuses its traced step (``nbdist.step.cache``).
Printed: CPU time (user+sys of this process, all threads) and wall ratios hand / cell over
all rounds (>= 1: the cell is as fast), the same for cells whose trace is dropped before each
run (what every re-run cost before), and the fixed cost per run: 1-step cells vs the
hand-written iterator + first step, median difference.

    python benchmarks/rerun.py [--rounds 10] [--steps 400] [--replicas 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import mlp_on_strategy, nbdist_shell, ok, ratio, timed  # noqa: E402
from overhead import HAND, SETUP, STEP_BODY  # noqa: E402  (the same model and step)

EPOCH = """
def hand_epoch(limit):
    total = tf.constant(0.0)
    for n, batch in enumerate(dist_ds):
        if n == limit:
            break
        total += hand_step(batch)
    return float(total)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--uncached-rounds", type=int, default=3)
    args = parser.parse_args()
    import nbdist

    ip = nbdist_shell(f"mirrored --devices {args.replicas}")
    ok(ip, SETUP)
    mlp_on_strategy(ip, args.steps)
    ok(ip, HAND + EPOCH)
    cache = nbdist.session.current_session().backend.traced_steps

    def cell(steps: int) -> None:
        ok(ip, f"%%distribute --step --data train_ds --steps {steps}\n{STEP_BODY}")
        assert nbdist.runs[-1].steps_done == steps, nbdist.runs[-1].summary()

    def hand(steps: int) -> None:
        ip.user_ns["hand_epoch"](steps)

    hand(args.steps)
    cell(args.steps)   # warm-up: traces the step
    sides = {"hand": [], "cell": [], "uncached": []}
    for _ in range(args.rounds):
        sides["hand"].append(timed(lambda: hand(args.steps)))
        sides["cell"].append(timed(lambda: cell(args.steps)))
    hits = cache.hits
    uncached_hand = []
    for _ in range(args.uncached_rounds):
        uncached_hand.append(timed(lambda: hand(args.steps)))
        cache.clear()
        sides["uncached"].append(timed(lambda: cell(args.steps)))

    print(f"{args.steps}-step cell x{args.replicas} replicas, {args.rounds} interleaved rounds "
          f"({hits} of {args.rounds} re-runs reused the trace):")
    print(f"  re-run vs hand-written epoch: CPU-time ratio "
          f"{ratio(sides['hand'], sides['cell'], 0):.3f}, wall ratio "
          f"{ratio(sides['hand'], sides['cell'], 1):.3f} (per round CPU: "
          + ", ".join(f"{h[0] / c[0]:.2f}" for h, c in zip(sides["hand"], sides["cell"],
                                                               strict=True)) + ")")
    if sides["uncached"]:
        print(f"  traced afresh every run ({args.uncached_rounds} rounds): CPU-time ratio "
              f"{ratio(uncached_hand, sides['uncached'], 0):.3f}, wall ratio "
              f"{ratio(uncached_hand, sides['uncached'], 1):.3f}")
    fixed = []
    for _ in range(7):
        h, c = timed(lambda: hand(1)), timed(lambda: cell(1))
        fixed.append((c[0] - h[0], c[1] - h[1], h[1], c[1]))
    cpu, wall = (statistics.median(f[i] for f in fixed) for i in (0, 1))
    print(f"  fixed cost per run (1-step cell - hand-written iterator + first step, median of 7):"
          f" CPU {cpu * 1e3:+.0f} ms, wall {wall * 1e3:+.0f} ms (hand-written "
          f"{statistics.median(f[2] for f in fixed) * 1e3:.0f} ms, cell "
          f"{statistics.median(f[3] for f in fixed) * 1e3:.0f} ms wall)", flush=True)


if __name__ == "__main__":
    main()
