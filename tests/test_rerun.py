"""Re-running a step cell: an unchanged cell reuses its traced step, a changed one retraces."""

import numpy as np
import pytest
from helpers import kernel_strategy, regression_data, regression_step, run_ok

import nbdist

SETUP = regression_data("GLOBAL_BATCH * 6") + """
def make_model():
    return tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(3)])
"""

BUILD = """%%distribute
model = make_model()
optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
"""


@pytest.fixture
def shell(ip):
    kernel_strategy(ip)
    run_ok(ip, SETUP)
    run_ok(ip, BUILD)
    yield ip
    kernel_strategy(ip)


def cache():
    return nbdist.session.current_session().backend.traced_steps


def step(shell, flags="", extra=""):
    """Run the step cell; return (reused its trace?, weights after it)."""
    hits = cache().hits
    run_ok(shell, regression_step(flags, extra=extra))
    assert nbdist.runs[-1].status == "done"
    return cache().hits > hits, [w.copy() for w in shell.user_ns["model"].get_weights()]


def test_an_unchanged_rerun_reuses_the_trace_and_trains_as_a_fresh_trace(shell):
    reused, _ = step(shell)
    assert not reused
    before = [w.copy() for w in shell.user_ns["model"].get_weights()]
    reused, cached = step(shell, flags="--steps 5")   # --steps changes no trace
    assert reused
    assert nbdist.runs[-1].steps_done == 5
    assert not np.array_equal(before[0], cached[0])   # it did train
    shell.user_ns["model"].set_weights(before)        # same start, traced afresh
    cache().clear()
    reused, fresh = step(shell, flags="--steps 5")
    assert not reused
    for a, b in zip(cached, fresh, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("change", "before", "after"), [
    ("%%distribute\noptimizer = tf.keras.optimizers.SGD(learning_rate=0.05)", "", ""),
    ("GLOBAL_BATCH = 32", "", ""),                        # a number the trace baked in
    ("%%distribute\nscale = tf.Variable(2.0)", " * scale", " * scale"),   # reassigned
    ("", "", " * 1.0"),                                   # the cell itself changed
], ids=["new optimizer", "changed number", "reassigned variable", "changed cell"])
def test_a_changed_cell_or_changed_objects_retrace(shell, change, before, after):
    run_ok(shell, "%%distribute\nscale = tf.Variable(1.0)")
    step(shell, extra=before)
    reused, _ = step(shell, extra=before)
    assert reused
    if change:
        run_ok(shell, change)
    reused, _ = step(shell, extra=after)
    assert not reused


def test_a_new_model_object_retraces_and_trains_the_new_model(shell):
    step(shell)
    old = shell.user_ns["model"]
    old_weights = [w.copy() for w in old.get_weights()]
    run_ok(shell, BUILD)
    new_start = [w.copy() for w in shell.user_ns["model"].get_weights()]
    reused, trained = step(shell)
    assert not reused
    assert not np.array_equal(new_start[0], trained[0])
    for a, b in zip(old_weights, old.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)   # the old model is no longer trained


def test_stop_and_another_strategy_release_the_cached_steps(shell):
    step(shell)
    kept = cache()
    assert len(kept) == 1
    shell.run_line_magic("distribute", "stop")
    assert len(kept) == 0


def test_the_cells_iterators_are_deleted_off_the_cells_thread(shell, monkeypatch):
    """TensorFlow can block a minute deleting a distributed dataset's iterator
    (benchmarks/iterator_delete.py), so each one a step cell makes, one per epoch, is deleted
    on nbdist's release thread, and none is kept once it has."""
    import threading
    import weakref

    from nbdist.data.iterate import wait_released

    made = []
    deleted_on: list[str] = []
    distributed = type(shell.user_ns["strategy"].experimental_distribute_dataset(
        shell.user_ns["train_ds"]))
    make_iterator = distributed.__iter__

    def recorded_iter(self):
        iterator = make_iterator(self)
        made.append(weakref.ref(iterator))
        weakref.finalize(iterator, lambda: deleted_on.append(threading.current_thread().name))
        return iterator

    monkeypatch.setattr(distributed, "__iter__", recorded_iter)
    step(shell, flags="--epochs 2")                          # each epoch runs out of data
    step(shell, flags="--steps 2")                           # stops inside the epoch
    step(shell, flags="--steps-per-call 2 --epochs 2")       # several steps per call
    assert wait_released(120)
    assert len(made) == 5
    assert all(ref() is None for ref in made)
    assert deleted_on == ["nbdist-iterator-release"] * 5
