"""Checkpoints under multiworker: a run resumes after a worker is killed, in step mode and
in fit."""

import os
import re

import numpy as np
import pytest
from helpers import run_err, run_ok
from test_checkpoint import DATA, FIT, MODEL, STEP

import nbdist
from nbdist.cluster.failures import WorkerDied
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.session import current_session


@pytest.fixture(scope="module")
def mw(ip, tmp_path_factory):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    yield ip, tmp_path_factory.mktemp("mw")
    ip.run_line_magic("distribute", "stop")
    assert live_clusters() == []
    ip.run_line_magic("distribute", "mirrored --devices 4")


def _fresh_workers(ip, seed):
    """What a user does after a restart: data and model again (the workers are new)."""
    run_ok(ip, "%%distribute\nimport os, signal\n" + DATA + f"\nSEED = {seed}\n"
               "kill = lambda: os.kill(os.getpid(), signal.SIGKILL)\ntrain_ds = clean_ds\n")
    run_ok(ip, MODEL)


def _killed_then_resumed(ip, cell, how, ckpt, capsys):
    """Run ``cell`` with --checkpoint until worker 1 SIGKILLs itself (``how``), restart the
    cluster, rebuild data and a fresh model, run the same cell again."""
    _fresh_workers(ip, seed=1)
    run_ok(ip, f"%%distribute\nif nbdist_worker == 1:\n    {how}\n")
    victim = current_session().backend.info[1]["pid"]
    err = run_err(ip, cell.format(flags=f"--checkpoint {ckpt}"))
    assert isinstance(err, WorkerDied) and f"worker 1 (pid {victim}) died" in str(err), err
    died = nbdist.runs[-1]
    assert died.status == "failed"
    ip.run_line_magic("distribute", "restart")
    _fresh_workers(ip, seed=2)
    capsys.readouterr()
    run_ok(ip, cell.format(flags=f"--checkpoint {ckpt}"))
    return died, nbdist.runs[-1], capsys.readouterr().out


def assert_continues(resumed, died):
    """Steps 16.. on both workers; the steps both runs did have the same losses per worker."""
    frame = resumed.metrics
    assert resumed.status == "done" and resumed.workers == 2
    assert frame.groupby("worker")["step"].agg(["min", "max"]).values.tolist() == [[16, 23]] * 2
    assert set(frame["epoch"]) == {2}
    assert any(re.match(r"resumed from epoch 2 of 3 in ", n) for n in resumed.notes)

    def per_worker(run):
        return run.metrics.groupby(["step", "worker"])["loss"].sum()

    before, after = per_worker(died), per_worker(resumed)
    both = sorted(set(before.index) & set(after.index))
    assert both and both[0] == (16, 0), both        # the dead run got into epoch 3
    np.testing.assert_allclose(after[both], before[both], rtol=1e-5)


def test_multiworker_step_mode_resumes_after_a_worker_is_killed(mw, capsys):
    ip, tmp = mw
    ckpt = str(tmp / "step-run")
    # the pipeline prefetches: fetching epoch 3's last batch happens during epoch 3
    died, resumed, out = _killed_then_resumed(
        ip, STEP, "train_ds = dying(clean_ds, 3 * 8, kill)", ckpt, capsys)
    assert 16 <= died.steps_done < 24
    assert f"[worker 0] nbdist: resumed from epoch 2 of 3 in {ckpt}/step" in out
    assert "[worker 1] nbdist: resumed" not in out           # said once
    assert_continues(resumed, died)
    assert not os.path.exists(os.path.join(ckpt, "step"))


def test_multiworker_fit_resumes_after_a_worker_is_killed(mw, capsys):
    ip, tmp = mw
    ckpt = str(tmp / "fit-run")
    died, resumed, out = _killed_then_resumed(
        ip, FIT, "hooks = at_batch(2, 3, kill)", ckpt, capsys)
    # killed in step 19; the survivor, blocked in the collective, is killed ~3 s later, after
    # it sent the rows it had recorded since its last send (it sends every 0.1 s)
    assert died.steps_done == 19 and died.mode == "fit"
    assert f"[worker 0] nbdist: resumed from epoch 2 of 3 in {ckpt}/fit1" in out
    assert resumed.mode == "fit"
    assert_continues(resumed, died)
    assert not os.path.exists(os.path.join(ckpt, "fit1", "chief"))


def _worker_weights(ip):
    run_ok(ip, "%%distribute\nfinal_weights = model.get_weights()")
    return current_session().pull("final_weights", worker=0)


def test_multiworker_checkpoint_every_resumes_mid_epoch_to_the_uninterrupted_weights(mw,
                                                                                   capsys):
    """--checkpoint-every 4 on 2 workers: `inject kill 1 --at-step 22` SIGKILLs worker 1 in
    epoch 3, after the save before step 20; restarted, both workers resume inside epoch 3,
    skipping the 4 batches of it they trained on, and end on the weights of a run that was
    never killed."""
    ip, tmp = mw
    ckpt = str(tmp / "every-run")
    cell = STEP.format(flags=f"--checkpoint {ckpt} --checkpoint-every 4")
    _fresh_workers(ip, seed=1)
    ip.run_line_magic("distribute", "inject kill 1 --at-step 22")
    err = run_err(ip, cell)
    assert isinstance(err, WorkerDied) and "worker 1" in str(err), err
    died = nbdist.runs[-1]
    ip.run_line_magic("distribute", "restart")
    _fresh_workers(ip, seed=2)
    capsys.readouterr()
    run_ok(ip, cell)
    resumed, out = nbdist.runs[-1], capsys.readouterr().out
    assert (f"[worker 0] nbdist: resumed at epoch 3 of 3, step 5 of the epoch, in {ckpt}/step "
            "(20 steps restored; the first 4 batches of epoch 3 are skipped: they were trained "
            "on).") in out, out
    assert "[worker 1] nbdist: resumed" not in out           # said once
    frame = resumed.metrics
    assert resumed.status == "done"
    assert frame.groupby("worker")["step"].agg(["min", "max"]).values.tolist() == [[20, 23]] * 2
    both = frame.groupby(["step", "worker"])["loss"].sum()
    before = died.metrics.groupby(["step", "worker"])["loss"].sum()
    shared = sorted(set(both.index) & set(before.index))
    assert shared and shared[0] == (20, 0), shared           # the same batches at step 20
    np.testing.assert_allclose(both[shared], before[shared], rtol=1e-5)
    finished = _worker_weights(ip)
    ip.run_line_magic("distribute", "restart")                # the same training, never killed
    _fresh_workers(ip, seed=1)
    run_ok(ip, STEP.format(flags=""))
    for a, b in zip(finished, _worker_weights(ip), strict=True):
        assert np.abs(a - b).max() < 1e-5
    assert not os.path.exists(os.path.join(ckpt, "step"))
