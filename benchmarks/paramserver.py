"""`%distribute parameter_server` against the same job hand-written, side by side: 1 parameter
server and 2 workers (``tf.distribute.Server`` processes on 127.0.0.1), the coordinator in the
measuring process, the step of tests/ps_scenario.py (a Dense(1) regression, Adam).

* cold start: from launching the coordinator's process to the end of the first step. nbdist:
  a fresh IPython shell runs ``%load_ext nbdist``, ``%distribute parameter_server``, the
  setup cell and a one-step ``%%distribute --step`` cell. Bare: the same process starts 3
  server processes, builds ParameterServerStrategy + ClusterCoordinator, the model, and
  schedules one step. Ratio nbdist / bare.
* steady-state throughput: steps/s over ``--steps`` scheduled steps without their first 20
  (tracing), each step's loss fetched (nbdist records one row per step). Ratio nbdist / bare.

    python benchmarks/paramserver.py [--steps 400] [--rounds 2]

Each side runs in its own process (a coordinator's TensorFlow context cannot be undone). The
machine is shared: read the spread over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from ps_scenario import SETUP, STEP  # noqa: E402  (the same job as the tests)

WARMUP = 20


def nbdist_side(t0: float, steps: int) -> dict:
    from common import ipython_shell

    import nbdist

    ip = ipython_shell()
    ip.run_line_magic("load_ext", "nbdist")
    ip.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")
    for code in (SETUP, STEP.format(data="ds", flags="--steps 1"),
                 STEP.format(data="long_ds", flags=f"--steps {steps}")):
        ip.run_cell(code, store_history=False).raise_error()
        if "--steps 1\n" in code:
            first = time.time() - t0
    m = nbdist.runs[-1].metrics
    wall = m["wall_time"].to_numpy()
    out = {"first_step_s": first, "steady": (len(m) - WARMUP - 1) / (wall[-1] - wall[WARMUP])}
    ip.run_line_magic("distribute", "stop")
    return out


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def bare_side(t0: float, steps: int) -> dict:
    ports = _ports(3)
    spec = {"ps": [f"127.0.0.1:{ports[0]}"],
            "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    servers = [subprocess.Popen([sys.executable, "-c", (
        "import tensorflow as tf, json, sys\n"
        "s = tf.distribute.Server(tf.train.ClusterSpec(json.loads(sys.argv[1])), "
        "job_name=sys.argv[2], task_index=int(sys.argv[3]), protocol='grpc', start=True)\n"
        "s.join()\n"), json.dumps(spec), job, str(i)])
        for job, i in [("ps", 0), ("worker", 0), ("worker", 1)]]
    try:
        import keras
        import numpy as np
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        rng = np.random.default_rng(0)
        xs = rng.normal(size=(32 * 8, 4)).astype("float32")
        ys = xs.sum(axis=1, keepdims=True)
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.Adam(0.05)
            optimizer.build(model.trainable_variables)

        def dataset_fn():
            return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(
                32, drop_remainder=True).repeat()

        per_worker = coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(lambda _ctx: dataset_fn()))
        iterator = iter(per_worker)

        @tf.function
        def train(it):
            def step(batch):
                x, y = batch
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(x) - y))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                return loss
            return strategy.run(step, args=(next(it),))

        coordinator.schedule(train, args=(iterator,)).fetch()
        first = time.time() - t0
        done = []
        pending = [coordinator.schedule(train, args=(iterator,)) for _ in range(steps)]
        for value in pending:            # each step's loss, in order, as it arrives
            value.fetch()
            done.append(time.perf_counter())
        return {"first_step_s": first,
                "steady": (len(done) - WARMUP - 1) / (done[-1] - done[WARMUP])}
    finally:
        for proc in servers:
            proc.kill()


def side(name: str, steps: int) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    t0 = time.time()
    done = subprocess.run([sys.executable, __file__, "--side", name, "--t0", str(t0),
                           "--steps", str(steps)], capture_output=True, text=True, env=env,
                          timeout=600)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise SystemExit(f"{name} side failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", choices=["nbdist", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        fn = nbdist_side if args.side == "nbdist" else bare_side
        print("RESULT " + json.dumps(fn(args.t0, args.steps)), flush=True)
        os._exit(0)    # the coordinator's threads would keep a normal exit waiting
    start, steady = [], []
    for r in range(args.rounds):
        nb, bare = side("nbdist", args.steps), side("bare", args.steps)
        start.append(nb["first_step_s"] / bare["first_step_s"])
        steady.append(nb["steady"] / bare["steady"])
        print(f"round {r}: cold start to the first step {nb['first_step_s']:.1f} s vs "
              f"{bare['first_step_s']:.1f} s (ratio {start[-1]:.2f}); steady "
              f"{nb['steady']:.0f} vs {bare['steady']:.0f} steps/s (ratio {steady[-1]:.2f})",
              flush=True)
    print(f"cold start ratio median {statistics.median(start):.2f}; throughput ratio median "
          f"{statistics.median(steady):.2f} (min {min(steady):.2f}, max {max(steady):.2f})")


if __name__ == "__main__":
    main()
