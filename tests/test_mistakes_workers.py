"""Mistakes on multiworker workers: push and pull, a constant loss, a checkpointed run; refused
with what to do."""

from __future__ import annotations

import pytest
from helpers import run_err
from test_mistakes import refused

from nbdist.errors import StepCodeError


# -- a 2-worker multiworker cluster, one for these tests ---------------------------------------
@pytest.fixture(scope="module")
def mw(ip):
    from cluster_cells import SETUP
    from helpers import run_ok

    from nbdist.cluster.multiworker.backend import live_clusters

    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    try:
        run_ok(ip, SETUP)
        yield ip
    finally:
        ip.run_line_magic("distribute", "stop")
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert live_clusters() == []


def test_push_and_pull_mistakes_say_what_to_do_and_change_nothing(mw):
    import threading

    mw.user_ns["kernel_only"], mw.user_ns["a_lock"] = [1, 2], threading.Lock()
    mw.user_ns["learning_rate"] = 0.1
    said = refused(mw, "%distribute pull kernel_only")
    assert said == (
        "worker 0 has no variable `kernel_only`: the workers have only what `%%distribute` "
        "cells assigned there and what `%distribute push` sent. A value of this kernel: push "
        "it first, `%distribute push kernel_only`; a value the workers make: run the "
        "`%%distribute` cell that assigns it, then pull.")
    said = refused(mw, "%distribute push a_lock")
    assert said.startswith("Could not send ['a_lock'] to the workers: ")
    assert said.endswith(
        "Only picklable values can be pushed: push the plain data it holds or is built from "
        "(numbers, strings, lists, dicts, NumPy arrays), and make the object itself on the "
        "workers in a `%%distribute` cell (a lock, a file, a connection belongs to one "
        "process).")
    said = refused(mw, "%distribute push learning_rat")
    assert said == (
        "push: no variable 'learning_rat' in the kernel: push sends the kernel's variables as "
        "they are now. For 'learning_rat', did you mean `learning_rate`? Run the cell that "
        "assigns it first, or check its spelling (`%who` lists the kernel's variables).")
    for name in ("kernel_only", "a_lock", "learning_rate"):
        del mw.user_ns[name]


def test_a_constant_loss_on_the_workers_is_refused_before_training(mw):
    said = refused(mw, "%%distribute --step --data ds\nx, y = batch\nloss = 0.5\n",
                   StepCodeError)
    assert said.startswith("[all 2 workers] cell line 3 `loss = 0.5`: `loss` is the Python "
                           "float 0.5: it "
                           "depends neither on the batch nor on any variable"), said


def test_a_multiworker_run_saved_to_and_resumed_from_a_checkpoint_says_so(mw, tmp_path):
    """A run that stops at a NaN in its second epoch keeps its first; the next resumes."""
    from cluster_cells import STEP
    from helpers import run_ok

    import nbdist

    ckpt = tmp_path / "ck"
    nan_at_6 = STEP.format(data="ds", flags=f"--steps 4 --epochs 3 --checkpoint {ckpt}") + (
        "loss = tf.where(optimizer.iterations >= 6, tf.constant(float('nan')), loss)\n")
    run_err(mw, nan_at_6)
    stopped = nbdist.runs[-1]
    assert (stopped.status, stopped.checkpoint, stopped.resumed_at) == \
        ("failed", f"{ckpt}/step", None)
    run_ok(mw, STEP.format(data="ds", flags=f"--steps 4 --epochs 3 --checkpoint {ckpt}"))
    resumed = nbdist.runs[-1]
    assert resumed.checkpoint == f"{ckpt}/step"
    assert (resumed.resumed_from, resumed.resumed_at) == (stopped, 4), resumed.metrics
