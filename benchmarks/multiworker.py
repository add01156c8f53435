"""`%distribute multiworker` against the same job hand-written as a bare 2-process script.

Three numbers, each against its hand-written twin (same model, data, batch, strategy options,
tf_keras on both sides):

* cold start: from launching the process(es) to the end of the first training step of a
  2-worker job. nbdist: a fresh IPython shell runs ``%load_ext nbdist``, ``%distribute
  multiworker --workers 2``, a setup cell and a one-step ``%%distribute --step`` cell. Bare: two
  Python processes with TF_CONFIG that build MultiWorkerMirroredStrategy, the model and run
  one step. Ratio nbdist / bare (goal <= 1.2).
* warm dispatch: median wall time of a trivial ``%%distribute`` cell (``pass``) on the 2
  workers (goal <= 0.2 s).
* steady-state step throughput: steps/s of ``%%distribute --step`` (telemetry on: loss and
  gradient norm per replica every step, allreduce timing every 10th step, metrics streamed to
  the kernel) vs the hand-written ``strategy.run`` loop that fetches the per-replica loss every
  step. Ratio nbdist / bare (goal >= 0.97). Each side: the best of SEGMENTS runs, each
  without its first WARMUP steps (tracing).

    python benchmarks/multiworker.py [--steps 400] [--dispatch 20] [--rounds 2]

The machine is shared: run it when it is quiet, and read the spread over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from overhead import STEP_BODY, define_step_fn  # the same step in both benchmarks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARMUP = 20
SEGMENTS = 2          # throughput: best of this many runs of --steps, on each side
GLOBAL_BATCH = 64

SETUP = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * 16, 32)).astype("float32")
y = rng.integers(0, 10, size=(GLOBAL_BATCH * 16,)).astype("int32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)
long_ds = ds.repeat()
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(10)])
optimizer = tf.keras.optimizers.SGD(0.01)
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
"""



# -- the hand-written twin: one of two worker processes -------------------------------------
def bare_worker(index: int, ports: str, t0: float, steps: int, out: str) -> None:
    addresses = [f"127.0.0.1:{p}" for p in ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()   # as TensorFlow's tutorials
    ns: dict = {}
    with strategy.scope():
        exec(SETUP, ns)  # noqa: S102 - the benchmark's own setup code
    step_fn = define_step_fn(ns)

    @tf.function
    def train_step(dist_batch):
        out = strategy.run(step_fn, args=(dist_batch,))
        return tf.stack(strategy.experimental_local_results(out))

    it = iter(strategy.experimental_distribute_dataset(ns["long_ds"]))
    train_step(next(it)).numpy()
    first = time.time() - t0
    rates = []
    for _ in range(SEGMENTS):
        stamps = []
        for _ in range(steps):
            train_step(next(it)).numpy()
            stamps.append(time.time())
        rates.append((len(stamps) - WARMUP - 1) / (stamps[-1] - stamps[WARMUP]))
    with open(out, "w") as f:
        json.dump({"first_step_s": first, "steps_per_s": max(rates)}, f)
    os._exit(0)   # skip TensorFlow's exit barrier, as nbdist's workers do


def run_bare(steps: int) -> dict:
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = ",".join(str(s.getsockname()[1]) for s in socks)
    for s in socks:
        s.close()
    outs = [tempfile.mktemp(suffix=".json") for _ in range(2)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--bare-worker", str(i), ports, str(t0),
                               str(steps), outs[i]], env=env, stderr=subprocess.DEVNULL)
             for i in range(2)]
    for p in procs:
        p.wait(timeout=600)
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
        os.remove(path)
    return {"cold_s": max(r["first_step_s"] for r in results),
            "steps_per_s": min(r["steps_per_s"] for r in results)}


# -- nbdist: a fresh IPython shell driving 2 workers ----------------------------------------
def nbdist_session(t0: float, steps: int, dispatch: int, out: str) -> None:
    import contextlib
    import io

    from common import ipython_shell

    def cell(code: str) -> None:
        result = shell.run_cell(code, store_history=False)
        if result.error_before_exec or result.error_in_exec:
            raise RuntimeError(repr(result.error_before_exec or result.error_in_exec))

    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        shell = ipython_shell()
        shell.run_line_magic("load_ext", "nbdist")
        shell.run_line_magic("distribute", "multiworker --workers 2")
        cell("%%distribute\n" + SETUP)
        cell("%%distribute --step --data ds --steps 1\n" + STEP_BODY)
        cold = time.time() - t0
        times = []
        for _ in range(dispatch + 1):
            start = time.perf_counter()
            cell("%%distribute\npass")
            times.append(time.perf_counter() - start)
        import nbdist

        rates = []
        for _ in range(SEGMENTS):
            cell(f"%%distribute --step --data long_ds --steps {steps}\n" + STEP_BODY)
            frame = nbdist.runs[-1].metrics
            stamps = frame[frame.worker == 0].sort_values("step")["wall_time"].tolist()
            rates.append((len(stamps) - WARMUP - 1) / (stamps[-1] - stamps[WARMUP]))
        rate = max(rates)
        shell.run_line_magic("distribute", "stop")
    with open(out, "w") as f:
        json.dump({"cold_s": cold, "dispatch_s": statistics.median(times[1:]),
                   "steps_per_s": rate}, f)


def run_nbdist(steps: int, dispatch: int) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    t0 = time.time()
    subprocess.run([sys.executable, __file__, "--nbdist-session", str(t0), str(steps),
                    str(dispatch), out], env=env, check=True, timeout=900)
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-worker":
        a = sys.argv[2:]
        return bare_worker(int(a[0]), a[1], float(a[2]), int(a[3]), a[4])
    if len(sys.argv) > 1 and sys.argv[1] == "--nbdist-session":
        a = sys.argv[2:]
        return nbdist_session(float(a[0]), int(a[1]), int(a[2]), a[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--dispatch", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        bare = run_bare(args.steps)
        mine = run_nbdist(args.steps, args.dispatch)
        rows.append((bare, mine))
        print(f"round {r + 1}: cold {mine['cold_s']:.1f} s vs {bare['cold_s']:.1f} s | "
              f"dispatch {mine['dispatch_s'] * 1e3:.0f} ms | steps/s {mine['steps_per_s']:.1f} "
              f"vs {bare['steps_per_s']:.1f}", flush=True)
    cold = statistics.median(m["cold_s"] / b["cold_s"] for b, m in rows)
    rate = statistics.median(m["steps_per_s"] / b["steps_per_s"] for b, m in rows)
    dispatch = statistics.median(m["dispatch_s"] for _, m in rows)
    print(f"cold start to first step, nbdist / bare: {cold:.2f}x (goal <= 1.2)")
    print(f"warm dispatch of a trivial cell on 2 workers: {dispatch * 1e3:.0f} ms median "
          "(goal <= 200 ms)")
    print(f"step mode steps/s, nbdist / bare: {rate:.2f} (goal >= 0.97)")


if __name__ == "__main__":
    main()
