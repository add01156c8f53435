"""What one ``--elastic`` restart costs under `%distribute multiworker --workers 2`.

Each round, on the same 2 local workers (a journal of a data and model cell, a push and a
cell using it): the step cell of the cluster tests (2 epochs of 8 steps, epoch checkpoints,
``--elastic``) runs once without a fault and once with `%distribute inject kill 1
--at-step 11` (mid epoch 2), alternating which goes first. For the killed run: the restart's
seconds as ``Run.restarts`` splits them (start: fresh workers and their strategy; replay: the
journal's cells and pushes; restore: from calling the cell again to its first step after the
checkpoint) and the cell's extra wall time over the run without a fault (which adds finding the
death, ~3 s, and training the lost steps again). Medians, min and max over the rounds, with the
machine's load average.

    python benchmarks/elastic_restart.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import cluster_cells  # noqa: E402
from common import nbdist_shell, ok  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# the cells of the cluster tests (tests/cluster_cells.py): data, a linear model, the step
STEP = cluster_cells.STEP.format(data="ds", flags="--epochs 2 --checkpoint {ckpt} --elastic")


def one(ip, killed: bool) -> tuple[float, object]:
    """(wall seconds of the step cell, its Run)."""
    import nbdist

    if killed:
        ip.run_line_magic("distribute", "inject kill 1 --at-step 11")
    ckpt = tempfile.mkdtemp(prefix="nbdist-bench-elastic-")
    began = time.perf_counter()
    ok(ip, STEP.format(ckpt=ckpt))
    return time.perf_counter() - began, nbdist.runs[-1]


def spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"
            if values else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ip = nbdist_shell("multiworker --workers 2")
    ok(ip, cluster_cells.SETUP)
    ip.user_ns["learning_rate"] = 0.05
    ip.run_line_magic("distribute", "push learning_rate")
    ok(ip, "%%distribute\noptimizer.learning_rate.assign(learning_rate)\n")
    parts: dict[str, list[float]] = {"start": [], "replay": [], "restore": [], "lost": [],
                                     "extra": []}
    replayed = set()
    try:
        for i in range(args.repeat):
            order = (False, True) if i % 2 == 0 else (True, False)
            walls = {}
            for killed in order:
                walls[killed], run = one(ip, killed)
                if killed:
                    [restart] = run.restarts
                    parts["start"].append(restart.start_s)
                    parts["replay"].append(restart.replay_s)
                    parts["restore"].append(restart.restore_s)
                    parts["lost"].append(restart.seconds)
                    replayed.add(restart.replayed)
            parts["extra"].append(walls[True] - walls[False])
    finally:
        ip.run_line_magic("distribute", "stop")
    print(f"--elastic restart of 2 local workers, {args.repeat} rounds, journal of "
          f"{'/'.join(map(str, sorted(replayed)))} entries; median (min-max):")
    for name, label in (("start", "start (fresh workers)"), ("replay", "replay (journal)"),
                        ("restore", "restore (to the first step)"),
                        ("lost", "lost (start + replay + restore)"),
                        ("extra", "extra wall time of the cell")):
        print(f"  {label:<34} {spread(parts[name])}")
    print(f"  load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
