"""A day of training cells on worker processes: threads, file descriptors and memory of every
process (the kernel, the ipyparallel controller, each worker and parameter server) while the
same kinds of cell run again and again.

For each strategy, a fresh IPython shell (the kind a Jupyter kernel runs) starts the cluster,
then runs ``--cells`` training cells in turn:

- ``multiworker --workers 2``: a ``--step`` cell and a hand-written custom loop in a scope
  cell (``strategy.experimental_distribute_dataset`` + ``strategy.run``), ``--steps`` each;
- ``parameter_server --workers 2 --ps 1``: a ``--step`` cell and a scope cell that schedules
  the same step with ``ClusterCoordinator.schedule`` by hand over a new per-worker dataset,
  ``--steps`` each (the step's tf.function is defined once, in the setup cell).

``--kinds step`` or ``--kinds scope`` runs one kind only.

Every ``--every`` cells it prints each process's thread count, open file descriptors and RSS;
at the end, the change from the first three probes after the first ``--every`` cells (the
warm-up) to the last three, as medians. Goal: threads and fds grow by at most 5 on every
process.

    python benchmarks/soak_cluster.py [--cells 60] [--steps 50] [--every 10]
                                      [--strategies multiworker,parameter_server]
                                      [--kinds step,scope]
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


# After tests/ps_scenario.SETUP (data, a linear model): the tutorial's coordinator and its
# train function, defined once
PS_TRAIN = """%%distribute
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
@tf.function
def train(it):
    def step(b):
        x, y = b
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        g = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(g, model.trainable_variables))
        return loss
    return strategy.run(step, args=(next(it),))
"""
# TensorFlow's parameter-server tutorial loop, typed into a scope cell; its tf.function is
# defined once (PS_TRAIN), as in the tutorial: each new tf.function a coordinator runs keeps a
# thread on every worker for as long as the process lives (TensorFlow 2.21, plain scripts too)
PS_SCOPE_LOOP = """%%distribute
def dataset_fn():
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(32, drop_remainder=True).repeat()
per_worker_it = iter(coordinator.create_per_worker_dataset(dataset_fn))
for _ in range({steps}):
    coordinator.schedule(train, args=(per_worker_it,))
coordinator.join()
"""


def child(strategy: str, cells: int, steps: int, every: int, only: str) -> None:
    sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]
    import psutil
    from cluster_cells import SCOPE_LOOP, SETUP, STEP
    from common import ipython_shell, ok

    from nbdist.session import current_session

    ip = ipython_shell()
    ok(ip, "%load_ext nbdist")
    if strategy == "multiworker":
        ok(ip, "%distribute multiworker --workers 2")
        ok(ip, SETUP)
        kinds = [STEP.format(data="long_ds", flags=f"--steps {steps}"),
                 SCOPE_LOOP.format(steps=steps)]
    else:
        from ps_scenario import SETUP as PS_SETUP
        from ps_scenario import STEP as PS_STEP

        ok(ip, "%distribute parameter_server --workers 2 --ps 1")
        ok(ip, PS_SETUP)
        ok(ip, PS_TRAIN)
        kinds = [PS_STEP.format(data="long_ds", flags=f"--steps {steps}"),
                 PS_SCOPE_LOOP.format(steps=steps)]
    kinds = [k for k, name in zip(kinds, ("step", "scope"), strict=True) if name in only]

    def probe(done: int) -> None:
        procs = [psutil.Process(), *current_session().backend.processes()]
        rows = []
        for p in procs:
            try:
                line = " ".join(p.cmdline())
                name = ("kernel" if p.pid == os.getpid() else
                        "controller" if "controller" in line else "engine") + f" {p.pid}"
                rows.append([p.pid, name, p.num_threads(), p.num_fds(),
                             round(p.memory_info().rss / 2**20, 1)])
            except psutil.NoSuchProcess:
                continue
        print("PROBE " + json.dumps({"cells": done, "procs": rows}), flush=True)

    probe(0)
    started = time.perf_counter()
    for i in range(1, cells + 1):
        ok(ip, kinds[i % len(kinds)])
        if i % every == 0 or i == cells:
            probe(i)
    print("SECONDS " + json.dumps(time.perf_counter() - started), flush=True)
    ok(ip, "%distribute stop")


def run(strategy: str, args: argparse.Namespace) -> bool:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, __file__, "--child", strategy, "--cells", str(args.cells),
               "--steps", str(args.steps), "--every", str(args.every), "--kinds", args.kinds]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    probes = [json.loads(line[6:]) for line in proc.stdout.splitlines()
              if line.startswith("PROBE ")]
    if proc.returncode or not probes:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        raise SystemExit(f"{strategy}: the soak failed (exit {proc.returncode})")
    print(f"\n{strategy}: {args.cells} training cells ({args.kinds}) of {args.steps} steps")
    print("cells  " + "  ".join(f"{row[1]:>17}" for row in probes[0]["procs"]))
    print("       " + "  ".join(f"{'threads fds   MB':>17}" for _ in probes[0]["procs"]))
    for probe in probes:
        print(f"{probe['cells']:>5}  " + "  ".join(f"{t:>7} {f:>3} {m:>5.0f}"
                                                   for _, _, t, f, m in probe["procs"]))
    # TensorFlow's pools start and end threads as they go: compare the median of the first
    # three probes after the warm-up with that of the last three (a leak only grows)
    after = [p for p in probes if p["cells"] >= args.every] or probes
    first, last = after[:3], after[-3:]
    flat = True
    for pid, name, *_ in after[0]["procs"]:
        def median(group, column, pid=pid):
            values = [row[column] for p in group for row in p["procs"] if row[0] == pid]
            return statistics.median(values) if values else None

        if median(last, 2) is None:
            print(f"  {name}: ended during the soak")
            flat = False
            continue
        (t0, t1), (f0, f1), (m0, m1) = ((median(first, c), median(last, c)) for c in (2, 3, 4))
        ok = t1 - t0 <= 5 and f1 - f0 <= 5
        flat &= ok
        print(f"  {name}: cells {first[0]['cells']}..{first[-1]['cells']} -> "
              f"{last[0]['cells']}..{last[-1]['cells']} (medians): threads {t0:g} -> {t1:g}, "
              f"fds {f0:g} -> {f1:g}, RSS {m0:.0f} -> {m1:.0f} MB ({m1 - m0:+.1f})"
              + ("" if ok else "  GREW"))
    return flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=60)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--strategies", default="multiworker,parameter_server")
    parser.add_argument("--kinds", default="step,scope",
                        help="which cells take turns: step, scope or both")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.cells, args.steps, args.every, args.kinds)
        return
    results = {s: run(s, args) for s in args.strategies.split(",")}
    print("\n" + ", ".join(f"{s}: {'flat' if ok else 'NOT flat'}" for s, ok in results.items()))
    if not all(results.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
