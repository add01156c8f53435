"""Timing attribution with BatchNormalization vs SyncBatchNormalization, side by side.

The same small conv net (two Conv2D + BatchNormalization blocks, a Dense head: the scenario of
tests/test_timing.py, in tests/bn_scenario.py) trained by the same ``%%distribute --step`` cell
under ``%distribute mirrored --devices 2``, once with ``BatchNormalization()`` and once with
``BatchNormalization(synchronized=True)``, every step timed (``--timing-every 1``).
SyncBatchNormalization all-reduces each layer's batch statistics in the forward pass (and
their gradients in the backward pass) before the optimizer all-reduces the gradients. Printed
per variant, medians over the steps after the first ``WARMUP`` of each round (per replica):
compute_ms, wait_ms, allreduce_ms (the gradient all-reduce), other_collective_ms (every other
collective of the step), step_ms, and the bus bandwidth of the gradient all-reduce
(``Run.allreduce_bytes`` over the slowest replica's allreduce_ms). The two variants alternate
round by round (this machine is shared: read the spread over rounds).

    python benchmarks/syncbn.py [--rounds 3] [--steps 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from bn_scenario import BUILD, SETUP, STEP  # noqa: E402  (the same cells as the tests)
from common import nbdist_shell, ok  # noqa: E402

WARMUP = 10
COLUMNS = ("compute_ms", "wait_ms", "allreduce_ms", "other_collective_ms", "step_ms")


def one_round(ip, synchronized: bool, steps: int) -> dict[str, float]:
    import nbdist
    from nbdist.widgets.series import bus_bandwidth

    ok(ip, BUILD.format(synchronized=synchronized))
    ok(ip, STEP.format(data="bench_ds", flags=f"--steps {steps} --timing-every 1"))
    run = nbdist.runs[-1]
    frame = run.metrics
    frame = frame[frame["step"] >= WARMUP]
    out = {c: float(frame[c].median()) if c in frame else float("nan") for c in COLUMNS}
    slowest = frame.groupby("step")["allreduce_ms"].max().median() / 1e3
    out["bus_GBps"] = bus_bandwidth(run.allreduce_bytes or 0, run.replicas, slowest) / 1e9
    out["bytes"] = float(run.allreduce_bytes or 0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    ip = nbdist_shell("mirrored --devices 2")
    ok(ip, SETUP)
    ok(ip, "bench_ds = bn_ds.repeat()")
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for synchronized in (False, True):
            results[synchronized].append(one_round(ip, synchronized, args.steps))
        print(f"round {r + 1}: " + "; ".join(
            f"{'SyncBN' if s else 'BN'} " + ", ".join(
                f"{k} {v[-1][k]:.3g}" for k in (*COLUMNS, "bus_GBps"))
            for s, v in results.items()), flush=True)
    print(f"\nmedians over {args.rounds} round(s), {args.steps - WARMUP} timed steps each, "
          "2 replicas (per replica):")
    print(f"{'':22s}{'BatchNorm':>12s}{'SyncBatchNorm':>15s}")
    for key in (*COLUMNS, "bus_GBps", "bytes"):
        bn, sync = (statistics.median(v[key] for v in results[s]) for s in (False, True))
        print(f"{key:22s}{bn:12.3f}{sync:15.3f}")


if __name__ == "__main__":
    main()
