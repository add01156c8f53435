"""`%distribute multiworker` with real ipyparallel engines running MultiWorkerMirroredStrategy.

One 2-worker cluster serves the module (starting one takes seconds); a test that finds it
broken by a fault test (a worker killed or stopped) restarts it first. The kernel's own
strategy (4 logical CPUs, conftest) is restored at the end for the other test modules.
"""

import os
import re
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from cluster_cells import SCOPE_LOOP, SETUP, STEP, raising_input, stuck_input
from helpers import PROMPT_S, StopAfter, interrupt_me, once_running, run_err, run_ok, when

import nbdist
from nbdist.cluster.failures import (
    ClusterError,
    ControllerDied,
    WorkerDied,
    WorkerError,
    WorkerStuck,
)
from nbdist.cluster.multiworker import dispatch, stall
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.errors import ConfigError, RunInterrupted, StepCodeError
from nbdist.session import current_session


@pytest.fixture(scope="module")
def mw_module(ip):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    session = current_session()
    run_ok(ip, SETUP)
    yield ip
    procs = session.backend.processes() if session.backend is not None else []
    ip.run_line_magic("distribute", "stop")
    assert live_clusters() == []
    assert not [p.pid for p in procs if _alive(p)], "processes left after %distribute stop"
    ip.run_line_magic("distribute", "mirrored --devices 4")


@pytest.fixture
def mw(mw_module):
    """The module's cluster, usable: after a test that broke it (the fault tests kill or stop a
    worker) it is restarted and set up again, so no test depends on the order they run in."""
    if cluster() is None or cluster().broken:
        mw_module.run_line_magic("distribute", "restart")
        run_ok(mw_module, SETUP)
    return mw_module


def _alive(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ended(pid):
    try:
        return not _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return True


def cluster():
    return current_session().backend


def test_status_shows_spec_tf_config_health_devices_and_keras(mw, capsys):
    mw.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    spec = cluster().info[0]["tf_config"]["cluster"]
    assert "multiworker (tf.distribute.MultiWorkerMirroredStrategy)" in out
    assert f'"worker": ["{spec["worker"][0]}", "{spec["worker"][1]}"]' in out
    for i in (0, 1):
        assert f'"task": {{"type": "worker", "index": {i}}}' in out
        assert f"/job:worker/replica:0/task:{i}/device:CPU:0" in out
    assert out.count("alive, pid") == 2 and "heartbeat" in out and "idle" in out
    assert "workers run tf_keras" in out and "keras-team/keras#20585" in out
    assert "0 dropped" in out and "none on collectives" in out
    assert "strategy = tf.distribute.MultiWorkerMirroredStrategy()" in out


def test_no_socket_we_open_is_open_to_other_hosts(mw, capsys):
    """In the kernel's network namespace the kernel and its processes listen on loopback at
    most (the controller and the channel on Unix sockets); the workers, whose TensorFlow
    servers bind all interfaces whatever TF_CONFIG says, run in a private network namespace
    (tests/test_isolation.py tries every port from another host)."""
    workers = cluster().info[0]["tf_config"]["cluster"]["worker"]
    tf_ports = {int(a.rsplit(":", 1)[1]) for a in workers}
    listening = []
    for proc in [psutil.Process(), *cluster().processes()]:
        listening += [c.laddr for c in proc.net_connections("inet")
                      if c.status == psutil.CONN_LISTEN]
    assert {a.ip for a in listening} <= {"127.0.0.1"}, listening
    assert not tf_ports & {a.port for a in listening}
    assert cluster().channel.address[0].startswith("/")   # a Unix socket
    kernel_net = os.readlink("/proc/self/ns/net")
    assert {os.readlink(f"/proc/{info['pid']}/ns/net") for info in cluster().info} \
        - {kernel_net}
    mw.run_line_magic("distribute", "status")
    assert "network    no port is open to other hosts" in capsys.readouterr().out


class Recorder:
    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append((time.monotonic(), text))

    def flush(self):
        pass

    def text(self):
        return "".join(t for _, t in self.parts)


def test_cells_run_everywhere_keep_their_namespace_and_stream_output_live(mw, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(sys, "stdout", rec)
    run_ok(mw, "%%distribute\nimport time\nseen = nbdist_worker * 10\nprint('before', seen)\n"
               "time.sleep(2)\nprint('after')")
    ended = time.monotonic()
    result = run_ok(mw, "%%distribute\nseen + 1")
    monkeypatch.undo()
    text = rec.text()
    assert "[worker 0] before 0\n" in text and "[worker 1] before 10\n" in text
    first = min(t for t, s in rec.parts if "before" in s)
    assert ended - first > 1.5, "worker output arrived only at the end of the cell"
    assert repr(result) == "[worker 0] 1\n[worker 1] 11"


def test_an_error_on_every_worker_shows_one_traceback_with_the_cell_line(mw):
    err = run_err(mw, "%%distribute\nok = 1\nraise ValueError('boom')\n")
    assert isinstance(err, WorkerError)
    assert str(err) == "[all 2 workers] ValueError: boom" and err.cell_line == 3
    text = "\n".join(err._render_traceback_())
    assert text.count("raise ValueError('boom')") == 1 and "[worker 0]   cell line 3" in text


def test_a_worker_traceback_shows_the_users_frames_not_nbdists(mw):
    """Through nbdist's recording of model.fit on the workers, into tf_keras."""
    run_ok(mw, "%%distribute\nmodel.compile(optimizer='sgd', loss='mse')\n")
    err = run_err(mw, "%%distribute\nmodel.fit(ds, epochs='two', verbose=0)\n")
    assert isinstance(err, WorkerError) and err.cell_line == 2
    text = "\n".join(err._render_traceback_())
    assert "cell line 2, in <module>" in text and "model.fit(ds, epochs='two'" in text
    assert "tf_keras" in text and "nbdist/" not in text, text


def test_an_error_on_one_worker_names_it(mw):
    err = run_err(mw, "%%distribute\nif nbdist_worker == 1:\n    {}['missing']\n")
    assert str(err).startswith("[worker 1] KeyError: 'missing'")
    assert "1 other worker finished" in str(err) and err.cell_line == 3


def test_step_code_errors_are_reported_once_before_dispatch(mw):
    err = run_err(mw, "%%distribute --step --data ds\nx, y = batch\nreturn x\n")
    assert isinstance(err, StepCodeError) and "cell line 3 `return x`" in str(err)


def test_push_and_pull(mw):
    mw.user_ns["lr_scale"] = 3
    mw.run_line_magic("distribute", "push lr_scale")
    run_ok(mw, "%%distribute\nscaled = lr_scale * (nbdist_worker + 1)")
    mw.run_line_magic("distribute", "pull scaled --worker 1")
    assert mw.user_ns["scaled"] == 6
    assert nbdist.session.current_session().pull("scaled") == 3
    with pytest.raises(ConfigError, match="worker 0 has no variable `nothing_here`"):
        mw.run_line_magic("distribute", "pull nothing_here")


def test_step_mode_streams_rows_of_every_worker_live(mw):
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.wait(0.05):
            run = nbdist.runs[-1] if nbdist.runs else None
            if run is not None and run.strategy == "multiworker" and run.mode == "step":
                seen.append((run.status, run.n_rows))

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        run_ok(mw, STEP.format(data="ds", flags="--epochs 2"))
    finally:
        stop.set()
        thread.join()
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.status == "done" and run.steps_done == 16 and run.total_steps == 16
    assert frame.groupby("worker").size().to_dict() == {0: 16, 1: 16}
    assert frame["loss"].notna().all() and frame["grad_norm"].notna().all()
    assert any(status == "running" and 0 < n < 32 for status, n in seen), seen
    assert frame.loc[frame.step == 15, "loss"].nunique() == 2   # each worker's own batch
    # the workers' tf_keras optimizer all-reduces through merge_call; the probe times it too
    timed = frame[frame.allreduce_ms.notna()]
    assert set(timed.worker) == {0, 1} and (timed.allreduce_ms > 0).all()
    assert (timed.compute_ms >= 0).all() and not any("no all_reduce" in n for n in run.notes)
    assert not any("same data" in n for n in run.notes), run.notes   # auto-sharded


SAME_DATA_FN = """%%distribute
same_xs = np.random.default_rng(0).normal(size=(GLOBAL_BATCH * 4, 4)).astype("float32")
def {name}(input_context):
    per_replica = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
    data = tf.data.Dataset.from_tensor_slices((same_xs, same_xs.sum(axis=1, keepdims=True)))
    {shard}return data.batch(per_replica, drop_remainder=True)
"""


def test_workers_reading_the_same_data_are_named_with_the_fix(mw, capsys):
    """A dataset function that never shards gives both workers the same batches (TensorFlow's
    most reported multi-worker input mistake): the Run and the cell say so, with the fix; the
    same function sharded by its input context says nothing."""
    run_ok(mw, SAME_DATA_FN.format(name="unsharded_fn", shard=""))
    capsys.readouterr()
    run_ok(mw, STEP.format(data="unsharded_fn", flags=""))
    run, out = nbdist.runs[-1], capsys.readouterr().out
    assert run.status == "done"
    said = [n for n in run.notes if "same data" in n]
    assert len(said) == 1 and said[0].startswith("workers 0 and 1 trained on the same data")
    assert "input_context.input_pipeline_id" in said[0] and f"nbdist: {said[0]}" in out
    run_ok(mw, SAME_DATA_FN.format(name="sharded_fn", shard=(
        "data = data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)"
        "\n    ")))
    run_ok(mw, STEP.format(data="sharded_fn", flags=""))
    run = nbdist.runs[-1]
    assert run.status == "done" and not any("same data" in n for n in run.notes), run.notes
    assert "same data" not in capsys.readouterr().out


def _trained(mw, flags, data="ds", observers=None):
    """From the same start weights: the step cell's Run and each worker's weights after it."""
    run_ok(mw, "%%distribute\nmodel.set_weights([np.full(w.shape, 0.1, 'float32') "
               "for w in model.get_weights()])")
    if observers is None:
        run_ok(mw, STEP.format(data=data, flags=flags))
        run = nbdist.runs[-1]
    else:   # as the dashboard runs it: its Stop button is an observer
        from nbdist.spec import RunSpec

        header, body = STEP.format(data=data, flags=flags).split("\n", 1)
        spec = RunSpec(step=True, data=data, steps=100000, steps_per_call=4)
        run = current_session().run_step_cell(body, spec, observers, header=header)
    run_ok(mw, "%%distribute\ntrained = model.get_weights()")
    return run, [current_session().pull("trained", worker=w) for w in (0, 1)]


def test_steps_per_call_train_what_one_step_per_call_trains_and_stop_on_both_workers(mw):
    """Calls of 3 steps on 2 workers (each epoch's last call is shorter): one row per step and
    worker, the same timed steps on both (they agree on the spacing), the weights of one step
    per call. A Stop request in calls of 4 ends both workers after the same call, with the
    weights of that many steps of one step per call."""
    one, one_weights = _trained(mw, "--epochs 2")
    three, three_weights = _trained(mw, "--epochs 2 --steps-per-call 3")
    for run in (one, three):
        assert run.status == "done" and run.metrics.groupby("worker").size().to_dict() == {
            0: 16, 1: 16}
    np.testing.assert_array_equal(*(r.metrics.sort_values(["step", "worker"])["loss"]
                                    for r in (one, three)))
    timed = three.metrics[three.metrics.allreduce_ms.notna()]
    assert set(timed[timed.worker == 0].step) == set(timed[timed.worker == 1].step)
    for weights in (*one_weights, *three_weights):
        for a, b in zip(weights, one_weights[0], strict=True):
            np.testing.assert_array_equal(a, b)

    stopped, stopped_weights = _trained(mw, "--steps 100000 --steps-per-call 4", "long_ds",
                                        [StopAfter(rows=20)])
    last = stopped.metrics.groupby("worker")["step"].max().to_dict()
    assert stopped.status == "stopped" and last[0] == last[1]
    assert len(stopped.metrics) == 2 * (last[0] + 1)
    _, weights = _trained(mw, f"--steps {last[0] + 1}", "long_ds")
    for a, b in zip(stopped_weights[0] + stopped_weights[1], weights[0] + weights[0],
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_fit_runs_tf_keras_on_the_workers_and_is_recorded(mw, tf_keras):
    assert cluster().keras == "legacy"
    value = run_ok(mw, """%%distribute
model.compile(optimizer="sgd", loss="mse")
history = model.fit(ds, epochs=2, verbose=0)
(type(model).__module__.split(".")[0], float(history.history["loss"][-1]))
""")
    keras, loss = eval(repr(value))
    assert keras == "tf_keras"
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.mode == "fit" and run.status == "done" and run.steps_done == 16
    # the fit's length, known on the workers when it starts, reached the kernel's Run (the
    # dashboard's progress bar and time left)
    assert (run.total_steps, run.epochs) == (16, 2)
    assert frame.groupby("worker").size().to_dict() == {0: 16, 1: 16}
    assert (frame["replica"] == -1).all()
    assert frame["loss"].iloc[-1] == pytest.approx(loss, rel=1e-6)
    # each batch's own loss beside tf_keras's running mean, and worker 0's epoch logs
    last = frame[(frame["worker"] == 0) & (frame["epoch"] == 1)]
    assert last["batch_loss"].mean() == pytest.approx(last["loss"].iloc[-1], rel=1e-4)
    assert list(run.epoch_metrics["step"]) == [7, 15]
    assert run.epoch_metrics["loss"].iloc[-1] == pytest.approx(loss, rel=1e-6)


def test_the_workers_tf_keras_weights_come_to_the_kernels_keras3_as_the_start_says(mw, tf_keras):
    """The starting message says the workers run tf_keras and this kernel Keras 3, and how
    to bring a trained model over; doing what it says gives the kernel the workers' weights."""
    from nbdist.cluster.multiworker.keras_choice import MIXED_KERAS

    assert MIXED_KERAS in cluster().starting_message()
    assert "run `%distribute pull model` (its name)" in MIXED_KERAS
    run_ok(mw, "%%distribute\nweights = model.get_weights()")
    mw.run_line_magic("distribute", "pull model")
    kernel_model, trained = mw.user_ns["model"], current_session().pull("weights", worker=0)
    assert type(kernel_model).__module__.startswith("keras.src.")
    for mine, theirs in zip(kernel_model.get_weights(), trained, strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_keras3_fit_on_workers_fails_at_once_with_the_way_out(mw, monkeypatch):
    """The path taken without tf_keras (or with --keras keras3): Keras 3 is tf.keras on the
    workers, and its fit is refused before it can fail deep inside TensorFlow."""
    run_ok(mw, "%%distribute\nimport keras\nk3 = keras.Sequential([keras.Input((4,)), "
               "keras.layers.Dense(1)])\nk3.compile(optimizer='sgd', loss='mse')")
    err = run_err(mw, "%%distribute\nk3.fit(ds, epochs=1, verbose=0)")
    assert type(err).__name__ == "KerasUnsupported" and "keras-team/keras#20585" in str(err)
    assert "--keras legacy" in str(err) and "step mode" in str(err)


@pytest.mark.parametrize("attempt", range(3))   # the status was one or the other at random
def test_kernel_interrupt_stops_every_worker_at_the_same_step(mw, attempt):
    timer, sent = once_running(interrupt_me)
    err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100000"))
    returned = time.monotonic()
    timer.join()
    assert isinstance(err, RunInterrupted), repr(err)
    # the step-boundary stop, not the SIGINT the kernel sends to workers still running then
    assert returned - sent[0] < dispatch.ESCALATE_S, \
        f"{returned - sent[0]:.1f} s: the workers did not stop at a step boundary"
    run = nbdist.runs[-1]
    last = run.metrics.groupby("worker")["step"].max().to_dict()
    assert run.status == "interrupted" and last[0] == last[1]
    assert len(run.metrics) == 2 * (last[0] + 1)          # whole steps on both workers
    run_ok(mw, STEP.format(data="ds", flags="--steps 2"))  # still usable
    assert nbdist.runs[-1].status == "done"
    # the workers' own ends of the interrupted run arrive late, but before anything of the
    # next run on the same connections: they did not change what the kernel decided
    assert run.status == "interrupted"


def test_a_stop_request_ends_the_run_stopped(mw):
    cell = STEP.format(data="long_ds", flags="--steps 100000")
    header, body = cell.split("\n", 1)
    from nbdist.spec import RunSpec

    spec = RunSpec(step=True, data="long_ds", steps=100000)
    run = current_session().run_step_cell(body, spec, [StopAfter()], header=header)
    last = run.metrics.groupby("worker")["step"].max().to_dict()
    assert run.status == "stopped" and last[0] == last[1]
    # the workers' own ends arrive late, but before anything of a next run on the same
    # connections: once that run is done, they have been seen
    run_ok(mw, STEP.format(data="ds", flags="--steps 2"))
    assert nbdist.runs[-1].status == "done" and run.status == "stopped"


def test_kernel_interrupt_of_plain_code_interrupts_the_workers(mw, monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(sys, "stdout", rec)
    watcher, sent = when(lambda: rec.text().count("sleeping") == 2, interrupt_me)
    err = run_err(mw, "%%distribute\nimport time\nprint('sleeping')\ntime.sleep(60)\n")
    returned = time.monotonic()
    watcher.join()
    monkeypatch.undo()
    assert isinstance(err, RunInterrupted) and "KeyboardInterrupt" in str(err), repr(err)
    assert returned - sent[0] < PROMPT_S, "the workers went on sleeping after the interrupt"
    assert repr(run_ok(mw, "%%distribute\nnbdist_worker")) == "[worker 0] 0\n[worker 1] 1"


def _gone_at(pid):
    """A thread noting when process ``pid`` ends (``when`` polls every 50 ms)."""
    return when(lambda: not _alive(psutil.Process(pid)) if psutil.pid_exists(pid) else True,
                lambda: None)


def test_inject_kill_at_a_step_fails_the_cell_fast_ends_the_survivor_and_restart_recovers(
        mw, capsys):
    victim, survivor = (cluster().info[i]["pid"] for i in (1, 0))
    mw.run_line_magic("distribute", "inject kill 1 --at-step 30")
    mw.run_line_magic("distribute", "status")
    assert "kill worker 1 after step 30" in capsys.readouterr().out.split("injected")[1]
    watcher, killed = _gone_at(victim)
    survivor_watch, survivor_ended = _gone_at(survivor)
    err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100000"))
    failed = time.monotonic()
    watcher.join()
    assert isinstance(err, WorkerDied), repr(err)
    assert f"worker 1 (pid {victim}) died after step 30" in str(err), str(err)
    assert "%distribute restart" in str(err)
    # The survivor's collective fails by itself (UnavailableError) or, still blocked after
    # SURVIVOR_GRACE_S, it is ended: collectives have no timeout of their own.
    assert re.search(r"worker 0 (stopped with|was still blocked .* was ended)", str(err)), err
    ended = "was ended" in str(err)
    if ended:
        survivor_watch.join(PROMPT_S)
    with capsys.disabled():
        print(f"\nkill -> cell error {failed - killed[0]:.1f} s"
              + (f", -> survivor ended {survivor_ended[0] - killed[0]:.1f} s" if ended else ""))
    # a survivor left in its collective (which has no timeout) would wait forever
    assert failed - killed[0] < PROMPT_S, "the cell did not end after the kill"
    assert not ended or survivor_ended[0] - killed[0] < PROMPT_S, "the survivor was not ended"
    assert nbdist.runs[-1].status == "failed" and nbdist.runs[-1].steps_done >= 30
    shown = capsys.readouterr()
    # the error once (the run's summary points at it), no engine log lines on stderr
    assert shown.out.count(f"worker 1 (pid {victim}) died after step 30") == 1, shown.out
    assert "Output for" not in shown.err and "[IPEngine" not in shown.err, shown.err
    mw.run_line_magic("distribute", "status")
    assert "kill worker 1 after step 30" in capsys.readouterr().out
    with pytest.raises(ClusterError, match="restart"):
        mw.run_cell("%%distribute\n1", store_history=False).raise_error()

    old = cluster().processes()
    mw.run_line_magic("distribute", "restart")
    assert not [p.pid for p in old if _alive(p)]
    assert cluster().broken is None and len(live_clusters()) == 1
    run_ok(mw, SETUP)
    run_ok(mw, STEP.format(data="ds", flags="--steps 2"))
    assert nbdist.runs[-1].status == "done"
    # what ipyparallel logs as the engines exit (when it notices) is kept off stderr
    later = capsys.readouterr()
    assert "Output for" not in later.err and "[IPEngine" not in later.err, later.err


@pytest.mark.parametrize("wait_s", [0.5, 12.0])   # 12 s: after the controller dropped it
def test_a_worker_killed_between_cells_fails_the_next_cell_at_once(mw, wait_s):
    run_ok(mw, STEP.format(data="ds", flags="--steps 8"))
    victim = cluster().info[1]["pid"]
    psutil.Process(victim).kill()
    time.sleep(wait_s)
    started = time.monotonic()
    err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100"))
    took = time.monotonic() - started
    print(f"\nkilled {wait_s:g} s before the cell: cell error after {took:.2f} s")
    assert isinstance(err, WorkerDied), repr(err)
    assert f"worker 1 (pid {victim}) died since the last cell, so this cell was not run " \
           "(its last run ended at step 8)" in str(err), str(err)
    assert "%distribute restart" in str(err)
    assert took < PROMPT_S, "the cell waited on the dead worker instead of refusing to run"
    assert cluster().broken


def test_a_stopped_worker_is_named_and_every_worker_ended(mw):
    victim = cluster().info[1]["pid"]
    mw.run_line_magic("distribute", "inject stop 1 --at-step 30")
    watcher, stopped = when(lambda: psutil.Process(victim).status() == psutil.STATUS_STOPPED,
                            lambda: None)
    err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100000"))
    returned = time.monotonic()
    watcher.join()
    assert isinstance(err, WorkerStuck), repr(err)
    assert "worker 1 is stuck at step 30: it did not answer" in str(err), str(err)
    assert "stopped (SIGSTOP?)" in str(err) and "%distribute restart" in str(err)
    assert str(err).startswith("A worker's process has been stopped for"), str(err)
    print(f"\nSIGSTOP -> cell error {returned - stopped[0]:.1f} s")
    assert returned - stopped[0] < PROMPT_S, "the cell went on waiting for the stopped worker"
    assert "[worker 1] (no answer)" in "\n".join(err._render_traceback_())
    # killed when the cell ends; a process of TensorFlow's size may take a moment to exit
    deadline = time.monotonic() + PROMPT_S
    while not _ended(victim):
        assert time.monotonic() < deadline, f"worker 1 (pid {victim}) is still running"
        time.sleep(0.1)
    assert cluster().broken


def test_a_worker_stopped_between_cells_is_named_before_the_cell_runs(mw):
    """SIGSTOP before the cell: refused at once, not broken; resumed, it trains again."""
    victim = psutil.Process(cluster().info[1]["pid"])
    victim.suspend()
    try:
        started = time.monotonic()
        err = run_err(mw, STEP.format(data="ds", flags="--steps 4"))
        assert time.monotonic() - started < PROMPT_S, "the cell waited on the stopped worker"
        assert isinstance(err, ConfigError), repr(err)
        assert f"worker 1 (pid {victim.pid}) is stopped" in str(err), str(err)
        assert f"kill -CONT {victim.pid}" in str(err) and not cluster().broken
    finally:
        victim.resume()
    run_ok(mw, STEP.format(data="ds", flags="--steps 4"))
    assert nbdist.runs[-1].status == "done"


def test_a_worker_stopped_before_its_first_step_is_named_before_the_first_step_rule(mw):
    """The first steps have a minute before the stall rule fires (they trace and compile);
    a stopped process is named without waiting for it."""
    victim = cluster().info[1]["pid"]
    watcher, stopped = when(lambda: nbdist.runs and nbdist.runs[-1].status == "running",
                            lambda: psutil.Process(victim).suspend())
    err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100000 --epochs 1"))
    returned = time.monotonic()
    watcher.join()
    print(f"\nSIGSTOP at the run's start -> cell error {returned - stopped[0]:.1f} s")
    assert isinstance(err, WorkerStuck), repr(err)
    assert "worker 1 is stuck" in str(err) and "it did not answer" in str(err), str(err)
    # named by the stopped-process check, not after the minute the first steps are given
    assert returned - stopped[0] < stall.FIRST_STEP_S / 2, f"{returned - stopped[0]:.1f} s"
    deadline = time.monotonic() + PROMPT_S
    while not _ended(victim):
        assert time.monotonic() < deadline, f"worker 1 (pid {victim}) is still running"
        time.sleep(0.1)
    assert cluster().broken


def _restart_and_train(mw, capsys):
    """``%distribute restart``, the setup cell again, then a step cell trains: seconds taken
    by each."""
    started = time.monotonic()
    mw.run_line_magic("distribute", "restart")
    restarted = time.monotonic()
    run_ok(mw, SETUP)
    run_ok(mw, STEP.format(data="ds", flags="--steps 4"))
    trained = time.monotonic()
    assert nbdist.runs[-1].status == "done" and cluster().broken is None
    with capsys.disabled():
        print(f"restart {restarted - started:.1f} s, setup + 4 steps "
              f"{trained - restarted:.1f} s")
    return restarted - started


@pytest.mark.parametrize("moment", ["between cells", "during a run"])
def test_the_controller_killed_is_named_with_what_is_lost_and_restart_trains(
        mw, capsys, moment):
    """SIGKILL to the ipyparallel controller: no worker failed, but none can be reached. The
    cell names the controller (not a worker), what is lost and what to run, within seconds."""
    controller = cluster().engines.controller_pid
    workers = [info["pid"] for info in cluster().info]
    if moment == "between cells":
        run_ok(mw, STEP.format(data="ds", flags="--steps 8"))
        psutil.Process(controller).kill()
        killed = [time.monotonic()]
        while not _ended(controller):   # between cells: gone before the next one starts
            time.sleep(0.01)
        err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100"))
    else:
        watcher, killed = once_running(lambda: psutil.Process(controller).kill())
        err = run_err(mw, STEP.format(data="long_ds", flags="--steps 100000"))
        watcher.join()
    took = time.monotonic() - killed[0]
    with capsys.disabled():
        print(f"\ncontroller killed {moment}: cell error {took:.1f} s later")
    assert isinstance(err, ControllerDied), repr(err)
    text = str(err)
    assert text.startswith(f"The ipyparallel controller (pid {controller}) died"), text
    assert "no worker failed" in text and "worker 0 (pid" not in text, text
    assert "models, optimizers, datasets" in text and "%distribute restart" in text, text
    assert "re-run the `%%distribute` cells that built" in text, text
    if moment == "between cells":
        assert "so this cell was not run (its last run ended at step 8)" in text, text
    else:
        assert re.search(r"during this cell, after step \d+", text), text
        assert nbdist.runs[-1].status == "failed" and nbdist.runs[-1].steps_done >= 20
    assert took < 10, f"{took:.1f} s: the cell waited for a controller that is gone"
    assert cluster().broken
    deadline = time.monotonic() + PROMPT_S
    while not all(_ended(pid) for pid in workers):
        assert time.monotonic() < deadline, "workers left running without their controller"
        time.sleep(0.1)
    _restart_and_train(mw, capsys)


STUCK_INPUT = "%%distribute\n" + stuck_input("GLOBAL_BATCH * 30")


def test_a_worker_stuck_in_its_input_pipeline_is_named_with_its_cell_line(mw, tmp_path):
    stall_file = str(tmp_path / "stalled")
    mw.push({"STALL_FILE": stall_file})
    mw.run_line_magic("distribute", "push STALL_FILE")
    run_ok(mw, STUCK_INPUT)
    err = run_err(mw, STEP.format(data="stuck_ds", flags="--steps 100000"))
    returned = time.time()
    assert isinstance(err, WorkerStuck), repr(err)
    text = str(err)
    # each worker reads batches of GLOBAL_BATCH / 2: the generator stops in its 60th
    assert "worker 1 is stuck at step 60, reading its input (--data), blocked in your code at " \
           "cell line 7 (in slow_source" in text, text
    assert "time.sleep(3600)" in text and "Waiting for it in TensorFlow" in text
    assert "worker 0 (step 60)" in text
    stacks = "\n".join(err._render_traceback_())
    assert "[worker 1] thread" in stacks and "[worker 0] thread main" in stacks
    stalled_at = float(open(stall_file).read())
    bound = float(re.search(r"= ([\d.]+) s\)", text).group(1))
    print(f"\nstuck input -> cell error {returned - stalled_at:.1f} s (limit {bound:.1f} s)")
    assert returned - stalled_at < bound + PROMPT_S, "the stall went unnoticed (it lasts an hour)"
    assert cluster().broken
    with pytest.raises(ClusterError, match="restart"):   # the kernel says what to do next
        mw.run_cell("%%distribute\n1", store_history=False).raise_error()


RAISING_INPUT = "%%distribute\n" + raising_input("GLOBAL_BATCH * 20")


def test_an_exception_in_one_workers_input_ends_the_cell_in_seconds_with_its_line(mw):
    """Worker 1's generator raises at its 40th batch; worker 0 then waits in its collective,
    which has no timeout: the kernel ends it, and shows worker 1's own error, not
    TensorFlow's frames."""
    run_ok(mw, RAISING_INPUT)
    waiter = cluster().info[0]["pid"]
    err = run_err(mw, STEP.format(data="bad_ds", flags="--steps 100000"))
    returned = time.time()
    run = nbdist.runs[-1]
    took = returned - run.metrics["wall_time"].max()   # the last step's end, then the raise
    print(f"\ninput raised after step {run.steps_done}: cell error {took:.1f} s later")
    assert isinstance(err, WorkerError), repr(err)
    text = str(err)
    assert text.startswith("[worker 1] ValueError: bad record at example 640"), text
    assert "raised after step 40;" in text, text
    assert "worker 0 waited for it in a collective and was ended" in text, text
    assert "%distribute restart" in text and err.cell_line == 5
    shown = "\n".join(err._render_traceback_())
    assert "cell line 5 (in <nbdist-cell-" in shown and "raise ValueError" in shown, shown
    assert "script_ops.py" not in shown and "from_generator_op" not in shown, shown
    assert run.status == "failed" and run.steps_done == 40
    assert took < PROMPT_S, "worker 0 was left waiting in its collective (no timeout)"
    deadline = time.monotonic() + PROMPT_S
    while not _ended(waiter):
        assert time.monotonic() < deadline, f"worker 0 (pid {waiter}) is still running"
        time.sleep(0.1)
    assert cluster().broken
    with pytest.raises(ClusterError, match="restart"):
        mw.run_cell("%%distribute\n1", store_history=False).raise_error()


# A dataset function (--data takes one: each worker calls it with its InputContext) whose
# source raises on worker 1 at its 41st batch of GLOBAL_BATCH / 2, on cell line 6.
RAISING_FN = """%%distribute
def bad_fn(input_context):
    def bad_source():
        for i in range(10**6):
            if nbdist_worker == 1 and i == GLOBAL_BATCH * 20:
                raise ValueError("bad record at example %d" % i)
            yield xs[i % len(xs)], ys[i % len(ys)]
    return tf.data.Dataset.from_generator(bad_source, output_signature=(
        tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
    ).batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH), drop_remainder=True)
"""


def test_an_exception_in_one_workers_dataset_function_names_it_its_step_and_line(mw, capsys):
    run_ok(mw, RAISING_FN)
    err = run_err(mw, STEP.format(data="bad_fn", flags="--steps 100000"))
    returned = time.time()
    run = nbdist.runs[-1]
    took = returned - run.metrics["wall_time"].max()
    with capsys.disabled():
        print(f"\ndataset function raised after step {run.steps_done}: cell error {took:.1f} s")
    assert isinstance(err, WorkerError), repr(err)
    text = str(err)
    assert text.startswith("[worker 1] ValueError: bad record at example 640"), text
    assert "raised after step 40;" in text and err.cell_line == 6, (text, err.cell_line)
    shown = "\n".join(err._render_traceback_())
    assert "cell line 6 (in <nbdist-cell-" in shown and "raise ValueError" in shown, shown
    assert run.status == "failed" and run.steps_done == 40
    assert took < 10, "worker 0 was left waiting in its collective"
    _restart_and_train(mw, capsys)


def test_a_day_of_training_cells_leaves_no_thread_or_file_behind(mw):
    """50 training cells, step cells and hand-written loops in scope cells in turn: the thread
    and file-descriptor counts of every worker, the controller and the kernel stay flat (a
    leak of a thread per collective grows by hundreds a cell; TensorFlow's own pools may
    still add a few threads once, up to their size)."""
    kernel = psutil.Process()

    def counts():
        procs = [kernel, *cluster().processes()]
        return {p.pid: (p.num_threads(), p.num_fds()) for p in procs if _alive(p)}

    run_ok(mw, STEP.format(data="long_ds", flags="--steps 10"))
    run_ok(mw, SCOPE_LOOP.format(steps=10))
    before = counts()
    for i in range(50):
        run_ok(mw, STEP.format(data="long_ds", flags="--steps 10") if i % 2
               else SCOPE_LOOP.format(steps=10))
    after = counts()
    print("\n(threads, fds) per process before and after 50 cells:", before, after)
    assert set(after) == set(before)
    for pid, (threads, fds) in after.items():
        assert abs(threads - before[pid][0]) <= 10 and abs(fds - before[pid][1]) <= 5, \
            (pid, before[pid], (threads, fds))


def test_inject_slow_delays_every_step_of_one_worker(mw, capsys):
    mw.run_line_magic("distribute", "inject slow 0 --delay 0.3")
    try:
        run_ok(mw, STEP.format(data="ds", flags="--steps 6"))
    finally:
        mw.run_line_magic("distribute", "inject slow 0 --delay 0")
    def step_intervals(run):   # seconds between a worker's steps, after the traced ones
        rows = run.metrics.query("step > 1")
        return rows.groupby("worker")["wall_time"].apply(lambda t: t.diff().median())

    # both: worker 1 waits for worker 0 in the collectives (of the step and of its input)
    assert (step_intervals(nbdist.runs[-1]) > 0.25).all(), step_intervals(nbdist.runs[-1])
    run = nbdist.runs[-1]
    late = run.metrics.query("step > 1")
    # worker 1 waited for worker 0 at each step: as waiting, not as reading its input; the
    # run names worker 0, the one waited for
    by_worker = late.groupby("worker")[["data_ms", "wait_ms"]].median()
    assert by_worker.loc[1, "data_ms"] < 100 and by_worker.loc[1, "wait_ms"] > 250, by_worker
    assert by_worker.loc[0, "wait_ms"] < 50, by_worker
    assert [s.label for s in run.stragglers()] == ["worker 0"], run.stragglers()
    assert any(n.startswith("straggler: worker 0; the other workers waited a median")
               for n in run.notes), run.notes
    capsys.readouterr()
    mw.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    assert "slow worker 0 (+0.3 s per step) at once" in out and "applied" in out, out
    run_ok(mw, STEP.format(data="ds", flags="--steps 6"))
    assert (step_intervals(nbdist.runs[-1]) < 0.25).all(), step_intervals(nbdist.runs[-1])


def test_inject_refuses_bad_lines_and_partition_of_local_workers(mw):
    before = list(cluster().monitor.injections)
    for line, expected in [("inject partition 1", "network namespace of its own"),
                           ("inject heal 0", "network namespace of its own"),
                           ("inject explode 1", "not a fault"),
                           ("inject kill 2", "0..1"),
                           ("inject kill 1 --delay 2", "--delay is the per-step delay"),
                           ("status --at-step 3", "apply to `%distribute inject")]:
        with pytest.raises(ConfigError, match=re.escape(expected)):
            mw.run_line_magic("distribute", line)
    assert cluster().monitor.injections == before and not cluster().broken


# The custom_training tutorial's CNN (no Input layer), as written: tf.keras is tf_keras on
# the workers (TF_USE_LEGACY_KERAS=1, nbdist's default when tf_keras is installed).
CNN = """%%distribute
images = rng.random((64, 10, 10, 1)).astype("float32")
labels = rng.integers(0, 10, 64)
images_ds = tf.data.Dataset.from_tensor_slices((images, labels)).batch(8, drop_remainder=True)
cnn = tf.keras.Sequential([tf.keras.layers.Conv2D(8, 3, activation='relu'),
                           tf.keras.layers.MaxPooling2D(), tf.keras.layers.Flatten(),
                           tf.keras.layers.Dense(10)])
cnn_loss = tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
cnn_opt = tf.keras.optimizers.Adam()
cnn_keras = type(cnn).__module__.split(".")[0]
"""
CNN_STEP = """%%distribute --step --data images_ds --steps 3
images, labels = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(cnn_loss(labels, cnn(images, training=True)),
                                      global_batch_size=8)
grads = tape.gradient(loss, cnn.trainable_variables)
cnn_opt.apply_gradients(zip(grads, cnn.trainable_variables))
"""
CNN_SHAPES = "%%distribute\ncnn_shapes = [tuple(v.shape) for v in cnn.variables if v.numpy().size]"


def test_the_tutorial_cnn_without_input_trains_with_tf_keras_on_workers(mw):
    run_ok(mw, CNN)
    assert current_session().pull("cnn_keras") == "tf_keras"
    run_err(mw, CNN_STEP.replace("cnn_opt.apply", "tf.debugging.assert_equal(loss, -1.0)\n"
                                 "cnn_opt.apply"))
    assert nbdist.runs[-1].status == "failed"
    for worker in (0, 1):                # built in the failed step, not emptied
        run_ok(mw, CNN_SHAPES)
        shapes = current_session().pull("cnn_shapes", worker)
        assert shapes == [(3, 3, 1, 8), (8,), (128, 10), (10,)], shapes
    run_ok(mw, CNN_STEP)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 3 and run.metrics["loss"].notna().all()
