"""A NaN loss ends a step-mode run at that step (as Keras' TerminateOnNaN ends a fit): the
error names the step, the epoch and the replica, the Run is failed, not done, and with
``--checkpoint`` the last good epoch stays to resume from."""

import os

import pytest
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


# -- a NaN from an empty batch: TensorFlow gives a replica left without examples a batch of 0 --

SHORT_DATA = """
import numpy as np
import tensorflow as tf
with nbdist.strategy().scope():
    short_w = tf.Variable(1.0)
    short_opt = tf.keras.optimizers.SGD(0.01)
# 5 examples in batches of 4: the last batch holds 1, split 1 + 0 over 2 replicas
partial_ds = tf.data.Dataset.from_tensor_slices(
    (np.ones((5, 3), "float32"), np.ones((5, 1), "float32"))).batch(4)
# a batch of batches: 10 numbers in batches of 4 (4, 4, 2), those in batches of 2 (2, 1)
nested_ds = tf.data.Dataset.range(10).map(
    lambda x: tf.reshape(tf.cast(x, tf.float32), [1])).batch(4).batch(2)
# TensorFlow's input guide's dataset function: per-replica batches of one pipeline
def guide_fn(input_context):
    return tf.data.Dataset.range(10).batch(4)
"""

MEAN_STEP = """%%distribute --step --data {data}
x = tf.cast(tf.nest.flatten(batch)[0], tf.float32)
with tf.GradientTape() as tape:
    loss = {loss}
grads = tape.gradient(loss, [short_w])
short_opt.apply_gradients(zip(grads, [short_w]))
"""


@pytest.fixture
def two_replicas(ip):
    """The kernel on 2 replicas, 4 again afterwards."""
    ip.run_line_magic("distribute", "mirrored --devices 2")
    run_ok(ip, "import nbdist" + SHORT_DATA)
    yield ip
    ip.run_line_magic("distribute", "mirrored --devices 4")


@pytest.mark.parametrize(("data", "shapes", "fix"), [
    ("partial_ds", "(shapes (0, 3), (0, 1); replica 0's: (1, 3), (1, 1))",
     "`.batch(4, drop_remainder=True)`"),
    ("nested_ds", "(shape (0, 2, 1); replica 0's: (1, 2, 1))",
     "`.batch(2, drop_remainder=True)` as its outer batch"),
    ("guide_fn", "(shape (0,); replica 0's: (2,))",
     "Fix: batch with `drop_remainder=True` in the function"),
])
def test_a_nan_from_an_empty_batch_names_the_replica_its_shape_and_the_fix(
        two_replicas, data, shapes, fix):
    err = run_err(two_replicas, MEAN_STEP.format(data=data, loss="tf.reduce_mean(x * short_w)"))
    assert isinstance(err, NonFiniteLoss), repr(err)
    text = str(err)
    assert "the loss is nan at step 1 (epoch 1) on replica 1," in text
    assert f"Replica 1's batch at step 1 was empty {shapes}, and the mean of an empty batch " \
           "is NaN: that is the cause." in text, text
    assert fix in text and "drop_remainder=True" in text, text
    assert "Usual causes" not in text and "learning rate" not in text, text
    assert "`tf.nn.compute_average_loss(..., global_batch_size=...)`, is 0 on an empty " \
           "batch" in text, text
    if data != "guide_fn":
        assert f"The partial last batch of --data {data}" in text, text
        assert "split 1 + 0 across the 2 replicas" in text, text
    if data == "nested_ds":
        assert "batches of batches" in text, text


def test_an_uneven_split_without_a_nan_is_noted_once(two_replicas):
    # compute_average_loss over the global batch: an empty batch adds 0, no NaN
    run_ok(two_replicas, MEAN_STEP.format(
        data="partial_ds --epochs 2",
        loss="tf.nn.compute_average_loss(x[:, 0] * short_w, global_batch_size=4)"))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 4, (run.status, run.steps_done)
    said = [n for n in run.notes if "drop_remainder" in n]
    assert len(said) == 1, run.notes
    assert said[0].startswith("step 1: the partial last batch of --data partial_ds "
                              "(1 example, where the first step's held 4"), said
    assert "replica 1's batch was empty" in said[0], said


def test_whole_batches_are_not_noted_and_keep_the_usual_causes(two_replicas):
    run_ok(two_replicas, "even_ds = tf.data.Dataset.from_tensor_slices("
                         "np.ones((8, 3), 'float32')).batch(4)")
    run_ok(two_replicas, MEAN_STEP.format(data="even_ds", loss="tf.reduce_mean(x * short_w)"))
    assert not any("drop_remainder" in n for n in nbdist.runs[-1].notes), nbdist.runs[-1].notes
    err = run_err(two_replicas, MEAN_STEP.format(
        data="even_ds", loss="tf.reduce_mean(x * short_w) / 0.0 * 0.0"))
    assert isinstance(err, NonFiniteLoss), repr(err)
    assert "Usual causes: a learning rate too high" in str(err) and "empty" not in str(err)


def test_several_steps_per_call_name_the_empty_replica_without_shapes(two_replicas):
    # the batch is read inside the compiled call: its size comes out of the step, not its shape
    err = run_err(two_replicas, MEAN_STEP.format(
        data="partial_ds --steps-per-call 2", loss="tf.reduce_mean(x * short_w)"))
    assert isinstance(err, NonFiniteLoss), repr(err)
    assert "Replica 1's batch at step 1 was empty, and the mean of an empty batch is NaN" \
        in str(err), str(err)


