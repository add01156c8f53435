"""What `--checkpoint-every K` costs a step cell: the save's own time against the steps'.

The tiny MLP of benchmarks/overhead.py on ``mirrored`` (2 logical CPU devices by default),
one epoch of ``--steps`` steps, through a real IPython shell. ``--rounds`` interleaved rounds
of three cells: no checkpoint, ``--checkpoint DIR`` (one save, at the epoch's end) and
``--checkpoint DIR --checkpoint-every K``. Each save is timed where it happens
(``StepCheckpoint.save`` wrapped by this script). Printed: the median step (the Run's
``step_ms``), the median save and the first save of each run (it traces TensorFlow's save
function), the cells' median wall times, and the extra wall time per extra save: (every-K cell
- epoch-only cell) / saves, to compare with the save's own time (the loop waits for the write
and nothing else when the two match).

    python benchmarks/checkpoint_every.py [--rounds 5] [--steps 400] [--every 50]
                                          [--replicas 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import mlp_on_strategy, nbdist_shell, ok  # noqa: E402
from overhead import SETUP, STEP_BODY  # noqa: E402  (the same model and step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    import nbdist
    from nbdist.checkpoint import StepCheckpoint

    saves: list[float] = []
    save = StepCheckpoint.save

    def timed_save(self, *a, **k):
        started = time.perf_counter()
        save(self, *a, **k)
        saves.append((time.perf_counter() - started) * 1e3)

    StepCheckpoint.save = timed_save
    ip = nbdist_shell(f"mirrored --devices {args.replicas}")
    ok(ip, SETUP)
    mlp_on_strategy(ip, args.steps)
    scratch = tempfile.mkdtemp(prefix="nbdist-bench-ckpt-")
    sides = {"none": "", "epoch": "--checkpoint {d}",
             "every": f"--checkpoint {{d}} --checkpoint-every {args.every}"}
    walls: dict[str, list[float]] = {name: [] for name in sides}
    steps_ms, first_saves, later_saves, counts = [], [], [], []
    for n in range(args.rounds + 1):   # the first round traces: not counted
        for name, flags in sides.items():
            saves.clear()
            started = time.perf_counter()
            ok(ip, f"%%distribute --step --data train_ds {flags.format(d=f'{scratch}/{n}{name}')}"
                   f"\n{STEP_BODY}")
            wall = time.perf_counter() - started
            run = nbdist.runs[-1]
            assert run.steps_done == args.steps, run.summary()
            if n == 0:
                continue
            walls[name].append(wall)
            if name == "every":
                steps_ms.append(statistics.median(run.metrics.groupby("step")["step_ms"].max()))
                first_saves.append(saves[0])
                later_saves += saves[1:]
                counts.append(len(saves))
    med = {name: statistics.median(w) for name, w in walls.items()}
    extra = (med["every"] - med["epoch"]) / max(1, statistics.median(counts) - 1)
    print(f"{args.steps} steps x{args.replicas} replicas, --checkpoint-every {args.every} "
          f"({statistics.median(counts):.0f} saves a run), {args.rounds} interleaved rounds:")
    print(f"  step {statistics.median(steps_ms):.2f} ms; save {statistics.median(later_saves):.1f}"
          f" ms (first of a run {statistics.median(first_saves):.1f} ms)")
    print(f"  cell wall: no checkpoint {med['none']:.2f} s, epoch only {med['epoch']:.2f} s, "
          f"every {args.every} {med['every']:.2f} s; extra wall per extra save {extra * 1e3:.1f} "
          "ms", flush=True)


if __name__ == "__main__":
    main()
