"""FastCall: step mode calls its compiled step without tf.function's per-call argument binding,
and trains exactly what calling the tf.function would."""

import numpy as np
import pytest
import tensorflow as tf
from helpers import regression_step, run_ok
from test_correctness import BUILD, SETUP

import nbdist
import nbdist.step.runner as runner
from nbdist.step.fastcall import FastCall


@pytest.fixture
def made(ip, monkeypatch):
    """Every FastCall the runner makes, with the shell set up as in test_correctness."""
    run_ok(ip, SETUP)
    instances = []

    class Recorded(FastCall):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            instances.append(self)

    monkeypatch.setattr(runner, "FastCall", Recorded)
    yield instances
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")


def train(shell, flags=""):
    run_ok(shell, BUILD.format(model_args=""))
    run_ok(shell, regression_step(flags))
    run = nbdist.runs[-1]
    assert run.status == "done"
    return [w.copy() for w in shell.user_ns["model"].get_weights()], run.metrics


def train_through_the_tf_function(shell, flags=""):
    """``train`` with the runner calling each traced variant's tf.function itself (what it
    calls when FastCall has no fast path), the reference FastCall must train exactly like."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "FastCall", lambda tf_function, example, fallback: fallback)
        return train(shell, flags)


def test_the_step_skips_the_binding_and_trains_the_same_weights(ip, made):
    fast_weights, fast = train(ip)
    assert len(made) == 2 and all(call.fast for call in made)   # untimed and timed variants
    # each variant is traced first, then every call (its first one too) takes the fast path
    assert sum(c.fast_calls for c in made) == 24 and sum(c.slow_calls for c in made) == 0
    made.clear()
    slow_weights, slow = train_through_the_tf_function(ip)
    assert not made
    for a, b in zip(fast_weights, slow_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast["loss"], slow["loss"])
    np.testing.assert_array_equal(fast["grad_norm"], slow["grad_norm"])


def test_cell_after_cell_gives_no_frequent_retracing_warning(ip, made):
    """Each cell compiles a fresh tf.function of the same code and FastCall's calls do not
    count for TensorFlow, which would warn about retracing after a few cells."""
    import logging

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        for _ in range(7):
            train(ip, "--steps 3 --timing-every 0")
    finally:
        logger.removeHandler(handler)
    assert len(made) == 7
    assert not [r for r in records if "retracing" in r.getMessage()]


def test_a_smaller_last_batch_goes_through_the_tf_function(ip, made):
    # 24 full global batches of 64, then one of 40 (10 per replica): traced shapes differ
    run_ok(ip, "train_ds = tf.data.Dataset.from_tensor_slices((features[:64 * 23 + 40], "
               "targets[:64 * 23 + 40])).batch(GLOBAL_BATCH)")
    fast_weights, fast = train(ip, "--timing-every 0")
    (call,) = made
    assert call.fast and (call.fast_calls, call.slow_calls) == (23, 1)
    assert fast["step"].nunique() == 24
    slow_weights, slow = train_through_the_tf_function(ip, "--timing-every 0")
    for a, b in zip(fast_weights, slow_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast["loss"], slow["loss"])


def test_inputs_unlike_the_traced_ones_fall_back_to_the_tf_function():
    @tf.function
    def double(pair):
        return pair[0] * 2 + tf.cast(tf.size(pair[1]), pair[0].dtype)

    example = (tf.ones([3]), tf.zeros([2]))
    double(example)
    call = FastCall(double, example)
    assert call.fast
    np.testing.assert_array_equal(call(example), [4.0, 4.0, 4.0])
    assert (call.fast_calls, call.slow_calls) == (1, 0)
    np.testing.assert_array_equal(call((tf.ones([2]), tf.zeros([2]))), [4.0, 4.0])   # shape
    np.testing.assert_array_equal(call((tf.ones([3], tf.int32), tf.zeros([2]))), [4, 4, 4])
    longer = (tf.ones([3]), tf.zeros([2]), tf.zeros([1]))                          # structure
    np.testing.assert_array_equal(call(longer), [4.0, 4.0, 4.0])
    assert (call.fast_calls, call.slow_calls) == (1, 3)


def test_no_fast_path_when_the_example_is_not_all_tensors():
    @tf.function
    def scale(pair):
        return pair[0] * pair[1]

    example = (tf.ones([2]), 3.0)
    scale(example)
    call = FastCall(scale, example)
    assert not call.fast
    np.testing.assert_array_equal(call(example), [3.0, 3.0])
    assert (call.fast_calls, call.slow_calls) == (0, 1)
