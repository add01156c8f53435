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

MW_SETUP = """%%distribute
import numpy as np
import tensorflow as tf
import keras
GB = 8   # the global batch: TensorFlow rebatches each worker's batch of 8 into its 4
def worker_data(index):
    rng = np.random.default_rng(index)
    return (rng.normal(size=(3 * GB, 3)).astype("float32"),
            rng.normal(size=(3 * GB, 1)).astype("float32"))
X, Y = worker_data(nbdist_worker)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(GB, drop_remainder=True).with_options(
    options)
mse = keras.losses.MeanSquaredError()
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(
    1, kernel_regularizer=tf.keras.regularizers.L2(0.1),
    kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1))])
model.compile(loss="mse")   # for compute_loss (tf_keras on the workers)
optimizer = tf.keras.optimizers.SGD(learning_rate=0.0)
"""

MW_STEP = STEP.replace("x, y, w = batch", "x, y = batch")   # no sample weights here

MW_FORMS = {
    **{name: FORMS[name] for name in ("keras loss object", "reduce_mean",
                                      "keras loss + model.losses")},
    "tf_keras model.compute_loss": ("model.compute_loss(x, y, model(x))", "sum"),
}


@pytest.fixture(scope="module")
def two_workers(ip):
    from nbdist.session import current_session

    kernel_strategy(ip, "multiworker --workers 2")
    run_ok(ip, MW_SETUP)
    session = current_session()
    yield ip
    procs = session.backend.processes() if session.backend is not None else []
    kernel_strategy(ip)
    assert not [p for p in procs if p.is_running()]


@pytest.mark.cluster
@pytest.mark.parametrize("form", sorted(MW_FORMS))
def test_two_workers_show_the_one_device_loss_of_the_global_batch(two_workers, form):
    expr, adds = MW_FORMS[form]
    run_ok(two_workers, MW_STEP.format(expr=expr))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.workers == 2 and run.steps_done == 6
    truth = run_ok(two_workers, f"""
import numpy as np
import tensorflow as tf
import keras
def worker_data(index):
    rng = np.random.default_rng(index)
    return (rng.normal(size=(24, 3)).astype("float32"),
            rng.normal(size=(24, 1)).astype("float32"))
(x0, y0), (x1, y1) = worker_data(0), worker_data(1)
mse = keras.losses.MeanSquaredError()
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(
    1, kernel_regularizer=keras.regularizers.L2(0.1),
    kernel_initializer=keras.initializers.GlorotUniform(seed=1))])
model.compile(loss="mse")
def one_device_loss(model, x, y):
    return {expr}
[float(one_device_loss(model, np.concatenate([x0[s:s + 4], x1[s:s + 4]]),
                       np.concatenate([y0[s:s + 4], y1[s:s + 4]]))) for s in range(0, 24, 4)]
""")
    shown = run.metrics.groupby("step")["loss"].mean().to_numpy() * run.loss_scale
    np.testing.assert_allclose(shown, truth, rtol=1e-5)
    assert ("sum of the 2 replicas'" in " ".join(run.notes)) == (adds != "mean")
