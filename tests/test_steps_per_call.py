"""--steps-per-call: several steps per compiled call train exactly what one step per call does,
with one row per step and replica; also when a Stop request or a kernel interrupt ends the run
in the middle, and when a run with --checkpoint dies in a group and is resumed."""

import numpy as np
import pytest
from helpers import (
    StopAfter,
    kernel_strategy,
    regression_data,
    regression_step,
    run_err,
    run_ok,
    weights_after,
)

import nbdist
from nbdist.errors import RunInterrupted
from nbdist.session import current_session
from nbdist.spec import RunSpec

SETUP = regression_data("GLOBAL_BATCH * 9 + 16") + """
import os
import signal
long_ds = train_ds.repeat()

def interrupting(ds, at):
    '''`ds` whose `at`-th element sends this process SIGINT (Kernel > Interrupt) as it is read:
    inside a compiled call, which reads its batches itself.'''
    seen = [0]

    def check(x):
        seen[0] += 1
        if seen[0] == at:
            os.kill(os.getpid(), signal.SIGINT)
        return x

    return ds.map(lambda x, y: (tf.ensure_shape(tf.numpy_function(check, [x], tf.float32),
                                                x.shape), y))
"""

BUILD = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(3)])
model.set_weights(start_weights)
optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
"""


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    init = np.random.default_rng(1)
    ip.user_ns["start_weights"] = [init.normal(scale=0.3, size=s).astype("float32")
                                   for s in [(8, 16), (16,), (16, 3), (3,)]]
    yield ip
    kernel_strategy(ip)


def train(shell, flags, data="train_ds"):
    weights, run = weights_after(shell, BUILD, regression_step(flags, data))
    assert run.status == "done", run.summary()
    return weights, run


def assert_same(weights, others):
    for a, b in zip(weights, others, strict=True):
        np.testing.assert_array_equal(a, b)


def assert_whole_steps(run):
    """One row per step and replica, for steps 0..steps_done-1 and no other."""
    frame = run.metrics
    assert len(frame) == run.steps_done * run.replicas
    assert sorted(frame["step"].unique()) == list(range(run.steps_done))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored --devices 4"])
def test_four_steps_per_call_train_what_one_step_per_call_trains(shell, strategy):
    """10 batches (the last one partial) over 2 epochs, and --steps 7 (not a multiple of 4)."""
    kernel_strategy(shell, strategy)
    for flags in ("--epochs 2", "--steps 7"):
        one, run1 = train(shell, f"{flags} --timing-every 3")
        four, run4 = train(shell, f"{flags} --timing-every 3 --steps-per-call 4")
        assert_same(one, four)
        m1, m4 = run1.metrics, run4.metrics
        assert len(m4) == len(m1) == run1.steps_done * run1.replicas
        assert run4.steps_done == (20 if flags == "--epochs 2" else 7)
        np.testing.assert_array_equal(m4[["step", "epoch", "replica"]], m1[["step", "epoch",
                                                                          "replica"]])
        np.testing.assert_array_equal(m4["loss"], m1["loss"])
        # in-graph stamps, in order: tf.timestamp reads the wall clock, which two cores of this
        # machine have read up to ~0.1 ms apart (-0.03 and -0.13 ms seen)
        assert (m4["step_ms"] > -1).all() and m4["step_ms"].sum() > 0
        if run4.replicas > 1:   # timed steps (calls of one step) are measured as with K=1
            timed1, timed4 = (set(m.loc[m["allreduce_ms"].notna(), "step"]) for m in (m1, m4))
            assert timed1 and timed1 <= timed4 and len(timed4 - timed1) <= 1


def test_a_stop_request_ends_at_a_call_boundary_with_the_rows_of_every_step_run(shell):
    """Stop asked after step 5 of calls of 4: the call under way finishes (8 steps), each of its
    steps has its rows, and the weights are those of 8 steps of one step per call."""
    run_ok(shell, BUILD)
    cell = regression_step("--steps 1000 --steps-per-call 4 --timing-every 0", "long_ds")
    header, body = cell.split("\n", 1)
    spec = RunSpec(step=True, data="long_ds", steps=1000, steps_per_call=4, timing_every=0)
    run = current_session().run_step_cell(body, spec, [StopAfter(5 * 4)], header=header)
    assert run.status == "stopped" and run.steps_done == 8
    assert_whole_steps(run)
    stopped = [w.copy() for w in shell.user_ns["model"].get_weights()]
    assert_same(stopped, train(shell, "--steps 8", "long_ds")[0])


def test_an_interrupt_inside_a_call_keeps_the_rows_of_the_steps_it_ran(shell):
    """SIGINT while a call of 4 steps runs lands after the call, once its rows are recorded:
    the Run has every step the weights went through."""
    kernel_strategy(shell, "mirrored --devices 2")
    run_ok(shell, "trip_ds = interrupting(long_ds, 14)")
    run_ok(shell, BUILD)
    err = run_err(shell, regression_step("--steps 1000 --steps-per-call 4", "trip_ds"))
    assert isinstance(err, RunInterrupted), repr(err)
    run = nbdist.runs[-1]
    assert run.status == "interrupted" and 0 < run.steps_done < 1000
    assert_whole_steps(run)
    interrupted = [w.copy() for w in shell.user_ns["model"].get_weights()]
    assert_same(interrupted, train(shell, f"--steps {run.steps_done}", "long_ds")[0])


def test_auto_chooses_a_group_size_and_says_so(shell):
    kernel_strategy(shell, "one_device")
    _, run = train(shell, "--epochs 4 --steps-per-call auto")
    assert run.steps_done == 40
    chose = [n for n in run.notes if n.startswith("--steps-per-call auto chose")]
    assert chose, run.notes


@pytest.mark.parametrize("value", ["0", "two", "-3"])
def test_a_bad_group_size_is_refused_before_anything_runs(shell, value):
    runs = len(nbdist.runs)
    err = run_err(shell, regression_step(f"--steps-per-call {value}"))
    assert "--steps-per-call" in str(err) and "`auto`" in str(err)
    assert len(nbdist.runs) == runs
