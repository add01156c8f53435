"""``--elastic``: a step cell whose worker dies restarts its workers and finishes by itself.

A real 2-worker cluster: worker 1 is SIGKILLed mid-epoch by `%distribute inject kill 1
--at-step K`; the cell restarts the workers, replays the cells and pushes that built their
state, restores its last checkpoint and finishes with the weights of an uninterrupted run
(training is deterministic here: no shuffling, CPU). Then more deaths than --elastic allows,
what cannot be replayed, the refusals, and no process left after `%distribute stop`.
"""

import os

import numpy as np
import psutil
import pytest
from helpers import run_err, run_ok
from test_checkpoint import STEP as EPOCHS_3_STEP

import nbdist
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.cluster.multiworker.elastic import ElasticGaveUp
from nbdist.errors import ConfigError
from nbdist.session import current_session
from nbdist.widgets.figure import run_figure

EPOCHS, PER_EPOCH = 2, 8

DATA = """%%distribute
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 32
rng = np.random.default_rng(7)
xs = rng.normal(size=(GLOBAL_BATCH * 8, 4)).astype("float32")
ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
train_ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(GLOBAL_BATCH, drop_remainder=True)
"""

MODEL = """%%distribute
tf.keras.utils.set_random_seed(SEED)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="tanh"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam(learning_rate)
"""

STEP = EPOCHS_3_STEP.replace("--epochs 3", f"--epochs {EPOCHS}")   # its flags: {flags}

WEIGHTS = "%%distribute\nweights = [w.numpy() for w in model.weights]\n"


def test_refused_without_checkpoint_and_where_no_worker_restarts(ip, tmp_path):
    runs = len(nbdist.runs)
    err = run_err(ip, STEP.format(flags="--elastic"))
    assert isinstance(err, ConfigError) and "--elastic needs --checkpoint DIR" in str(err)
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp_path / 'c'} --elastic"))
    assert isinstance(err, ConfigError), err
    assert "--elastic is not available under mirrored" in str(err), err
    inline = STEP.replace("%%distribute --step", "%%distribute parameter_server --step")
    err = run_err(ip, inline.format(flags=f"--checkpoint {tmp_path / 'c'} --elastic"))
    assert isinstance(err, ConfigError), err   # refused before any process starts
    assert "--elastic is not available under parameter_server: nbdist does not yet" in str(err)
    assert current_session().backend.spec.name == "mirrored"
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp_path / 'c'} --elastic 0"))
    assert isinstance(err, ConfigError) and "at least 1" in str(err), err
    assert len(nbdist.runs) == runs and not os.path.exists(tmp_path / "c")


@pytest.fixture(scope="module")
def mw(ip, tmp_path_factory):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    tmp = tmp_path_factory.mktemp("elastic")
    run_ok(ip, DATA)
    ip.user_ns["learning_rate"] = 0.01
    ip.run_line_magic("distribute", "push learning_rate")   # replayed as pushed
    ip.user_ns["learning_rate"] = 99.0                      # ... not as it is now
    yield ip, tmp
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")


def _weights(ip, seed):
    """A fresh model (seed ``seed``) trained by the step cell; its weights, from worker 0."""
    run_ok(ip, f"%%distribute\nSEED = {seed}\n")
    run_ok(ip, MODEL)
    return seed


def _pulled(ip):
    run_ok(ip, WEIGHTS)
    ip.run_line_magic("distribute", "pull weights")
    return ip.user_ns["weights"]


def _processes():
    return list(current_session().backend.processes())


@pytest.mark.cluster
def test_a_killed_worker_costs_a_restart_and_the_weights_are_the_same(mw, capsys):
    ip, tmp = mw
    _weights(ip, seed=3)
    run_ok(ip, STEP.format(flags=f"--checkpoint {tmp / 'plain'}"))
    plain = nbdist.runs[-1]
    expected = _pulled(ip)
    assert plain.status == "done" and plain.restarts == []

    _weights(ip, seed=3)
    first_engines = _processes()
    ip.run_line_magic("distribute", "inject kill 1 --at-step 11")   # mid epoch 2
    capsys.readouterr()
    run_ok(ip, STEP.format(flags=f"--checkpoint {tmp / 'elastic'} --elastic"))
    out = capsys.readouterr().out
    run = nbdist.runs[-1]
    assert run.status == "done" and run is not plain
    [restart] = run.restarts
    assert restart.workers == (1,) and restart.step == 11, restart
    assert restart.resumed_at == PER_EPOCH                # the start of epoch 2
    assert restart.replayed >= 5                          # data, push, models, weights...
    assert restart.start_s > 0 and restart.replay_s > 0 and restart.restore_s > 0
    assert restart.seconds == pytest.approx(
        restart.start_s + restart.replay_s + restart.restore_s)
    assert "worker 1 (pid" in out and "--elastic: restart 1 of 3" in out, out
    assert "nbdist: restart 1: worker 1 (pid" in out and "s lost (start" in out, out
    assert any(n.startswith("restart 1 (--elastic): worker 1") for n in run.notes)
    marks = [t["name"] for t in run_figure(run)["data"]
             if t.get("name", "").startswith("restart ")]
    assert len(marks) == 1 and " died after step 11, resumed at step 8, " in marks[0], marks
    frame = run.metrics   # every step once per worker, the re-run ones not twice
    assert sorted(frame.groupby("worker")["step"].agg(list).map(sorted).tolist()) == \
        [list(range(EPOCHS * PER_EPOCH))] * 2
    got = _pulled(ip)
    assert len(got) == len(expected)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, expected, strict=True)) < 1e-5
    assert not os.path.exists(tmp / "elastic" / "step")   # done: the backup is gone
    assert not [p for p in first_engines if p.is_running()
                and p.status() != psutil.STATUS_ZOMBIE]   # the old workers were stopped


@pytest.mark.cluster
def test_a_worker_dead_since_the_last_cell_is_replaced_before_the_run(mw):
    ip, tmp = mw
    _weights(ip, seed=6)
    victim = psutil.Process(current_session().backend.info[1]["pid"])
    ip.run_line_magic("distribute", "inject kill 1")
    victim.wait(timeout=30)
    run_ok(ip, STEP.format(flags=f"--checkpoint {tmp / 'between'} --elastic 1"))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == EPOCHS * PER_EPOCH
    [restart] = run.restarts
    assert restart.died == f"worker 1 (pid {victim.pid})" and restart.step is None, restart
    assert restart.resumed_at == 0 and restart.restore_s > 0


@pytest.mark.cluster
def test_more_deaths_than_restarts_end_the_cell_naming_each(mw, capsys):
    ip, tmp = mw
    _weights(ip, seed=4)
    for worker, step in ((1, 3), (0, 5), (1, 7)):
        ip.run_line_magic("distribute", f"inject kill {worker} --at-step {step}")
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp / 'thrice'} --elastic 2"))
    assert isinstance(err, ElasticGaveUp), err
    text = str(err)
    assert "the most --elastic 2 allows" in text, text
    for number, (worker, step) in enumerate(((1, 3), (0, 5), (1, 7)), 1):
        assert f"{number}. worker {worker} (pid" in text and f"after step {step}" in text, text
    run = nbdist.runs[-1]
    assert run.status == "failed" and len(run.restarts) == 2
    assert os.path.exists(tmp / "thrice" / "step")   # kept for the next run


@pytest.mark.cluster
def test_the_same_worker_dying_again_at_the_same_step_ends_the_cell(mw):
    ip, tmp = mw
    _fresh_journal(ip)   # the cell before left the workers broken
    _weights(ip, seed=7)
    for _ in range(2):   # the second is sent again to the fresh worker 1
        ip.run_line_magic("distribute", "inject kill 1 --at-step 3")
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp / 'same'} --elastic"))
    assert isinstance(err, ElasticGaveUp), err
    text = str(err)
    assert "died again at the same step (3)" in text, text
    assert "1. worker 1 (pid" in text and "2. worker 1 (pid" in text, text
    assert len(nbdist.runs[-1].restarts) == 1 and nbdist.runs[-1].status == "failed"


def _fresh_journal(ip):
    """Fresh workers (a new journal), with the module's data and pushed learning rate."""
    ip.run_line_magic("distribute", "restart")
    run_ok(ip, DATA)
    ip.user_ns["learning_rate"] = 0.01
    ip.run_line_magic("distribute", "push learning_rate")


@pytest.mark.cluster
def test_what_cannot_be_replayed_is_refused_naming_it(mw, capsys):
    ip, tmp = mw
    _fresh_journal(ip)
    _weights(ip, seed=5)
    runs = len(nbdist.runs)
    run_ok(ip, "double = lambda x: 2 * x")   # ipyparallel sends its code; pickle cannot
    ip.run_line_magic("distribute", "push double")
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp / 'refused'} --elastic"))
    assert isinstance(err, ConfigError) and "`%distribute push double` cannot be pushed " \
        "again" in str(err) and "the cell did not run" in str(err), err
    assert len(nbdist.runs) == runs and not os.path.exists(tmp / "refused")
    capsys.readouterr()
    ip.run_line_magic("distribute", "status")   # says so before any elastic cell is tried
    assert ("journal    5 cells and pushes built the workers' state; --elastic replays them "
            "on fresh workers (it cannot: `%distribute push double`") in capsys.readouterr().out

    ip.run_line_magic("distribute", "restart")
    run_ok(ip, DATA)
    client = current_session().backend.engines.client
    client[:].execute("learning_rate = 0.01", block=True)   # as %px would
    run_ok(ip, MODEL.replace("tf.keras.utils.set_random_seed(SEED)", ""))
    err = run_err(ip, STEP.format(flags=f"--checkpoint {tmp / 'refused'} --elastic"))
    assert isinstance(err, ConfigError) and "`learning_rate = 0.01`" in str(err), err
    assert "without nbdist" in str(err) and len(nbdist.runs) == runs


@pytest.mark.cluster
def test_no_process_is_left_after_stop(mw):
    ip, _ = mw
    processes = _processes()
    assert processes
    ip.run_line_magic("distribute", "stop")
    assert live_clusters() == []
    gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
