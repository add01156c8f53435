"""--steps-per-call: several steps per compiled call train exactly what one step per call does,
with one row per step and replica."""

import numpy as np
import pytest
from helpers import run_err, run_ok

import nbdist

SETUP = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
features = rng.normal(size=(GLOBAL_BATCH * 9 + 16, 8)).astype("float32")   # a partial last batch
targets = rng.normal(size=(GLOBAL_BATCH * 9 + 16, 3)).astype("float32")
train_ds = tf.data.Dataset.from_tensor_slices((features, targets)).batch(GLOBAL_BATCH)
"""

BUILD = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(3)])
model.set_weights(start_weights)
optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
"""

STEP = """%%distribute --step --data train_ds {flags}
x, y = batch
with tf.GradientTape() as tape:
    per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    init = np.random.default_rng(1)
    ip.user_ns["start_weights"] = [init.normal(scale=0.3, size=s).astype("float32")
                                   for s in [(8, 16), (16,), (16, 3), (3,)]]
    yield ip
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")


def train(shell, flags):
    run_ok(shell, BUILD)
    run_ok(shell, STEP.format(flags=flags))
    run = nbdist.runs[-1]
    assert run.status == "done", run.summary()
    return [w.copy() for w in shell.user_ns["model"].get_weights()], run


@pytest.mark.parametrize("strategy", ["one_device", "mirrored --devices 4"])
def test_four_steps_per_call_train_what_one_step_per_call_trains(shell, strategy):
    """10 batches (the last one partial) over 2 epochs, and --steps 7 (not a multiple of 4)."""
    shell.run_line_magic("distribute", "stop")
    shell.run_line_magic("distribute", strategy)
    for flags in ("--epochs 2", "--steps 7"):
        one, run1 = train(shell, f"{flags} --timing-every 3")
        four, run4 = train(shell, f"{flags} --timing-every 3 --steps-per-call 4")
        for a, b in zip(one, four, strict=True):
            np.testing.assert_array_equal(a, b)
        m1, m4 = run1.metrics, run4.metrics
        assert len(m4) == len(m1) == run1.steps_done * run1.replicas
        assert run4.steps_done == (20 if flags == "--epochs 2" else 7)
        np.testing.assert_array_equal(m4[["step", "epoch", "replica"]], m1[["step", "epoch",
                                                                          "replica"]])
        np.testing.assert_array_equal(m4["loss"], m1["loss"])
        assert (m4["step_ms"] >= 0).all() and m4["step_ms"].sum() > 0   # in-graph stamps, in order
        if run4.replicas > 1:   # timed steps (calls of one step) are measured as with K=1
            timed1, timed4 = (set(m.loc[m["allreduce_ms"].notna(), "step"]) for m in (m1, m4))
            assert timed1 and timed1 <= timed4 and len(timed4 - timed1) <= 1


def test_auto_chooses_a_group_size_and_says_so(shell):
    shell.run_line_magic("distribute", "stop")
    shell.run_line_magic("distribute", "one_device")
    _, run = train(shell, "--epochs 4 --steps-per-call auto")
    assert run.steps_done == 40
    chose = [n for n in run.notes if n.startswith("--steps-per-call auto chose")]
    assert chose, run.notes


@pytest.mark.parametrize("value", ["0", "two", "-3"])
def test_a_bad_group_size_is_refused_before_anything_runs(shell, value):
    runs = len(nbdist.runs)
    err = run_err(shell, STEP.format(flags=f"--steps-per-call {value}"))
    assert "--steps-per-call" in str(err) and "`auto`" in str(err)
    assert len(nbdist.runs) == runs
