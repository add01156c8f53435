"""`strategy` in the notebook, hand-written loops beside step cells, the global loss, and
`model.fit` in a cell without `%%distribute`."""

import math
import textwrap

import pytest
from helpers import TUTORIAL_STEP, run_ok

import nbdist
from nbdist.errors import ConfigError
from nbdist.session import current_session
from nbdist.spec import StrategySpec

SETUP = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH_SIZE = 16
rng = np.random.default_rng(1)
xs = rng.normal(size=(GLOBAL_BATCH_SIZE * 4, 6)).astype("float32")
ys = rng.integers(0, 3, GLOBAL_BATCH_SIZE * 4)
train_dataset = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(
    GLOBAL_BATCH_SIZE, drop_remainder=True)
"""

CREATE = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(3)])
optimizer = tf.keras.optimizers.SGD(0.1)
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
"""

# TensorFlow's custom_training tutorial, as it writes it
HAND_WRITTEN = f"""
def train_step(inputs):
    images, labels = inputs
{textwrap.indent(TUTORIAL_STEP, "    ")}    return loss

@tf.function
def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
"""

STEP = ("%%distribute --step --data train_dataset --steps 1\nimages, labels = batch\n"
        + TUTORIAL_STEP)


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    run_ok(ip, CREATE)
    return ip


def test_strategy_is_the_sessions_and_hand_written_loops_share_it(shell):
    ns = shell.user_ns
    assert ns["strategy"] is nbdist.strategy()
    assert run_ok(shell, "strategy.num_replicas_in_sync") == 4
    run_ok(shell, HAND_WRITTEN)
    run_ok(shell, "w0 = [v.numpy() for v in model.variables]")
    hand = float(run_ok(shell, "distributed_train_step(next(iter(dist_dataset)))"))
    run_ok(shell, "for v, w in zip(model.variables, w0): v.assign(w)")
    run_ok(shell, STEP)   # the same first batch, from the same weights
    run = nbdist.runs[-1]
    assert run.status == "done"
    per_replica = run.metrics.query("step == 0")["loss"]
    assert len(per_replica) == 4
    # the headline is what the tutorial prints: the sum of the replicas' losses
    assert run.last["global_loss"] == pytest.approx(hand, rel=1e-5)
    assert per_replica.sum() == pytest.approx(hand, rel=1e-5)
    assert f"loss (sum of replicas) {hand:.4g}" in run.summary()
    assert any("strategy.reduce(SUM" in note for note in run.notes)
    # the hand-written loop goes on after the step cell, on the same strategy and model
    after = float(run_ok(shell, "distributed_train_step(next(iter(dist_dataset)))"))
    assert math.isfinite(after) and after != hand


def test_a_users_own_strategy_is_never_overwritten(shell, capsys):
    try:
        run_ok(shell, "%distribute stop")
        assert "strategy" not in shell.user_ns      # nbdist's own name went with it
        with pytest.raises(ConfigError, match="No strategy is set"):
            nbdist.strategy()
        run_ok(shell, "strategy = 'mine'")
        capsys.readouterr()
        run_ok(shell, "%distribute mirrored --devices 4")
        assert shell.user_ns["strategy"] == "mine"
        assert "nbdist.strategy()" in capsys.readouterr().out
        assert nbdist.strategy().num_replicas_in_sync == 4
    finally:
        shell.user_ns.pop("strategy", None)
        run_ok(shell, "%distribute stop")
        run_ok(shell, "%distribute mirrored --devices 4")
    assert shell.user_ns["strategy"] is nbdist.strategy()


def test_fit_in_a_plain_cell_on_a_distributed_model_is_recorded(shell, capsys):
    run_ok(shell, "model.compile(optimizer='sgd', loss=loss_object)")
    before = len(nbdist.runs)
    capsys.readouterr()
    session = current_session(shell)
    # the shell is the whole test session's: another module's plain fit may have been told
    session._told.discard("plain fit")
    seen: list[int] = []          # the steps the lab status bar is told about

    def listener() -> None:
        seen.append(nbdist.runs[-1].steps_done)

    session.listeners.append(listener)
    try:
        run_ok(shell, "model.fit(train_dataset, epochs=1, verbose=0)")   # no %%distribute
    finally:
        session.listeners.remove(listener)
    assert len(nbdist.runs) == before + 1
    run = nbdist.runs[-1]
    assert run.mode == "fit" and run.status == "done" and run.steps_done == 4
    assert max(seen) > 0, seen    # it follows the fit's steps, not only its start
    said = capsys.readouterr().out
    assert f"recorded as run {run.id}" in said
    run_ok(shell, "model.fit(train_dataset, epochs=1, verbose=0)")
    assert len(nbdist.runs) == before + 2
    assert "recorded as run" not in capsys.readouterr().out   # said once
    # a model made outside the strategy is the user's own business: not recorded
    run_ok(shell, """
    plain = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(3)])
    plain.compile(optimizer='sgd', loss=loss_object)
    plain.fit(train_dataset, epochs=1, verbose=0)
    """)
    assert len(nbdist.runs) == before + 2
    # a fit inside %%distribute is recorded once, not twice
    run_ok(shell, "%%distribute\nmodel.fit(train_dataset, epochs=1, verbose=0)")
    assert len(nbdist.runs) == before + 3


def test_the_kernel_never_builds_multiworker_itself(monkeypatch):
    from nbdist.strategies import build_strategy

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="runs in worker processes"):
        build_strategy(StrategySpec("multiworker", workers=2))
