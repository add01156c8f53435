"""Deleting a distributed dataset's iterator: plain TensorFlow blocks for seconds to a minute.

The smallest reproduction (plain TensorFlow in the ``main`` mode): a MirroredStrategy over N
logical CPUs, a distributed dataset read for ``--seconds`` by a ``tf.function`` step, then
``del iterator``, timed (wall, CPU of the whole process, and how many 50 ms ticks another
Python thread made meanwhile: it runs, so the wait holds no GIL). Modes, interleaved per round:

* ``main``: deleted on the main thread, as a hand-written loop does at the end of its epoch.
* ``untuned-devices``: the same, with the per-device pipelines built without autotuning
  (``nbdist.hooks.tf_data.untuned_device_pipelines``); the host pipeline still autotunes.
* ``nbdist``: what nbdist's step loops do (``nbdist.data.iterate``): untuned per-device
  pipelines, and the iterator handed to ``release``, which deletes it on a thread of its
  own; printed: the main thread's time and when the background deletion finished.
* ``no-autotune``: the diagnosis: autotuning off for the host pipeline too (a public option).

Cause (TensorFlow 2.21): every pipeline's iterator runs an autotuning thread that sleeps
between tuning rounds, for a period that doubles from 10 ms up to 60 s. Deleting the
iterator cancels and joins it, but ``CancellationManager::StartCancel`` wakes it before
marking itself cancelled, so the thread often sees "not cancelled" and sleeps out its period
(``TF_CPP_VMODULE=model=2`` logs it: "Waiting for 10240 ms." then "Waiting for 10158 ms.").
A distributed iterator holds N + 1 pipelines, joined one after another: 15-80 s were seen
after a few seconds of reading. A ``tf.function`` traced mid-epoch only makes the iterator
older, hence longer periods.

    python benchmarks/iterator_delete.py [--rounds 3] [--seconds 4] [--devices 4]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODES = ("main", "untuned-devices", "nbdist", "no-autotune")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--devices", type=int, default=4)
    args = parser.parse_args()
    import tensorflow as tf

    from nbdist.data.iterate import release, wait_released
    from nbdist.hooks.tf_data import untuned_device_pipelines

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.devices)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.devices)])
    data = tf.data.Dataset.from_tensor_slices(tf.random.normal([4096, 32])).batch(64).repeat()
    with strategy.scope():
        weights = tf.Variable(tf.zeros([32, 1]))

    @tf.function
    def step(batch):
        loss = strategy.run(lambda x: tf.reduce_sum(tf.matmul(x, weights)), args=(batch,))
        return strategy.reduce("SUM", loss, axis=None)

    ticks = [0]

    def tick() -> None:
        while True:
            ticks[0] += 1
            time.sleep(0.05)

    threading.Thread(target=tick, daemon=True).start()
    results: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in MODES:
            dataset = data
            if mode == "no-autotune":
                options = tf.data.Options()
                options.autotune.enabled = False
                dataset = data.with_options(options)
            untuned = mode != "main"
            with untuned_device_pipelines() if untuned else contextlib.nullcontext():
                iterator = iter(strategy.experimental_distribute_dataset(dataset))
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                step(next(iterator))
            cpu0, wall0, ticks0 = time.process_time(), time.perf_counter(), ticks[0]
            if mode == "nbdist":
                iterator = release(iterator)
                main_s = time.perf_counter() - wall0
                wait_released(600)
                extra = f", deleted in the background after {time.perf_counter() - wall0:.2f} s"
            else:
                del iterator
                main_s, extra = time.perf_counter() - wall0, ""
            results[mode].append(main_s)
            print(f"round {round_} {mode:>15}: main thread blocked {main_s:6.2f} s wall, "
                  f"{time.process_time() - cpu0:.2f} s CPU, another thread ticked "
                  f"{ticks[0] - ticks0}x{extra}", flush=True)
    print(f"after {args.seconds:g} s of reading, {args.devices} devices, the main thread's "
          f"wait over {args.rounds} rounds: "
          + ", ".join(f"{m} median {statistics.median(v):.2f} s, max {max(v):.2f} s"
                      for m, v in results.items()))


if __name__ == "__main__":
    main()
