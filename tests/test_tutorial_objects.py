"""The objects TensorFlow's custom_training tutorial trains, typed into cells as it writes
them: a Sequential CNN without `Input`, objects made outside `%%distribute`."""

import pytest
from helpers import TUTORIAL_STEP, kernel_strategy, run_err, run_ok

import nbdist
from nbdist.errors import StepCodeError

DATA = """
import os, tempfile
import numpy as np
import tensorflow as tf
GLOBAL_BATCH_SIZE = 8
rng = np.random.default_rng(0)
images = rng.random((64, 10, 10, 1)).astype("float32")
labels = rng.integers(0, 10, 64)
train_dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(
    GLOBAL_BATCH_SIZE, drop_remainder=True)
"""

# the tutorial's create_model(): no Input layer, so the model builds on its first call
CREATE = """%%distribute
model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(8, 3, activation='relu'),
    tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(16, activation='relu'),
    tf.keras.layers.Dense(10),
])
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
optimizer = tf.keras.optimizers.Adam()
checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
"""

STEP = ("%%distribute --step --data train_dataset --steps 3\nimages, labels = batch\n"
        + TUTORIAL_STEP)

ROUND_TRIP = """
path = checkpoint.save(os.path.join(tempfile.mkdtemp(), "ckpt"))
saved = [v.numpy().copy() for v in model.variables]
for v in model.variables:
    v.assign(tf.zeros_like(v))
checkpoint.restore(path)
restored = [v.numpy() for v in model.variables]
stored_shapes = [tuple(shape) for name, shape in tf.train.list_variables(path)
                 if "VARIABLE_VALUE" in name]
"""


@pytest.fixture
def shell(ip):
    for cell in (DATA, CREATE):   # the tutorial's data, then its create_model() cell
        run_ok(ip, cell)
    return ip


def _assert_model_real(shell):
    """Every variable has its real shape and a checkpoint save/restore round-trips it."""
    ns = shell.user_ns
    shapes = [tuple(v.shape) for v in ns["model"].variables]
    assert shapes[:2] == [(3, 3, 1, 8), (8,)], shapes
    assert all(v.numpy().size for v in ns["model"].variables)
    run_ok(shell, ROUND_TRIP)
    assert (0,) not in ns["stored_shapes"] and (3, 3, 1, 8) in ns["stored_shapes"]
    for before, after in zip(ns["saved"], ns["restored"], strict=True):
        assert before.shape == after.shape and (before == after).all()


def test_the_tutorial_model_without_input_trains_in_a_step_cell(shell):
    run_ok(shell, STEP)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 3
    _assert_model_real(shell)


def test_a_failing_step_cell_leaves_the_lazy_model_usable(shell):
    failing = STEP.replace("optimizer.apply_gradients", "tf.debugging.assert_equal(loss, -1.0)\n"
                           "optimizer.apply_gradients")
    run_err(shell, failing)
    assert nbdist.runs[-1].status == "failed"
    _assert_model_real(shell)   # built (by nbdist, before the trace), not emptied
    run_ok(shell, STEP)         # and still trains
    assert nbdist.runs[-1].status == "done"


@pytest.mark.parametrize("made_outside", ["model", "optimizer"])
def test_objects_made_outside_distribute_are_refused_by_name(shell, made_outside):
    plain = {
        "model": "model = tf.keras.Sequential([tf.keras.Input((10, 10, 1)), "
                 "tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])",
        "optimizer": "optimizer = tf.keras.optimizers.Adam()",
    }[made_outside]
    if made_outside == "optimizer":   # a model that is fine, built under the strategy
        run_ok(shell, "%%distribute\nmodel.build((None, 10, 10, 1))")
    run_ok(shell, plain)   # a cell without %%distribute
    before = len(nbdist.runs)
    err = run_err(shell, STEP)
    assert isinstance(err, StepCodeError)
    message = str(err)
    assert f"`{made_outside}`" in message and "outside `%%distribute`" in message
    assert "in a `%%distribute` cell" in message
    line = 4 if made_outside == "model" else 8   # the cell line that first names it
    assert message.startswith(f"cell line {line} ")
    assert len(nbdist.runs) == before   # refused before any Run exists


def test_a_per_example_loss_is_refused_at_its_line_before_training(shell):
    """The tutorial's step without compute_average_loss: `loss` is one value per example."""
    per_example = STEP.replace(
        "    loss = tf.nn.compute_average_loss(loss_object(labels, predictions),\n"
        "                                      global_batch_size=GLOBAL_BATCH_SIZE)\n",
        "    loss = loss_object(labels, predictions)\n")
    assert per_example != STEP
    run_ok(shell, "%%distribute\nmodel.build((None, 10, 10, 1))")
    weights = [v.numpy().copy() for v in shell.user_ns["model"].trainable_variables]
    err = run_err(shell, per_example)
    message = str(err)
    assert isinstance(err, StepCodeError) and "\n" not in message
    assert message.startswith("cell line 5 `loss = loss_object(labels, predictions)`: "
                              "`loss` has shape (2,), not one value")   # per replica of 4
    assert "tf.nn.compute_average_loss(" in message and "tf.reduce_mean(" in message
    run = nbdist.runs[-1]
    assert run.status == "failed" and run.n_rows == 0                  # nothing trained
    after = shell.user_ns["model"].trainable_variables
    assert all((w == v.numpy()).all() for w, v in zip(weights, after, strict=True))


# The same create_model() cell as a TF_USE_LEGACY_KERAS (or `--keras legacy`) user has it:
# tf.keras is tf_keras there; here it is imported as such.
TF_KERAS_CREATE = "%%distribute\nimport tf_keras\n" + CREATE.split("\n", 1)[1].replace(
    "tf.keras.", "tf_keras.")


@pytest.mark.parametrize("line", ["mirrored --devices 4", "central_storage --devices 2",
                                  "one_device"])
def test_the_tf_keras_model_without_input_is_built_and_survives_a_failing_cell(ip, tf_keras,
                                                                                line):
    ip.run_line_magic("distribute", line)
    try:
        for cell in (DATA, TF_KERAS_CREATE):
            run_ok(ip, cell)
        model = ip.user_ns["model"]
        assert isinstance(model, tf_keras.Sequential) and not model.built
        failing = STEP.replace("optimizer.apply_gradients",
                               "tf.debugging.assert_equal(loss, -1.0)\noptimizer.apply_gradients")
        run_err(ip, failing)
        assert nbdist.runs[-1].status == "failed"
        _assert_model_real(ip)  # built by nbdist under the strategy before the trace, not emptied
        run_ok(ip, STEP)
    finally:   # the module's other tests, in any order, train on the kernel's 4 replicas
        kernel_strategy(ip)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 3
    assert run.metrics["loss"].notna().all()
    _assert_model_real(ip)
