"""A NaN loss ends a step-mode run at that step (as Keras' TerminateOnNaN ends a fit): the
error names the step, the epoch and the replica, the Run is failed, not done, and with
``--checkpoint`` the last good epoch stays to resume from."""

import os

from helpers import run_err, run_ok

import nbdist
from nbdist.errors import NonFiniteLoss

DATA = """
import numpy as np
import tensorflow as tf
xs = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
xs[{bad}] = np.nan                    # one example of batch 6 (8 examples a batch)
ys = xs.sum(axis=1, keepdims=True)
nan_ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(8)
with nbdist.strategy().scope():
    nan_model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    nan_opt = tf.keras.optimizers.SGD(0.01)
"""

STEP = """%%distribute --step --data nan_ds --epochs 2 {flags}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(nan_model(x) - y)[:, 0], global_batch_size=8)
grads = tape.gradient(loss, nan_model.trainable_variables)
nan_opt.apply_gradients(zip(grads, nan_model.trainable_variables))
"""


def test_a_nan_loss_ends_the_run_at_its_step_naming_the_replica(ip):
    # example 50 is the 3rd of batch 6 (8 batches an epoch); 4 replicas of 2 examples
    # each: it is replica 1's
    run_ok(ip, "import nbdist" + DATA.format(bad=50))
    err = run_err(ip, STEP.format(flags=""))
    assert isinstance(err, NonFiniteLoss), repr(err)
    text = str(err)
    assert "the loss is nan at step 6 (epoch 1) on replica 1," in text
    assert "TerminateOnNaN" in text and "learning rate" in text
    run = nbdist.runs[-1]
    assert run.status == "failed" and run.steps_done == 7
    frame = run.metrics
    assert frame[frame.step < 6]["loss"].notna().all()


POISONED = """%%distribute --step --data nan_ds --epochs 2 --checkpoint {dir}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(nan_model(x) - y)[:, 0], global_batch_size=8)
    loss = tf.where(nan_opt.iterations >= 9, tf.constant(np.nan), loss)
grads = tape.gradient(loss, nan_model.trainable_variables)
nan_opt.apply_gradients(zip(grads, nan_model.trainable_variables))
"""


def test_with_a_checkpoint_the_last_good_epoch_is_kept(ip, tmp_path):
    directory = tmp_path / "ckpt"
    run_ok(ip, "import nbdist" + DATA.format(bad="[]"))   # clean data: the step poisons step 9
    err = run_err(ip, POISONED.format(dir=directory))
    assert isinstance(err, NonFiniteLoss), repr(err)
    assert "the loss is nan at step 9 (epoch 2) on replicas 0, 1, 2, 3," in str(err)
    assert f"{directory}{os.sep}step keeps the weights after epoch 1, the last good one" in str(err)
    assert nbdist.runs[-1].status == "failed"
    assert os.listdir(directory), "the last good epoch's checkpoint was removed"
