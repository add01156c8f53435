"""Loss-scale optimizers on multiworker workers: allreduce time and the true gradient norm."""

import numpy as np
from helpers import kernel_strategy, run_ok
from test_mixed_precision import INITIAL_SCALE, RTOL

import nbdist
from nbdist.step.runner import UNSCALED_NOTE

WORKER_DATA = """%%distribute
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 32
rng = np.random.default_rng(nbdist_worker)
xs = rng.normal(size=(GLOBAL_BATCH * 4, 4)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((xs, xs.sum(axis=1, keepdims=True))).batch(
    GLOBAL_BATCH, drop_remainder=True)
"""


WORKER_BUILD = """%%distribute
import {keras}
{keras}.mixed_precision.set_global_policy("{policy}")
{keras}.utils.set_random_seed(1)
model = {keras}.Sequential([{keras}.Input((4,)), {keras}.layers.Dense(8),
                            {keras}.layers.Dense(1, dtype="float32")])
optimizer = {keras}.optimizers.SGD(0.05)
if {wrap}:
    optimizer = {keras}.mixed_precision.LossScaleOptimizer(optimizer)
{keras}.mixed_precision.set_global_policy("float32")
"""


WORKER_STEP = """%%distribute --step --data ds --steps 2 --timing-every 1
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0],
                                      global_batch_size=GLOBAL_BATCH)
    scaled = {scale}
grads = tape.gradient(scaled, model.trainable_variables)
optimizer.apply_gradients(zip({applied}, model.trainable_variables))
"""


def test_loss_scale_optimizers_on_multiworker_workers(ip, tf_keras):
    """The workers' tf_keras (and Keras 3) loss scale optimizers, the scaled gradients named:
    each worker's first gradient norm is its float32 run's, its all-reduce timed, its scale
    forwarded to the kernel's Run."""
    kernel_strategy(ip, "multiworker --workers 2")
    try:
        run_ok(ip, WORKER_DATA)
        for library, scale, unscale in (
                ("tf_keras", "optimizer.get_scaled_loss(loss)",
                 "optimizer.get_unscaled_gradients(grads)"),
                ("keras", "optimizer.scale_loss(loss)", "grads")):
            norms = {}
            for policy, wrap in (("float32", False), ("mixed_float16", True)):
                run_ok(ip, WORKER_BUILD.format(keras=library, policy=policy, wrap=wrap))
                run_ok(ip, WORKER_STEP.format(scale=scale if wrap else "loss",
                                              applied=unscale if wrap else "grads"))
                run = nbdist.runs[-1]
                frame = run.metrics
                assert run.status == "done" and len(frame) == 4, (library, run)
                assert (frame["allreduce_ms"] > 0).all(), (library, frame["allreduce_ms"])
                norms[wrap] = frame.query("step == 0").sort_values("worker")["grad_norm"]
            assert (frame["loss_scale_factor"] == INITIAL_SCALE).all(), library
            assert UNSCALED_NOTE.format(grads="grads") in run.notes, (library, run.notes)
            np.testing.assert_allclose(norms[True], norms[False], rtol=RTOL["mixed_float16"])
    finally:
        kernel_strategy(ip)
