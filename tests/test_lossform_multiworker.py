"""Two multiworker workers show the one-device loss of the global batch for each loss form."""

import numpy as np
import pytest
from helpers import kernel_strategy, run_ok
from test_lossform import FORMS, STEP

import nbdist

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
