"""The finished run's static figure (what a cell leaves in the notebook) from a long Run.

Builds Runs of ``--rows`` synthetic rows (64 workers x 8 replicas: the aggregate views; 8
replicas: one line each) and times ``static_bundle`` (plotly JSON + SVG + text), CPU time
(user+sys) and wall, beside the goal (1 s), with the bundle's size (the notebook stays small).
plotly is imported first, as the dashboard does while the first step is traced.

    python benchmarks/static_figure.py [--rows 1500000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbdist.telemetry.rows import COLUMNS  # noqa: E402
from nbdist.telemetry.rows import POSITION as COL  # noqa: E402
from nbdist.telemetry.run import Run, RunWriter  # noqa: E402
from nbdist.widgets.static import FIGURE_MIME, static_bundle  # noqa: E402


def synthetic(workers: int, replicas: int, rows: int) -> Run:
    keys = workers * replicas
    steps = rows // keys
    run = Run(id=1, mode="step", strategy="multiworker" if workers > 1 else "mirrored",
              replicas=replicas, workers=workers, total_steps=steps)
    rng = np.random.default_rng(0)
    per_block = max(1, 100_000 // keys)
    for first in range(0, steps, per_block):
        step = np.arange(first, min(steps, first + per_block))
        n = len(step) * keys
        block = np.full((n, len(COLUMNS)), np.nan)
        block[:, COL.step] = np.repeat(step, keys)
        block[:, COL.epoch] = 0
        block[:, COL.worker] = np.tile(np.repeat(np.arange(workers), replicas), len(step))
        block[:, COL.replica] = np.tile(np.arange(replicas), len(step) * workers)
        block[:, COL.loss] = 1 / (1 + block[:, COL.step]) + rng.normal(0, 0.01, n)
        block[:, COL.grad_norm] = 1 + rng.normal(0, 0.1, n)
        block[:, COL.allreduce_ms] = 2 + rng.exponential(0.5, n)
        block[:, COL.compute_ms] = 15 + rng.exponential(1.0, n)
        block[:, COL.other_collective_ms] = 0.0
        block[:, COL.step_ms] = 20.0
        block[:, COL.wall_time] = 1.7e9 + block[:, COL.step] * 0.02
        RunWriter(run).append_block(block)
    RunWriter(run).finish("done")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import plotly.graph_objects  # noqa: F401 - the dashboard imports it ahead (prewarm)
    import plotly.io  # noqa: F401

    static_bundle(synthetic(1, 2, 1000))          # first-call costs (template) out of the way
    for workers, replicas in ((64, 8), (1, 8)):
        run = synthetic(workers, replicas, args.rows)
        for _ in range(args.repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            bundle = static_bundle(run)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            size = len(json.dumps(bundle[FIGURE_MIME])) + len(bundle["image/svg+xml"])
            print(f"{workers:2d} x {replicas} replicas, {run.n_rows:,} rows: CPU {cpu:.2f} s "
                  f"({cpu:.2f}x the 1 s goal), wall {wall:.2f} s; bundle {size / 1e3:.0f} kB",
                  flush=True)


if __name__ == "__main__":
    main()
