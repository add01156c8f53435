"""Parameter-server step throughput: a `%%distribute --step` cell vs TensorFlow's tutorial loop
typed into a scope cell, on ONE cluster (2 workers, 1 parameter server, a small MLP), rounds
interleaved.

Both sides are cells a user runs under `%distribute parameter_server --workers 2 --ps 1`:

* tutorial: a scope cell that builds the per-worker dataset and iterator, defines the
  ``tf.function`` step (``strategy.run`` of the same step body), schedules it N times with
  ``coordinator.schedule(step, args=(per_worker_iterator,))`` and calls ``join()``; no per-step
  values are kept.
* nbdist: ``%%distribute --step --data long_ds --steps N`` with the same body; one row per step
  (step, worker, loss, grad norm, timings) recorded into nbdist.runs.

Each cell is timed whole (wall) and by CPU time (user+sys of this process and every process
under it: controller, engines, TensorFlow servers). steps/s = N / wall. Round 0 of each size
warms up both sides and is not counted.

    python benchmarks/ps_throughput.py [--steps 200 1000] [--rounds 3]

The coordinator's TensorFlow context cannot be undone, so everything runs in one subprocess.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETUP = """%%distribute
import numpy as np
import tensorflow as tf
import keras
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * 16, 32)).astype("float32")
y = rng.integers(0, 10, size=(GLOBAL_BATCH * 16,)).astype("int32")
long_ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH,
                                                            drop_remainder=True).repeat()
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10)])
optimizer = keras.optimizers.SGD(0.01)
loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
"""

BODY = """x, y = batch
with tf.GradientTape() as tape:
    loss = loss_object(y, model(x, training=True))
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

TUTORIAL = """%%distribute
strategy = tf.distribute.get_strategy()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

def dataset_fn(_ctx):
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH,
                                                            drop_remainder=True).repeat()

per_worker_dataset = coordinator.create_per_worker_dataset(
    lambda: strategy.distribute_datasets_from_function(dataset_fn))
per_worker_iterator = iter(per_worker_dataset)

@tf.function
def step(iterator):
    def replica_fn(batch):
""" + "".join(f"        {line}\n" for line in BODY.splitlines()) + """        return loss
    return strategy.run(replica_fn, args=(next(iterator),))

for _ in range({steps}):
    coordinator.schedule(step, args=(per_worker_iterator,))
coordinator.join()
"""

STEP_CELL = "%%distribute --step --data long_ds --steps {steps}\n" + BODY


def cpu_seconds(seen: dict[int, float]) -> float:
    """User+sys CPU of this process and all its descendants (each pid's latest reading)."""
    import psutil

    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            seen[proc.pid] = t.user + t.system
    return sum(seen.values())


def breakdown(before: dict[int, float], after: dict[int, float], roles: dict[int, str]) -> str:
    """CPU seconds per role (kernel, worker 0, ps 0, controller...) between two readings."""
    per: dict[str, float] = {}
    for pid, total in after.items():
        role = roles.get(pid, "other")
        per[role] = per.get(role, 0.0) + total - before.get(pid, 0.0)
    return ", ".join(f"{k} {v:.2f}" for k, v in sorted(per.items()) if v >= 0.01)


def roles_of_processes() -> dict[int, str]:
    from nbdist.cluster.paramserver.backend import live_ps_clusters

    roles = {os.getpid(): "kernel"}
    for cluster in live_ps_clusters():
        for (job, index), info in cluster.info.items():
            roles[info["pid"]] = f"{job} {index}"
    return roles


def session(sizes: list[int], rounds: int, profile: bool) -> dict:
    from common import ipython_shell

    import nbdist

    seen: dict[int, float] = {}
    sink = io.StringIO()
    results: dict = {str(n): {"tutorial": [], "nbdist": []} for n in sizes}
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        shell = ipython_shell()
        shell.run_line_magic("load_ext", "nbdist")
        shell.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")

        def timed(code: str) -> tuple[float, float]:
            c0, w0 = cpu_seconds(seen), time.perf_counter()
            before = dict(seen)
            if profile:
                import cProfile
                import pstats

                with cProfile.Profile() as prof:
                    shell.run_cell(code, store_history=False).raise_error()
                stats = pstats.Stats(prof, stream=sys.__stderr__)
                stats.sort_stats("cumtime").print_stats(25)   # the cell's phases
                stats.sort_stats("tottime").print_stats(15)   # where the kernel's CPU goes
            else:
                shell.run_cell(code, store_history=False).raise_error()
            wall, cpu = time.perf_counter() - w0, cpu_seconds(seen) - c0
            if profile:
                print("  CPU s by process:", breakdown(before, seen, roles_of_processes()),
                      file=sys.__stderr__, flush=True)
            return wall, cpu

        shell.run_cell(SETUP, store_history=False).raise_error()
        for r in range(rounds + 1):
            for n in sizes:
                sides = [("tutorial", TUTORIAL), ("nbdist", STEP_CELL)]
                if r % 2:
                    sides.reverse()
                for name, template in sides:
                    wall, cpu = timed(template.format(steps=n))
                    if name == "nbdist":
                        rows = len(nbdist.runs[-1].metrics)
                        assert rows == n, f"{rows} rows for {n} steps"
                    if r:
                        results[str(n)][name].append({"wall": wall, "cpu": cpu})
                    print(f"round {r} n={n} {name}: {wall:.2f} s wall, {cpu:.2f} s cpu",
                          file=sys.__stderr__, flush=True)
        shell.run_line_magic("distribute", "stop")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="print CPU per process and the kernel's main-thread profile")
    parser.add_argument("--session", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.session:
        print("RESULT " + json.dumps(session(args.steps, args.rounds, args.profile)), flush=True)
        os._exit(0)    # the coordinator's threads would keep a normal exit waiting
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, __file__, "--session", "--rounds", str(args.rounds),
               "--steps", *map(str, args.steps)] + (["--profile"] if args.profile else [])
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, timeout=3600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"the session failed:\n{done.stdout[-3000:]}")
    results = json.loads(lines[-1][len("RESULT "):])
    for n, sides in results.items():
        steps = int(n)
        tut, nb = sides["tutorial"], sides["nbdist"]
        wall = [t["wall"] / b["wall"] for t, b in zip(tut, nb, strict=True)]
        cpu = [b["cpu"] / t["cpu"] for t, b in zip(tut, nb, strict=True)]
        print(f"{steps} steps per round, {len(tut)} rounds: tutorial "
              f"{statistics.median(steps / t['wall'] for t in tut):.0f} steps/s, nbdist "
              f"{statistics.median(steps / b['wall'] for b in nb):.0f} steps/s; "
              f"throughput ratio nbdist/tutorial {statistics.median(wall):.2f} "
              f"(min {min(wall):.2f}, max {max(wall):.2f}); CPU per step tutorial/nbdist "
              f"{1 / statistics.median(cpu):.2f} (goal >= 0.95 for both)")


if __name__ == "__main__":
    main()
