"""CPU and wall per step of a multiworker all-reduce step cell: before/after nbdist.allocator,
beside a hand-written MultiWorkerMirroredStrategy loop, in one run.

A local 2-worker cluster (``%distribute multiworker --workers 2``) runs the step cell of
``allreduce_ring.py`` (``ctx.all_reduce`` of a float32 tensor, ``--timing-every 1``); two
hand-written workers (``allreduce_ring.py --hand-worker``, no dataset) run the same
all-reduce. Per size, three sides, interleaved:

* before: TensorFlow's allocator setting left alone (``nbdist.allocator.enabled = False`` on
  the workers, glibc's mmap threshold set back to the 128 KiB TensorFlow's iterator sets and
  the trim threshold to glibc's default 128 KiB);
* after: nbdist as it is (``enabled = True``);
* hand: the hand-written loop.

``step ms``: the median time of a step inside the runs (nbdist's ``step_ms`` rows, the
slowest worker's; hand: from one step's start to the next, the slowest worker's). Each side
runs cells of ``SHORT`` and ``LONG`` steps (twice each, after a traced warm-up):
the per-step cost is the slope between them, so the cell's fixed cost (prepare, iterator,
summary) is left out and printed apart. CPU is user+sys of every process (the kernel, the
controller, the engines, the hand-written workers) in ms per step.

    python3 benchmarks/mw_step_cost.py [--sizes 1K,1M,4M]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import allreduce_ring as ring  # noqa: E402 - the same step cell and hand-written worker

SHORT, LONG = 10, 40
SET_SIDE = """%%distribute
import ctypes as _ctypes
import nbdist.allocator as _allocator
_allocator.enabled = {reuse}
if not {reuse}:   # TensorFlow's 128 KiB mmap threshold, glibc's default trim threshold
    _ctypes.CDLL(None).mallopt(-3, 128 * 1024)
    _ctypes.CDLL(None).mallopt(-1, 128 * 1024)
"""


def hand_workers(n: int) -> list[subprocess.Popen]:
    from nbdist.cluster import tfconfig

    addresses = [f"127.0.0.1:{port}" for port in tfconfig.free_ports(n)]
    procs = []
    for i in range(n):
        config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "benchmarks", "allreduce_ring.py"),
             "--hand-worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, TF_CONFIG=json.dumps(config), PYTHONPATH=ROOT)))
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a hand-written worker did not start")
    return procs


def hand_steps(procs: list[subprocess.Popen], elements: int, steps: int) -> list[float]:
    """Runs the steps; ms from one step's start to the next's (the slowest worker's)."""
    for proc in procs:
        proc.stdin.write(f"{elements} {steps}\n")
        proc.stdin.flush()
    starts = [[t0 for t0, _ in json.loads(proc.stdout.readline())] for proc in procs]
    return [max(w[i + 1] - w[i] for w in starts) * 1e3 for i in range(steps - 1)]


def nbdist_steps(shell, elements: int, steps: int) -> list[float]:
    """Runs the step cell; its ``step_ms`` rows (the slowest worker's per step)."""
    import nbdist

    ring._cell(shell, ring.STEP.format(elements=elements, steps=steps))
    return nbdist.runs[-1].metrics.groupby("step").step_ms.max().tolist()


class Side:
    def __init__(self, name: str, run):
        self.name, self.run, self.samples = name, run, {SHORT: [], LONG: []}
        self.step_ms: list[float] = []

    def measure(self, steps: int) -> None:
        cpu, wall = ring._cpu_seconds(), time.perf_counter()
        step_ms = self.run(steps)
        self.samples[steps].append((time.perf_counter() - wall, ring._cpu_seconds() - cpu))
        self.step_ms += step_ms[ring.WARMUP:]

    def per_step(self) -> tuple[float, float, float, float]:
        """ms per step (wall, CPU) from the slope, and the fixed cost per cell (wall, CPU)."""
        mean = {n: [sum(x[i] for x in s) / len(s) for i in (0, 1)]
                for n, s in self.samples.items()}
        slope = [(mean[LONG][i] - mean[SHORT][i]) / (LONG - SHORT) * 1e3 for i in (0, 1)]
        fixed = [mean[SHORT][i] * 1e3 - SHORT * slope[i] for i in (0, 1)]
        return slope[0], slope[1], fixed[0], fixed[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1K,1M,4M")
    args = parser.parse_args()
    sizes = [ring.parse_size(s) for s in args.sizes.split(",")]
    from common import ipython_shell

    shell = ipython_shell()
    shell.run_line_magic("load_ext", "nbdist")
    shell.run_line_magic("distribute", "multiworker --workers 2")
    hand = []
    lines = []
    header = (f"{'bytes':>8} {'side':>6} {'step ms':>7} {'wall/step':>9} {'cpu/step':>8} "
              f"{'cpu/hand':>8} {'fixed wall':>10} {'fixed cpu':>9}   (ms; step ms: median "
              f"in-run step; per step: slope {SHORT}->{LONG} steps)")
    try:
        ring._cell(shell, ring.SETUP)
        hand = hand_workers(2)
        print(f"machine load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n{header}",
              flush=True)
        for nbytes in sizes:
            elements = nbytes // 4

            def nbdist_side(reuse: bool, elements: int = elements):
                def run(n_steps: int) -> None:
                    ring._cell(shell, SET_SIDE.format(reuse=reuse))
                    return nbdist_steps(shell, elements, n_steps)
                return run

            sides = [Side("before", nbdist_side(False)), Side("after", nbdist_side(True)),
                     Side("hand", lambda n_steps, e=elements: hand_steps(hand, e, n_steps))]
            for side in sides:
                side.run(3)   # trace (an unchanged step cell reuses its trace)
            for count in (SHORT, LONG, SHORT, LONG):
                for side in sides:
                    side.measure(count)
            hand_cpu = sides[2].per_step()[1]
            for side in sides:
                wall, cpu, fixed_wall, fixed_cpu = side.per_step()
                median = statistics.median(side.step_ms)
                lines.append(f"{nbytes:>8} {side.name:>6} {median:>7.2f} {wall:>9.2f} {cpu:>8.2f} "
                             f"{cpu / hand_cpu:>8.2f} {fixed_wall:>10.0f} {fixed_cpu:>9.0f}")
                print(lines[-1], flush=True)
    finally:
        for proc in hand:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(10)
        shell.run_line_magic("distribute", "stop")
    print(f"\n{header}\n" + "\n".join(lines))
    print(f"(machine load {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
