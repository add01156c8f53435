"""The tf_keras optimizer hook behind allreduce_ms in fit (nbdist.telemetry.fitreduce).

Run in this process with tf_keras directly, under MirroredStrategy on 2 of the 4 logical CPUs
(conftest): the hook must time every step, for the default and the legacy optimizers, and
leave training bit-identical. Multi-worker fit with it: tests/test_cluster_profile.py.
"""

import numpy as np
import pytest

from nbdist.spec import StrategySpec
from nbdist.strategies import build_strategy
from nbdist.telemetry import fitreduce

pytestmark = pytest.mark.usefixtures("tf_keras")   # skip without it, fail in CI


def _train(optimizer_name, clock_wanted):
    import tensorflow as tf
    import tf_keras

    # Through nbdist, which gives each MirroredStrategy fresh collective keys: a bare one
    # would reuse those of the strategies other tests build in this process and break them.
    strategy = build_strategy(StrategySpec("mirrored", devices=2)).strategy
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(64, 3)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((xs, xs.sum(1, keepdims=True))).batch(16)
    with strategy.scope():
        tf_keras.utils.set_random_seed(1)
        model = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(1)])
        optimizer = (tf_keras.optimizers.legacy.SGD(0.1) if optimizer_name == "legacy"
                     else tf_keras.optimizers.SGD(0.1))
        model.compile(optimizer=optimizer, loss="mse")
        clock = fitreduce.clock_for(model, strategy) if clock_wanted else None
    seen = []

    class Read(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(clock.read_ms() if clock is not None else None)

    with fitreduce.hooked(clock):
        model.fit(ds, epochs=2, verbose=0, callbacks=[Read()])
    return [w.copy() for w in model.get_weights()], seen


@pytest.mark.parametrize("optimizer_name", ["default", "legacy"])
def test_the_hook_times_every_step_and_changes_nothing(optimizer_name):
    assert fitreduce.unavailable_reason() is None
    weights, seen = _train(optimizer_name, clock_wanted=True)
    plain, _ = _train(optimizer_name, clock_wanted=False)
    assert len(seen) == 8 and all(s is not None and len(s) == 1 and 0 < s[0] < 5000
                                  for s in seen), seen
    for a, b in zip(weights, plain, strict=True):
        np.testing.assert_array_equal(a, b)
    from tf_keras.src.optimizers.optimizer import Optimizer

    assert "aggregate_gradients" in Optimizer.__dict__   # restored, not left wrapped
    assert Optimizer.aggregate_gradients.__name__ == "aggregate_gradients"


def test_an_untested_tf_keras_is_not_hooked_and_says_why(monkeypatch):
    monkeypatch.setattr(fitreduce, "TESTED_TF_KERAS", ((9, 9),))
    why = fitreduce.unavailable_reason()
    assert why is not None and "not a version nbdist's optimizer hook was checked with (9.9)" \
        in why
    from tf_keras.src.optimizers.optimizer import Optimizer

    before = Optimizer.__dict__["aggregate_gradients"]
    with fitreduce.hooked(object()):
        assert Optimizer.__dict__["aggregate_gradients"] is before
