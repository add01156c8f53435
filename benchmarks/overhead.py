"""Throughput of `%%distribute --step` vs the same step hand-written, side by side.

One process, same model, data and strategy: a hand-written ``@tf.function`` +
``strategy.run`` step, and the same step as a ``%%distribute --step`` cell run through a real
IPython shell with telemetry on (per-replica loss and gradient norm every step, allreduce
timing paced automatically, the cell's own progress observer), as in a user's cell. Two
designs, for a tiny MLP and a small conv net at 1 and 4 replicas:

* interleaved (the headline): one long cell; after each of its steps the benchmark runs one
  hand-written step (fetching its result) and times it on its own; the cell's time per step is
  what passes between two of its steps minus that. Both sides are sampled at the same moments,
  so this shared machine's load changes cancel; the spread is shown per fifth of the run.
  Twice: against the hand-written step called as users write it (``hand_step(next(it))``),
  and called through ``nbdist.step.fastcall.FastCall`` as nbdist calls the cell's step. The first
  is what a user gains or loses; the second isolates what nbdist's telemetry costs, since
  FastCall skips tf.function's per-call argument binding (~0.3 ms here) for both.
* alternating cells (``--rounds``): a hand-written loop of ``--steps`` steps (no fetch per
  step), then the cell, per round; steady state without each side's first WARMUP steps, plus
  the per-cell tracing cost. Noisy here: rounds swing by 10-30% on this machine.

Also: scope-mode Keras ``fit`` vs plain ``fit`` under ``strategy.scope()`` (see ``bench_fit``).

    python benchmarks/overhead.py [--interleaved-steps 3000] [--rounds 5] [--steps 300]
                                  [--fit-rounds 3] [--only mlp|conv|fit]
"""

from __future__ import annotations

import argparse
import linecache
import os
import statistics
import time
from typing import Any

from common import nbdist_shell, ok

from nbdist.telemetry.run import RunObserver

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

WARMUP = 20

SETUP = """
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(0)
def make_data(kind, global_batch):
    shape = (32,) if kind == "mlp" else (28, 28, 1)
    x = rng.normal(size=(global_batch * 16,) + shape).astype("float32")
    y = rng.integers(0, 10, size=(global_batch * 16,)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch, drop_remainder=True)
def make_model(kind):
    if kind == "mlp":
        layers = [tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                  tf.keras.layers.Dense(10)]
    else:
        layers = [tf.keras.Input((28, 28, 1)), tf.keras.layers.Conv2D(8, 3, activation="relu"),
                  tf.keras.layers.MaxPooling2D(), tf.keras.layers.Conv2D(16, 3, activation="relu"),
                  tf.keras.layers.MaxPooling2D(), tf.keras.layers.Flatten(),
                  tf.keras.layers.Dense(10)]
    return tf.keras.Sequential(layers)
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
"""

STEP_BODY = """x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(loss_object(y, model(x, training=True)),
                                      global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

#: STEP_BODY as the function a script defines.
STEP_FN = ("def step_fn(batch):\n" + "".join(f"    {line}\n" for line in STEP_BODY.splitlines())
           + "    return loss\n")
#: Where a bare worker's ``step_fn`` "lives" (``define_step_fn`` puts its source there).
STEP_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bare_worker_step.py")


def define_step_fn(ns: dict) -> Any:
    """Define ``step_fn`` (``STEP_FN``) in ``ns`` with readable source, as in a script:
    AutoGraph converts it at the trace (code exec'd without its source runs unconverted,
    30-60 ms less than a script's first trace)."""
    linecache.cache[STEP_FILE] = (len(STEP_FN), None, STEP_FN.splitlines(True), STEP_FILE)
    exec(compile(STEP_FN, STEP_FILE, "exec"), ns)  # noqa: S102 - the benchmark's own step
    return ns["step_fn"]


HAND = "\n" + STEP_FN + """
@tf.function
def hand_step(dist_batch):
    per_replica = strategy.run(step_fn, args=(dist_batch,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

def hand_loop(n_steps, warmup):
    total = tf.constant(0.0)
    it = iter(dist_ds)
    for _ in range(warmup):
        total += hand_step(next(it))
    float(total)
    start = time.perf_counter()
    for _ in range(n_steps - warmup):
        total += hand_step(next(it))
    float(total)
    return (n_steps - warmup) / (time.perf_counter() - start)
"""


def steady_rate(run, warmup: int) -> float:
    frame = run.metrics.groupby("step")["wall_time"].first()
    walls = frame.to_numpy()
    return (len(walls) - 1 - warmup) / (walls[-1] - walls[warmup])


def _setup_step_bench(ip, kind: str, replicas: int) -> None:
    """A fresh session, model, optimizer and the hand-written loop, for one configuration."""
    import nbdist

    line = "one_device" if replicas == 1 else f"mirrored --devices {replicas}"
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", line)
    global_batch = 64 if kind == "mlp" else 32
    ip.user_ns.update(GLOBAL_BATCH=global_batch, kind=kind, time=time)
    ip.user_ns["strategy"] = nbdist.strategy()
    ok(ip, """
        train_ds = make_data(kind, GLOBAL_BATCH).repeat()
        dist_ds = strategy.experimental_distribute_dataset(train_ds)
        with strategy.scope():
            model = make_model(kind)
            optimizer = tf.keras.optimizers.SGD(0.01)
            optimizer.build(model.trainable_variables)
    """)
    ok(ip, HAND)


def bench_step(ip, kind: str, replicas: int, rounds: int, steps: int) -> None:
    import nbdist

    _setup_step_bench(ip, kind, replicas)
    cell = f"%%distribute --step --data train_ds --steps {steps}\n{STEP_BODY}"
    hand, ours, ratios, cell_overhead = [], [], [], []
    for _ in range(rounds):
        hand.append(ip.user_ns["hand_loop"](steps, WARMUP))
        started = time.perf_counter()
        ok(ip, cell)
        run = nbdist.runs[-1]
        ours.append(steady_rate(run, WARMUP))
        cell_s = time.perf_counter() - started
        cell_overhead.append(cell_s - (steps - 1 - WARMUP) / ours[-1])
        ratios.append(ours[-1] / hand[-1])
    print(f"{kind:4s} x{replicas} replicas: hand-written {statistics.median(hand):7.1f} steps/s, "
          f"%%distribute {statistics.median(ours):7.1f} steps/s, ratio "
          f"{statistics.median(ratios):.3f} (per round: {', '.join(f'{r:.3f}' for r in ratios)}); "
          f"per-cell fixed cost (rewrite+trace+warm-up) {statistics.median(cell_overhead):.2f} s",
          flush=True)


class _Interleaved(RunObserver):
    """The cell's own observer (the dashboard or progress line, as the magic made it), plus:
    after each of the cell's steps, one hand-written step, timed on its own. The cell's time
    per step is what passes between two of its steps minus the hand-written step in between,
    so both sides are sampled at the same moments and slow load changes cancel."""

    def __init__(self, inner, hand_once):
        self.inner, self.hand_once = inner, hand_once
        self.mark, self.ours, self.hand = None, [], []

    def on_step(self, run) -> None:
        self.inner.on_step(run)
        now = time.perf_counter()
        if self.mark is not None:
            self.ours.append(now - self.mark)
        self.hand_once()
        after = time.perf_counter()
        self.hand.append(after - now)
        self.mark = after

    def __getattr__(self, name):
        return getattr(self.inner, name)


def bench_step_interleaved(ip, kind: str, replicas: int, steps: int, chunks: int = 5,
                           hand_call: str = "tf.function") -> None:
    """One %%distribute --step run of ``steps`` steps with a hand-written step after each of
    its steps; steps/s ratio from the sums, also per fifth of the run (the spread).

    ``hand_call="tf.function"``: the hand-written step is called as users write it,
    ``hand_step(next(it))``. ``"fastcall"``: through ``nbdist.step.fastcall.FastCall``, as nbdist
    calls the cell's step, so the ratio is what nbdist's telemetry costs on its own.
    """
    import nbdist.widgets.dashboard as dashboard

    _setup_step_bench(ip, kind, replicas)
    ok(ip, """
        from nbdist.step.fastcall import FastCall
        hand_it = iter(dist_ds)
        first = next(hand_it)
        hand_step(first)
        hand_call = FastCall(hand_step, first) if HAND_CALL == "fastcall" else hand_step
        def hand_once():
            hand_call(next(hand_it)).numpy()
    """.replace("HAND_CALL", repr(hand_call)))
    made = []
    real = dashboard.observer_for

    def observer_for(shell, **settings):
        made.append(_Interleaved(real(shell, **settings), ip.user_ns["hand_once"]))
        return made[-1]

    dashboard.observer_for = observer_for
    try:
        ok(ip, f"%%distribute --step --data train_ds --steps {steps}\n{STEP_BODY}")
    finally:
        dashboard.observer_for = real
    ours, hand = made[0].ours[WARMUP:], made[0].hand[WARMUP + 1:]
    size = len(ours) // chunks
    parts = [sum(hand[i * size:(i + 1) * size]) / sum(ours[i * size:(i + 1) * size])
             for i in range(chunks)]
    label = {"tf.function": "hand-written", "fastcall": "hand-written via FastCall"}[hand_call]
    print(f"{kind:4s} x{replicas} replicas, interleaved: {label} {len(hand) / sum(hand):7.1f} "
          f"steps/s, %%distribute {len(ours) / sum(ours):7.1f} steps/s, ratio "
          f"{sum(hand) / sum(ours):.3f} (per fifth of the run: "
          f"{', '.join(f'{r:.3f}' for r in parts)})", flush=True)


def bench_fit(ip, rounds: int, steps: int) -> None:
    """Scope-mode fit vs plain fit under the same strategy. Keras fit on 4 replicas sharing 2
    cores swings by tens of percent from call to call here, so three numbers:

    * steady cost, measured inside one long %%distribute fit: the time nbdist's callback spends
      per step (recording the Run, the observers) over the step time; ratio = 1 - that share;
    * fixed cost per call: 1-step fits, alternating plain and %%distribute, median difference
      (the Run, the callbacks, the final figure);
    * whole-call ratio, plain seconds / %%distribute seconds of ``3 * steps``-step fits in the
      order plain, ours, ours, plain per round (what a user waits for; noisy: on 2 cores a
      900-step fit on 4 replicas takes ~5.7, ~11 or ~21 s, plain and ours alike, so rounds
      swing from 0.3 to 5; the steady and fixed costs above are the numbers to read).
    """
    import nbdist
    import nbdist.fitrecord as fitrecord

    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")
    ip.user_ns["strategy"] = nbdist.strategy()
    ip.user_ns.update(GLOBAL_BATCH=64, kind="mlp", time=time)
    ok(ip, """
        fit_ds = make_data("mlp", 64).repeat()
        with strategy.scope():
            model = make_model("mlp")
            model.compile(optimizer="sgd", loss=loss_object)
        model.fit(fit_ds, epochs=1, steps_per_epoch=WARMUP_STEPS, verbose=0)
    """.replace("WARMUP_STEPS", str(WARMUP)))
    cells = {"plain": ("with strategy.scope():\n"
                       "    model.fit(fit_ds, epochs=1, steps_per_epoch={n}, verbose=0)\n"),
             "ours": "%%distribute\nmodel.fit(fit_ds, epochs=1, steps_per_epoch={n}, verbose=0)\n"}

    def timed_call(side: str, n: int) -> float:
        start = time.perf_counter()
        ok(ip, cells[side].format(n=n))
        return time.perf_counter() - start

    spent = [0.0]
    record = fitrecord.FitRecorder.record_batch

    def timed_record(self, logs, step_ms):
        start = time.perf_counter()
        record(self, logs, step_ms)
        spent[0] += time.perf_counter() - start

    fitrecord.FitRecorder.record_batch = timed_record
    try:
        timed_call("ours", 3 * steps)
    finally:
        fitrecord.FitRecorder.record_batch = record
    frame = nbdist.runs[-1].metrics
    step_s = frame["step_ms"].iloc[WARMUP:].sum() / 1e3
    share = spent[0] * (len(frame) - WARMUP) / len(frame) / step_s

    fixed = [timed_call(side, 1) for _ in range(6) for side in ("plain", "ours")]
    extra = statistics.median(o - p for p, o in zip(fixed[0::2], fixed[1::2], strict=True))
    whole = []
    for _ in range(rounds):
        seconds = {"plain": 0.0, "ours": 0.0}
        for side in ("plain", "ours", "ours", "plain"):
            seconds[side] += timed_call(side, 3 * steps)
        whole.append(seconds["plain"] / seconds["ours"])
    print(f"fit  x4 replicas: steady: nbdist's callback takes {share * 100:.2f}% of each step "
          f"(ratio {1 - share:.4f}); fixed cost per call {extra:+.2f} s over plain fit "
          f"(median of 6 pairs of 1-step fits); whole-call ratio, {3 * steps} steps, "
          f"{statistics.median(whole):.3f} (per round: {', '.join(f'{w:.3f}' for w in whole)})",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--only", choices=["mlp", "conv", "fit"], default=None)
    parser.add_argument("--interleaved-steps", type=int, default=3000)
    parser.add_argument("--fit-rounds", type=int, default=3)
    args = parser.parse_args()
    ip = nbdist_shell()
    ok(ip, SETUP)
    for kind in ("mlp", "conv"):
        if args.only in (None, kind):
            for replicas in (1, 4):
                for hand_call in ("tf.function", "fastcall"):
                    bench_step_interleaved(ip, kind, replicas, args.interleaved_steps,
                                           hand_call=hand_call)
                if args.rounds:
                    bench_step(ip, kind, replicas, args.rounds, args.steps)
    if args.only in (None, "fit"):
        bench_fit(ip, args.fit_rounds, args.steps)


if __name__ == "__main__":
    main()
