"""The global loss of a step cell is what the cell's loss gives on the whole global batch on one
device, whichever way the cell writes it (Keras loss objects of each reduction,
``model.compute_loss``, ``tf.nn.compute_average_loss``, ``tf.reduce_mean``/``reduce_sum``,
sample weights, regularization added divided or not), on 1, 2 and 4 replicas.

The optimizer's learning rate is 0, so every step's loss can be checked against the same
expression computed without any strategy on that step's global batch.
"""

import numpy as np
import pytest
from helpers import kernel_strategy, run_ok

import nbdist

SETUP = """
import numpy as np
import tensorflow as tf
import keras

GB = 8
rng = np.random.default_rng(0)
X = rng.normal(size=(3 * GB, 3)).astype("float32")
Y = rng.normal(size=(3 * GB, 1)).astype("float32")
W = rng.uniform(0.2, 1.0, size=(3 * GB,)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((X, Y, W)).batch(GB, drop_remainder=True)
mse = keras.losses.MeanSquaredError()
mse_sum = keras.losses.MeanSquaredError(reduction="sum")

def make_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
        1, kernel_regularizer=keras.regularizers.L2(0.1),
        kernel_initializer=keras.initializers.GlorotUniform(seed=1))])
    model.compile(loss="mse")
    return model
"""

BUILD = """%%distribute
model = make_model()
optimizer = keras.optimizers.SGD(learning_rate=0.0)
"""

STEP = """%%distribute --step --data ds --steps-per-call 1
x, y, w = batch
with tf.GradientTape() as tape:
    loss = {expr}
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

# name -> (the loss expression, how the note says the global loss adds up)
FORMS = {
    "keras loss object": ("mse(y, model(x))", "sum"),
    "keras loss, sum reduction": ("mse_sum(y, model(x))", "sum"),
    "keras loss, sample_weight": ("mse(y, model(x), sample_weight=w)", "sum"),
    "model.compute_loss": ("model.compute_loss(x=x, y=y, y_pred=model(x))", "sum"),
    "compute_average_loss": ("tf.nn.compute_average_loss(keras.losses.mean_squared_error("
                             "y, model(x)))", "sum"),
    "compute_average_loss, global_batch_size": (
        "tf.nn.compute_average_loss(keras.losses.mean_squared_error(y, model(x)), "
        "global_batch_size=GB)", "sum"),
    "compute_average_loss, sample_weight": (
        "tf.nn.compute_average_loss(keras.losses.mean_squared_error(y, model(x)), "
        "sample_weight=w)", "sum"),
    "reduce_mean": ("tf.reduce_mean(tf.square(y - model(x)))", "mean"),
    "half of reduce_mean": ("0.5 * tf.reduce_mean(tf.square(y - model(x)))", "mean"),
    "reduce_sum": ("tf.reduce_sum(tf.square(y - model(x)))", "sum"),
    "reduce_sum / GLOBAL_BATCH": ("tf.reduce_sum(tf.square(y - model(x))) / GB", "sum"),
    "keras loss + model.losses": ("mse(y, model(x)) + tf.add_n(model.losses)", "mixed"),
    "keras loss + scaled model.losses": (
        "mse(y, model(x)) + tf.nn.scale_regularization_loss(tf.add_n(model.losses))", "sum"),
    "reduce_mean + model.losses": (
        "tf.reduce_mean(tf.square(y - model(x))) + tf.add_n(model.losses)", "mean"),
}

STRATEGIES = {1: "one_device", 2: "mirrored --devices 2", 4: "mirrored --devices 4"}


@pytest.fixture(scope="module", params=sorted(STRATEGIES))
def replicas(request, ip):
    kernel_strategy(ip, STRATEGIES[request.param])
    run_ok(ip, SETUP)
    run_ok(ip, BUILD)
    yield request.param
    kernel_strategy(ip)


def one_device_losses(shell, expr: str) -> list[float]:
    """The expression on each step's global batch, with no strategy, on a copy of the model."""
    return run_ok(shell, f"""
def one_device_loss(model, x, y, w):
    return {expr}

plain = make_model()
plain.set_weights(model.get_weights())
[float(one_device_loss(plain, x, y, w)) for x, y, w in ds]
""")


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_global_loss_is_the_one_device_loss_of_the_global_batch(ip, replicas, form):
    expr, adds = FORMS[form]
    run_ok(ip, STEP.format(expr=expr))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.replicas == replicas and run.steps_done == 3
    truth = one_device_losses(ip, expr)
    shown = run.metrics.groupby("step")["loss"].mean().to_numpy() * run.loss_scale
    np.testing.assert_allclose(shown, truth, rtol=1e-5)
    assert run.last["global_loss"] == pytest.approx(truth[-1], rel=1e-5)
    assert f"{truth[-1]:.4g}" in run.summary()
    notes = " ".join(run.notes)
    if replicas == 1:
        assert "loss (global)" not in notes
    elif adds == "mixed":
        assert "shares" in notes and "scale_regularization_loss" in notes
    elif adds == "sum":
        assert f"sum of the {replicas} replicas' losses" in notes
        assert "times the gradients" not in notes
    else:
        assert f"mean of the {replicas} replicas' losses" in notes or "loss (global)" \
            not in notes


# -- on two worker processes (multiworker): each worker traces the step and sends its rows --


