"""A long notebook session: re-running a step cell must not keep each run's traced graphs.

Counts, not RSS (noisy on shared machines; benchmarks/soak.py measures RSS): after a few
warm-up runs, more runs of the same step cell leave no more FuncGraphs alive and no more
entries in TensorFlow's global gradient registry (each traced all_reduce registers one).
"""

from __future__ import annotations

import gc

from helpers import run_ok

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
