"""A long notebook session: re-running a step cell must not keep each run's traced graphs.

Counts, not RSS (noisy on shared machines; benchmarks/soak.py measures RSS): after a few
warm-up runs, more runs of the same step cell leave no more FuncGraphs alive and no more
entries in TensorFlow's global gradient registry (each traced all_reduce registers one); and
a run's input (distributed dataset, iterator) keeps no heap memory for the cell's code.
"""

from __future__ import annotations

import gc

from helpers import mallinfo2, run_ok

from nbdist.data.iterate import wait_released
from nbdist.hooks.tf_gradients import _gradient_registry

MODEL = """
%%distribute
import numpy as np, tensorflow as tf
x = np.random.default_rng(0).normal(size=(512, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
soak_ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
soak_model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(4),
                                  tf.keras.layers.Dense(1)])
soak_optimizer = tf.keras.optimizers.SGD(0.01)
"""
STEP = """
%%distribute --step --data soak_ds --steps 2
features, labels = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(soak_model(features) - labels))
grads = tape.gradient(loss, soak_model.trainable_variables)
soak_optimizer.apply_gradients(zip(grads, soak_model.trainable_variables))
"""


def _alive() -> tuple[int, int]:
    from tensorflow.python.framework.func_graph import FuncGraph

    # The runs' dataset iterators (and their per-device graphs) are deleted on threads of
    # their own (nbdist.data.iterate): count once they are.
    assert wait_released(120), "a dataset iterator was not deleted within 120 s"
    gc.collect()
    graphs = sum(isinstance(o, FuncGraph) for o in gc.get_objects())
    custom = sum(k.startswith("CustomGradient") for k in _gradient_registry())
    return graphs, custom


def test_rerunning_a_step_cell_keeps_no_more_graphs(ip):
    run_ok(ip, MODEL)
    for _ in range(4):
        run_ok(ip, STEP)
    graphs, custom = _alive()
    for _ in range(12):
        run_ok(ip, STEP)
    graphs_after, custom_after = _alive()
    assert custom_after == custom, "the step's all_reduce gradients stayed registered"
    assert graphs_after <= graphs, f"FuncGraphs alive grew from {graphs} to {graphs_after}"


def _heap_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (all arenas), after a trim."""
    import ctypes

    assert wait_released(120), "a dataset iterator was not deleted within 120 s"
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    info = mallinfo2()
    return info.uordblks + info.hblkhd


def test_a_runs_input_keeps_nothing_for_the_cells_code(ip):
    """Every cell run is a new code object, and TensorFlow never frees what it keeps for the
    code objects on the stack of the graphs it builds: a distributed dataset and iterator
    built from the cell's stack kept ~43 kB each (plain TensorFlow, 2 replicas); nbdist
    builds them on a thread of its own."""
    import tensorflow as tf

    from nbdist.data.iterate import new_iterator, release
    from nbdist.data.kinds import DATASET, StepData
    from nbdist.data.read import distributed_input

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = tf.data.Dataset.from_tensor_slices(tf.zeros((256, 8))).repeat().batch(64)

    def nbdist_input():
        dist = distributed_input(StepData("ds", DATASET, dataset), strategy, 2, 2).dataset
        iterator = new_iterator(dist)
        next(iterator)
        iterator = release(iterator)

    def plain_input():   # what the cell's own stack would build
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        next(iterator)
        iterator = release(iterator)

    def per_run(build, runs: int = 40) -> float:
        for i in range(-5, runs):   # 5 warm-up runs, then the measured ones
            if i == 0:
                before = _heap_in_use()
            exec(compile("build()", f"<ipython-input-{i}-cell>", "exec"), {"build": build})
        return (_heap_in_use() - before) / runs

    plain, nbdist_kept = per_run(plain_input), per_run(nbdist_input)
    assert plain > 25_000, (
        f"TensorFlow kept only {plain / 1e3:.1f} kB per input built from new code: it may no "
        "longer keep memory for the stack's code objects (nbdist.data.freshstack)")
    assert nbdist_kept < 10_000, f"{nbdist_kept / 1e3:.1f} kB kept per run's input"
