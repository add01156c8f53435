"""A real Keras 3 ``model.fit`` in a ``%%distribute`` cell (the kernel's mirrored strategy) with
compiled metrics and validation data: the Run keeps each batch's loss, the metrics and each
epoch's validation, and the dashboard's figure and ``nbdist.compare`` draw them."""

import numpy as np
import pytest
from helpers import run_ok

import nbdist
from nbdist.fitrecord import BATCH_LOSS_LABEL

FIT = """\
import numpy as np
import tensorflow as tf

rng = np.random.default_rng(3)
xs = rng.normal(size=(320, 4)).astype("float32")
ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") > 0).astype("float32")
fit_ds = tf.data.Dataset.from_tensor_slices((xs[:256], ys[:256])).batch(32)
val_ds = tf.data.Dataset.from_tensor_slices((xs[256:], ys[256:])).batch(32)
"""

CELL = """%%distribute
clf = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1, "sigmoid")])
clf.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss="binary_crossentropy",
            metrics=["accuracy"])
history = clf.fit(fit_ds, epochs=2, verbose=0, validation_data=val_ds)
"""


def test_a_fit_records_and_draws_its_metrics_validation_and_batch_losses(ip):
    run_ok(ip, FIT)
    run_ok(ip, CELL)
    run = nbdist.runs[-1]
    history = ip.user_ns["history"].history
    assert run.mode == "fit" and run.status == "done" and run.steps_done == 16
    frame = run.metrics
    assert {"accuracy", "batch_loss"} <= set(frame.columns)
    for epoch in (0, 1):
        rows = frame[frame["epoch"] == epoch]
        # each batch's loss, whose mean over the epoch is Keras' running mean at its end
        assert rows["batch_loss"].mean() == pytest.approx(rows["loss"].iloc[-1], rel=1e-4)
        assert not np.allclose(rows["batch_loss"], rows["loss"])    # not the staircase
        assert rows["batch_loss"].iloc[0] == pytest.approx(rows["loss"].iloc[0])
    assert frame["loss"].iloc[-1] == pytest.approx(history["loss"][-1])
    epochs = run.epoch_metrics
    assert list(epochs["epoch"]) == [0, 1] and list(epochs["step"]) == [7, 15]
    np.testing.assert_allclose(epochs["val_loss"], history["val_loss"], rtol=1e-6)
    np.testing.assert_allclose(epochs["val_accuracy"], history["val_accuracy"], rtol=1e-6)
    np.testing.assert_allclose(epochs["accuracy"], history["accuracy"], rtol=1e-6)
    assert any("batch_loss is each batch's own loss" in note for note in run.notes)

    fig = run.plot()
    names = {t.name for t in fig.data}
    assert {BATCH_LOSS_LABEL, "loss, Keras' running mean over the epoch", "val_loss (per epoch)",
            "accuracy (running mean over the epoch)", "val_accuracy (per epoch)"} <= names
    [val] = [t for t in fig.data if t.name == "val_accuracy (per epoch)"]
    assert list(val.x) == [7, 15]
    np.testing.assert_allclose(val.y, history["val_accuracy"], rtol=1e-6)

    compared = nbdist.compare([run], metric="val_loss")
    [line] = compared.data
    # alone, a run is named by all it is: the learning rate of the model the cell compiled
    assert line.name == f"run {run.id} · mirrored · 4 replicas · lr 0.5"
    np.testing.assert_allclose(line.y, history["val_loss"], rtol=1e-6)
