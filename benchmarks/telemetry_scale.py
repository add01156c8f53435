"""Telemetry at scale: 64 workers x 8 replicas at 50 steps/s into one kernel-side Run.

Synthetic workers (no TensorFlow) in separate sender processes record their steps in a
worker-side ``Run`` and forward them with the real ``Forwarder`` over the real signed channel;
this process plays the kernel: a real ``ChannelServer`` feeding a real ``ClusterMonitor``.
It prints, side by side with the goals:

- rows expected vs received (goal: 0 dropped), and the channel's/senders' drop counters;
- the kernel's CPU time (all its threads, user+sys) as a share of one core (goal <= 10%);
- the memory of a Run holding 10^6 rows, measured with tracemalloc (goal <= 200 MB), and the
  rows' own bytes (13 float64 columns) beside it.

    python benchmarks/telemetry_scale.py [--workers 64] [--replicas 8] [--rate 50] [--seconds 60]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbdist.cluster.inengine.runs import Forwarder  # noqa: E402
from nbdist.cluster.multiworker.monitor import ClusterMonitor  # noqa: E402
from nbdist.telemetry import channel as ch  # noqa: E402
from nbdist.telemetry.rows import COLUMNS  # noqa: E402
from nbdist.telemetry.run import Run, RunList, RunWriter  # noqa: E402


class _Worker:
    """What ``Forwarder`` needs of a worker's state: its channel and step counter."""

    def __init__(self, channel: ch.ChannelClient):
        self.channel, self.step = channel, 0


def sender(address, key, first, count, replicas, rate, seconds, result) -> None:
    """Workers ``first .. first+count-1``: one step each per 1/rate s, rows forwarded."""
    workers = []
    for w in range(first, first + count):
        client = ch.ChannelClient(address, key, w, max_queue=10000)
        run = Run(id=1, mode="step", strategy="multiworker", replicas=replicas)
        forward = Forwarder(_Worker(client), "bench")
        client.send({"type": "run_start", "run": "bench", "mode": "step"})
        workers.append((client, run, forward))
    t0 = time.perf_counter()
    steps = int(rate * seconds)
    for step in range(steps):
        delay = t0 + step / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        for _, run, forward in workers:
            RunWriter(run).record_step(
                step, 0, loss=[0.5 + 0.01 * r for r in range(replicas)], step_ms=20.0,
                grad_norm=[1.0] * replicas, allreduce_ms=[2.0] * replicas, wait_ms=[0.1] * replicas,
                compute_ms=[15.0] * replicas, other_collective_ms=[0.0] * replicas, data_ms=0.5)
            forward.on_step(run)
    dropped = 0
    for client, run, forward in workers:
        forward.flush(run)
        client.flush(10.0)
        dropped += sum(client.dropped.values())
        client.close()
    result.put((steps * replicas * count, dropped, time.perf_counter() - t0))


def stream(args) -> None:
    key = ch.new_key()
    runs = RunList()
    kernel_run = runs.new(mode="step", strategy="multiworker", replicas=args.replicas,
                          workers=args.workers)
    monitor = ClusterMonitor(args.workers, lambda w, m: True, lambda: runs.new(
        mode="fit", strategy="multiworker", replicas=1, workers=args.workers))
    monitor.expect_run("bench", kernel_run)
    server = ch.ChannelServer(key, monitor.handle)
    result: mp.Queue = mp.Queue()
    per = max(1, args.workers // args.processes)
    procs = [mp.Process(target=sender, args=(server.address, key, first,
                                             min(per, args.workers - first), args.replicas,
                                             args.rate, args.seconds, result))
             for first in range(0, args.workers, per)]
    cpu0, wall0 = os.times(), time.perf_counter()
    for p in procs:
        p.start()
    sent = [result.get(timeout=args.seconds * 4 + 120) for _ in procs]
    for p in procs:
        p.join()
    deadline = time.monotonic() + 10
    expected = sum(s[0] for s in sent)
    while kernel_run.n_rows < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    cpu1, wall = os.times(), time.perf_counter() - wall0
    server.close()
    kernel_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    received = kernel_run.n_rows
    print(f"{args.workers} workers x {args.replicas} replicas at {args.rate} steps/s for "
          f"{args.seconds:.0f} s ({expected / args.seconds:,.0f} rows/s sent)")
    print(f"rows: sent {expected:,}, in the kernel's Run {received:,}, dropped "
          f"{expected - received:,} (goal 0); channel drops {dict(server.dropped)}, "
          f"sender queue drops {sum(s[1] for s in sent)}, bad row messages "
          f"{monitor.bad_rows}")
    print(f"kernel CPU: {kernel_cpu:.2f} s in {wall:.1f} s wall = "
          f"{100 * kernel_cpu / wall:.1f}% of a core (goal <= 10%)")


def run_memory(rows: int, replicas: int, workers: int) -> None:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    run = Run(id=1, mode="step", strategy="multiworker", replicas=replicas, workers=workers)
    per_step = replicas
    for step in range(rows // (per_step * workers)):
        for w in range(workers):
            RunWriter(run).record_step(step, 0, loss=[0.5] * per_step, step_ms=20.0,
                                       grad_norm=[1.0] * per_step, allreduce_ms=[2.0] * per_step,
                                       wait_ms=[0.1] * per_step, compute_ms=[15.0] * per_step,
                                       other_collective_ms=[0.0] * per_step, data_ms=0.5, worker=w)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    own = run.n_rows * len(COLUMNS) * 8
    print(f"Run memory for {run.n_rows:,} rows: {used / 2**20:.0f} MB (goal <= 200 MB); "
          f"the rows' own bytes {own / 2**20:.0f} MB; ratio {used / own:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=4, help="sender processes")
    parser.add_argument("--memory-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    stream(args)
    run_memory(args.memory_rows, args.replicas, args.workers)


if __name__ == "__main__":
    main()
