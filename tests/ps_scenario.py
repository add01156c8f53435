"""Driver for tests/test_paramserver.py: one fresh IPython kernel-like process.

ParameterServerStrategy makes the kernel a coordinator, which renames its TensorFlow devices
and may leave it unusable for other strategies; so these scenarios run in their own
interpreter (``python tests/ps_scenario.py NAME``) and print what they observed as one JSON
line after ``RESULT:``. The process starts like the test session does (4 logical CPUs,
``mirrored --devices 4``), so connecting after local devices exist is covered too.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from ps_input_scenario import input_scenario  # noqa: E402 - after the environment is set
from ps_tutorial_scenario import tutorial_scenario  # noqa: E402

SETUP = """%%distribute
import numpy as np
import tensorflow as tf
import keras
rng = np.random.default_rng(0)
xs = rng.normal(size=(32 * 8, 4)).astype("float32")
ys = xs.sum(axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(32, drop_remainder=True)
long_ds = ds.repeat()
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
optimizer = keras.optimizers.Adam(0.05)
model.trainable_variables[0].value.device
"""

STEP = """%%distribute --step --data {data} {flags}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

TF_KERAS_FIT = """%%distribute
import tf_keras
tk_model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])
tk_model.compile(tf_keras.optimizers.Adam(0.05), "mse")
# fit
history = tk_model.fit(long_ds, epochs=2, steps_per_epoch=40, verbose=0)
"""

out: dict = {}


def shell():
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    ip.run_line_magic("distribute", "mirrored --devices 4")
    return ip


def cell(ip, code):
    """Run a cell; return (result, 'ErrorType: message' or None)."""
    result = ip.run_cell(textwrap.dedent(code), store_history=False)
    err = result.error_before_exec or result.error_in_exec
    return result.result, None if err is None else f"{type(err).__name__}: {err}"


def status(ip):
    from nbdist.session import current_session

    return current_session().status_text()


def cluster():
    from nbdist.session import current_session

    return current_session().backend


def when_rows(action, min_rows=20, timeout=120):
    """Run ``action`` in a thread once the newest running Run has ``min_rows`` rows."""
    import nbdist

    done = []
    before = nbdist.runs[-1] if nbdist.runs else None

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = nbdist.runs[-1] if nbdist.runs else None
            if run is not None and run is not before and run.status == "running" \
                    and run.n_rows >= min_rows:
                done.append(time.monotonic())
                action()
                return
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)   # never hang the test

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


def alive(procs):
    import psutil

    def ok(p):
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return [p.pid for p in procs if ok(p)]


def frame_summary(run):
    m = run.metrics
    return {
        "status": run.status, "steps": run.steps_done, "rows": len(m),
        "total": run.total_steps, "notes": run.notes, "error": run.error,
        "by_worker": {str(k): int(v) for k, v in m.groupby("worker").size().items()},
        "replicas": sorted(set(m["replica"].tolist())),
        "step_unique": bool(m["step"].is_unique),
        "loss_first": float(m["loss"].iloc[0]) if len(m) else None,
        "loss_last": float(m["loss"].iloc[-1]) if len(m) else None,
        "grad_norm_ok": bool(m["grad_norm"].notna().all()) if len(m) else False,
        "step_ms_ok": bool((m["step_ms"] > 0).all()) if len(m) else False,
        "allreduce_all_nan": bool(m["allreduce_ms"].isna().all()),
        "update_ms_count": int(m["update_ms"].notna().sum()) if "update_ms" in m else 0,
        "update_ms_median": float(m["update_ms"].median()) if "update_ms" in m else None,
    }


# -- scenarios --------------------------------------------------------------------------------

def main_scenario(ip):
    """Start, status, training, stop/interrupt, fit, then a clean stop and another strategy."""
    import nbdist
    from nbdist.session import current_session

    ip.run_line_magic("distribute", "parameter_server")     # defaults: --workers 2 --ps 1
    c = cluster()
    out["n"], out["n_ps"] = c.n, c.n_ps
    out["status"] = status(ip)
    out["cluster_spec"] = c.cluster_spec
    listening = []
    import psutil

    for proc in [psutil.Process(), *c.processes()]:
        listening += [[c2.laddr.ip, c2.laddr.port, proc.pid == os.getpid()]
                      for c2 in proc.net_connections("inet") if c2.status == psutil.CONN_LISTEN]
    out["listening"] = listening
    from tensorflow.python.eager import context

    server_def = context.get_server_def()
    out["kernel_tf_ports"] = [int(address.rsplit(":", 1)[1]) for job in server_def.cluster.job
                              if job.name == server_def.job_name
                              for address in job.tasks.values()]
    value, out["setup_error"] = cell(ip, SETUP)
    out["variable_device"] = str(value)

    seen = []
    stop = threading.Event()

    def watch():
        while not stop.wait(0.02):
            run = nbdist.runs[-1] if nbdist.runs else None
            if run is not None and run.strategy == "parameter_server":
                seen.append([run.status, run.n_rows])

    thread = threading.Thread(target=watch)
    thread.start()
    _, out["step_error"] = cell(ip, STEP.format(data="ds", flags="--epochs 15 --timing-every 4"))
    stop.set()
    thread.join()
    out["seen_running"] = [s for s in seen if s[0] == "running" and 0 < s[1] < 120]
    out["step_run"] = frame_summary(nbdist.runs[-1])
    traced = c.traced_steps
    out["cache_first"] = [traced.hits, traced.misses]

    # the same cell again (other flags, another dataset of the same spec): its trace is reused
    _, out["fast_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 200 "
                                                "--timing-every 0"))
    out["fast_run"] = frame_summary(nbdist.runs[-1])
    out["cache_rerun"] = [traced.hits, traced.misses]

    # the dashboard's Stop button: an observer asking to stop after 30 steps
    from helpers import StopAfter

    from nbdist.spec import RunSpec

    spec = RunSpec(step=True, data="long_ds", steps=100000)
    current_session().run_step_cell(STEP.split("\n", 1)[1], spec, [StopAfter(rows=30)],
                                    header="%%distribute --step --data long_ds")
    out["stopped_run"] = frame_summary(nbdist.runs[-1])

    thread, sent = when_rows(lambda: os.kill(os.getpid(), signal.SIGINT))
    _, out["interrupt_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 100000"))
    out["interrupt_s"] = time.monotonic() - sent[0] if sent else None
    thread.join()
    out["interrupted_run"] = frame_summary(nbdist.runs[-1])
    _, out["after_interrupt_error"] = cell(ip, STEP.format(data="ds", flags="--steps 3"))
    out["after_interrupt_status"] = nbdist.runs[-1].status

    _, out["fit_error"] = cell(ip, "%%distribute\nmodel.compile(optimizer='sgd', loss='mse')\n"
                                   "model.fit(ds, epochs=1, verbose=0)")
    _, out["tf_keras_setup_error"] = cell(ip, TF_KERAS_FIT.split("# fit\n")[0])
    _, out["tf_keras_fit_error"] = cell(ip, "%%distribute\n" + TF_KERAS_FIT.split("# fit\n")[1])
    out["tf_keras_fit_run"] = frame_summary(nbdist.runs[-1])
    out["tf_keras_history"] = ip.user_ns["history"].history
    _, out["tf_keras_refit_error"] = cell(ip, "%%distribute\n" + TF_KERAS_FIT.split("# fit\n")[1])
    out["tf_keras_refit_run"] = frame_summary(nbdist.runs[-1])
    thread, sent = when_rows(lambda: os.kill(os.getpid(), signal.SIGINT))
    _, out["fit_interrupt_error"] = cell(ip, "%%distribute\ntk_model.fit(long_ds, epochs=1, "
                                             "steps_per_epoch=100000, verbose=0)")
    out["fit_interrupt_s"] = time.monotonic() - sent[0] if sent else None
    thread.join()
    out["fit_interrupted_run"] = frame_summary(nbdist.runs[-1])
    _, out["fit_after_interrupt_error"] = cell(
        ip, "%%distribute\ntk_model.fit(long_ds, epochs=1, steps_per_epoch=10, verbose=0)")
    out["fit_after_interrupt_run"] = frame_summary(nbdist.runs[-1])
    # --checkpoint: interrupted mid-run, the same cell run again resumes after the last epoch
    import tempfile

    ckpt_dir = tempfile.mkdtemp(prefix="nbdist-ps-ckpt-")
    _, out["ckpt_setup_error"] = cell(ip, "%%distribute\nck_model = keras.Sequential("
                                          "[keras.Input((4,)), keras.layers.Dense(1)])\n"
                                          "ck_opt = keras.optimizers.Adam(0.05)\n")
    ckpt_cell = (STEP.replace("model", "ck_model").replace("optimizer.", "ck_opt.")
                 .format(data="ds", flags=f"--epochs 40 --checkpoint {ckpt_dir}"))
    # --checkpoint-every: refused before anything runs (no Run)
    runs_before = len(nbdist.runs)
    _, out["ckpt_every_error"] = cell(ip, ckpt_cell.replace("--epochs 40",
                                                            "--epochs 40 --checkpoint-every 4"))
    out["ckpt_every_new_runs"] = len(nbdist.runs) - runs_before
    # Kernel > Interrupt while the 13th epoch's checkpoint is being written (step 104): the
    # interrupt waits for the save, then the run stops (not inside TensorFlow's save).
    from nbdist.checkpoint.step import StepCheckpoint

    saved, save = [], StepCheckpoint.save

    def save_interrupted(self, *args, **kwargs):
        if len(saved) == 12:
            os.kill(os.getpid(), signal.SIGINT)
        save(self, *args, **kwargs)
        saved.append(args)

    StepCheckpoint.save = save_interrupted
    try:
        _, out["ckpt_interrupt_error"] = cell(ip, ckpt_cell)
    finally:
        StepCheckpoint.save = save
    out["ckpt_saves_finished"] = len(saved)
    out["ckpt_first_run"] = frame_summary(nbdist.runs[-1])
    out["ckpt_saved"] = sorted(os.listdir(os.path.join(ckpt_dir, "step")))
    _, out["ckpt_resume_error"] = cell(ip, ckpt_cell)
    resumed = nbdist.runs[-1]
    out["ckpt_resumed_run"] = frame_summary(resumed)
    out["ckpt_resumed_first_step"] = int(resumed.metrics.step.min())
    out["ckpt_left"] = os.path.exists(os.path.join(ckpt_dir, "step"))
    fit_dir = tempfile.mkdtemp(prefix="nbdist-ps-fit-ckpt-")
    fit_cell = (f"%%distribute --checkpoint {fit_dir}\n"
                "fk_model = tf_keras.Sequential([tf_keras.Input((4,)), tf_keras.layers.Dense(1)])\n"
                "fk_model.compile(tf_keras.optimizers.Adam(0.05), 'mse')\n"
                "fk_history = fk_model.fit(long_ds, epochs=30, steps_per_epoch=8, verbose=0)\n")
    thread, sent = when_rows(lambda: os.kill(os.getpid(), signal.SIGINT), min_rows=100)
    _, out["fit_ckpt_interrupt_error"] = cell(ip, fit_cell)
    thread.join()
    out["fit_ckpt_first_run"] = frame_summary(nbdist.runs[-1])
    _, out["fit_ckpt_resume_error"] = cell(ip, fit_cell)
    resumed = nbdist.runs[-1]
    out["fit_ckpt_resumed_run"] = frame_summary(resumed)
    out["fit_ckpt_resumed_first_step"] = int(resumed.metrics.step.min())
    out["fit_ckpt_history_epochs"] = len(ip.user_ns["fk_history"].history["loss"])
    out["fit_ckpt_left"] = sorted(os.path.relpath(os.path.join(d, f), fit_dir)
                                 for d, _, files in os.walk(fit_dir) for f in files)
    out["fit_ckpt_dirs"] = sorted(os.path.relpath(d, fit_dir) for d, _, _ in os.walk(fit_dir))
    # a rebuilt model: the unchanged cell retraces, and trains the new model, not the old one
    old = [w.copy() for w in ip.user_ns["model"].get_weights()]
    _, out["rebuilt_error"] = cell(ip, "%%distribute\nold_model = model\nmodel = keras."
                                       "Sequential([keras.Input((4,)), keras.layers.Dense(1)])\n"
                                       "optimizer = keras.optimizers.Adam(0.05)\n")
    new = [w.copy() for w in ip.user_ns["model"].get_weights()]
    counts = [traced.hits, traced.misses]
    _, out["rebuilt_run_error"] = cell(ip, STEP.format(data="ds", flags="--steps 16"))
    out["rebuilt_cache"] = [traced.hits - counts[0], traced.misses - counts[1]]
    out["rebuilt_trained"] = any(
        (a != b).any() for a, b in zip(new, ip.user_ns["model"].get_weights(), strict=True))
    out["old_untouched"] = all(
        (a == b).all() for a, b in zip(old, ip.user_ns["old_model"].get_weights(), strict=True))
    _, out["push_error"] = cell(ip, "%distribute push ds")
    _, out["graph_fn_error"] = cell(ip, "%%distribute --step --data ds\nx, y = batch\n"
                                        "loss = tf.reduce_mean(x) + undefined_name\n")
    # a NaN loss at the 6th step ends the run there; the cluster trains the next cell
    ip.user_ns["optimizer"].iterations.assign(0)
    _, out["nan_error"] = cell(ip, STEP.format(data="ds", flags="--steps 16").replace(
        "    loss = tf.reduce_mean(tf.square(model(x) - y))\n",
        "    loss = tf.reduce_mean(tf.square(model(x) - y))\n"
        "    loss = tf.where(optimizer.iterations >= 5, tf.constant(float('nan')), loss)\n"))
    import nbdist

    out["nan_run"] = {"status": nbdist.runs[-1].status, "steps": nbdist.runs[-1].steps_done}
    ip.user_ns["model"].set_weights([w * 0 for w in ip.user_ns["model"].get_weights()])
    ip.user_ns["optimizer"].iterations.assign(0)
    _, out["after_nan_error"] = cell(ip, STEP.format(data="ds", flags="--steps 4"))
    out["after_nan_run"] = {"status": nbdist.runs[-1].status,
                            "steps": nbdist.runs[-1].steps_done}

    procs = c.processes()
    out["processes_before_stop"] = len(procs)
    ip.run_line_magic("distribute", "stop")
    from nbdist.cluster.paramserver.backend import live_ps_clusters

    out["left_after_stop"] = alive(procs)
    out["live_after_stop"] = len(live_ps_clusters())
    value, out["mirrored_after_error"] = cell(
        ip, "%distribute mirrored --devices 2\n")
    value, out["mirrored_cell_error"] = cell(
        ip, "%%distribute --step --data ds --steps 2\nx, y = batch\n"
            "loss = tf.reduce_mean(tf.square(x))\n")
    out["mirrored_run"] = frame_summary(nbdist.runs[-1])


def fault_scenario(ip):
    """Kill a worker mid-run (the run goes on), then the parameter server (a clear error)."""
    import nbdist

    ip.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")
    c = cluster()
    _, out["setup_error"] = cell(ip, SETUP)
    out["refused"] = {line: cell(ip, f"%distribute {line}")[1] for line in (
        "inject slow 1", "inject partition 1", "inject kill ps0",
        "inject kill 2")}
    _, out["inject_kill_error"] = cell(ip, "%distribute inject kill 1 --at-step 20")
    started = time.monotonic()
    _, out["worker_kill_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 400"))
    out["worker_kill_s"] = time.monotonic() - started
    injected = c.faults.log[-1]
    out["kill_applied_step"] = injected["applied_step"]
    run = nbdist.runs[-1]
    out["killed_worker_rows"] = int((run.metrics["worker"] == 1).sum())
    out["killed_worker_last_step"] = int(run.metrics.query("worker == 1").step.max())
    out["worker_kill_run"] = frame_summary(run)
    # each worker's last row, in seconds after the kill (a fast survivor can finish the run
    # within a second of it: no row is "long after" the kill then)
    last = run.metrics.groupby("worker")["wall_time"].max() - injected["applied_at"]
    out["last_row_after_kill_s"] = {str(int(w)): float(s) for w, s in last.items()}
    out["status_after_kill"] = status(ip)

    ps = c.pid("ps", 0)
    thread, killed = when_rows(lambda: os.kill(ps, signal.SIGKILL), min_rows=20)
    _, out["ps_kill_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 100000"))
    out["ps_kill_s"] = time.monotonic() - killed[0] if killed else None
    thread.join()
    out["ps_kill_run"] = frame_summary(nbdist.runs[-1])
    _, out["after_ps_kill_error"] = cell(ip, STEP.format(data="ds", flags="--steps 2"))

    procs = c.processes()
    started = time.monotonic()
    ip.run_line_magic("distribute", "stop")
    out["stop_s"] = time.monotonic() - started
    out["left_after_stop"] = alive(procs)
    _, out["mirrored_after_error"] = cell(ip, "%distribute mirrored --devices 2")
    _, out["ps_again_error"] = cell(ip, "%distribute parameter_server")


# Worker 1's dataset function reads a record it cannot parse at its 41st batch (32 records
# a batch): the failing operation is made on cell line 6.
BAD_INPUT = """%%distribute
def bad_fn(input_context):
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    def parse(i):
        text = tf.where((worker == 1) & (i >= 40 * 32), "bad", "1.5")
        x = tf.fill((4,), tf.strings.to_number(text))
        return x, tf.reduce_sum(x, keepdims=True)
    return tf.data.Dataset.range(10**6).map(parse).batch(32)
"""


def _restart_and_train(ip, key):
    """`%distribute restart`, the setup cell, 20 steps: the seconds of each part."""
    import nbdist

    started = time.monotonic()
    _, out[f"{key}_restart_error"] = cell(ip, "%distribute restart")
    restarted = time.monotonic()
    _, out[f"{key}_rebuild_error"] = cell(ip, SETUP)
    _, out[f"{key}_retrain_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 20"))
    out[f"{key}_retrain_run"] = frame_summary(nbdist.runs[-1])
    out[f"{key}_restart_s"] = restarted - started
    out[f"{key}_retrain_s"] = time.monotonic() - restarted


def stall_scenario(ip):
    """A worker stopped (SIGSTOP) mid-run, an exception in a worker's dataset function, the
    ipyparallel controller killed: each named within seconds; `%distribute restart` trains."""
    import psutil

    import nbdist

    ip.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")
    _, out["setup_error"] = cell(ip, SETUP)
    # A worker stopped mid-run, once the run has 20 rows: both variants of the step were
    # traced before (a trace after it would wait for the stopped worker for ever).
    victim = cluster().pid("worker", 1)
    out["victim"] = victim
    thread, stopped = when_rows(lambda: os.kill(victim, signal.SIGSTOP), min_rows=20)
    try:
        _, out["stop_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 100000"))
        out["stop_s"] = time.monotonic() - stopped[0] if stopped else None
        thread.join()
        out["stop_run"] = frame_summary(nbdist.runs[-1])
        out["stop_status"] = status(ip)
        _restart_and_train(ip, "stop")
        out["victim_left"] = (alive([psutil.Process(victim)])
                              if psutil.pid_exists(victim) else [])
    finally:   # never leave a stopped process behind
        if psutil.pid_exists(victim):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                os.kill(victim, sig)

    _, out["bad_input_error"] = cell(ip, BAD_INPUT)
    started = time.monotonic()
    _, out["input_error"] = cell(ip, STEP.format(data="bad_fn", flags="--steps 100000"))
    out["input_s"] = time.monotonic() - started
    out["input_run"] = frame_summary(nbdist.runs[-1])
    _, out["after_input_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 20"))
    _restart_and_train(ip, "input")

    controller = cluster().engines.controller_pid
    out["controller"] = controller
    thread, killed = when_rows(lambda: os.kill(controller, signal.SIGKILL), min_rows=20)
    _, out["controller_error"] = cell(ip, STEP.format(data="long_ds", flags="--steps 100000"))
    out["controller_s"] = time.monotonic() - killed[0] if killed else None
    thread.join()
    out["controller_run"] = frame_summary(nbdist.runs[-1])
    _restart_and_train(ip, "controller")

    victim = cluster().pid("worker", 1)
    out["injected_victim"] = victim
    try:
        _, out["inject_stop_error"] = cell(ip, "%distribute inject stop 1 --at-step 10")
        _, out["injected_stop_error"] = cell(ip, STEP.format(data="long_ds",
                                                             flags="--steps 100000"))
        out["injected_stop_run"] = frame_summary(nbdist.runs[-1])
        out["injected_stop_applied"] = cluster().faults.log[-1].get("applied_at")
        out["injected_stop_s"] = time.time() - out["injected_stop_applied"]
    finally:
        ip.run_line_magic("distribute", "stop")   # resumes the stopped worker, ends it
        if psutil.pid_exists(victim):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                os.kill(victim, sig)


def profile_scenario(ip):
    """parameter_server on a user's ipyparallel cluster (``--cluster``), engines on this
    machine: nbdist uses them, restarts them at stop and leaves the cluster running."""
    import tempfile

    import ipyparallel as ipp
    from helpers import cluster_processes, ipcluster, living

    import nbdist

    profile_dir = tempfile.mkdtemp(prefix="nbdist-ps-profile-")
    with open(os.path.join(profile_dir, "ipcontroller_config.py"), "w") as f:
        f.write("c.HeartMonitor.period = 500\nc.HeartMonitor.max_heartmonitor_misses = 20\n")
    started = ipcluster("start", "--daemonize", "--n=2", f"--profile-dir={profile_dir}")
    out["ipcluster_start"] = [started.returncode, started.stderr[-1000:]]
    procs = cluster_processes(profile_dir)
    client = ipp.Client(profile_dir=profile_dir)
    try:
        client.wait_for_engines(2, timeout=60)
        users = dict(zip(client.ids, client[:].apply_sync(os.getpid), strict=True))
        _, out["too_many_error"] = cell(ip, "%distribute parameter_server --workers 2 --ps 1 "
                                            f"--cluster {profile_dir}")
        _, out["start_error"] = cell(ip, "%distribute parameter_server --workers 1 --ps 1 "
                                         f"--cluster {profile_dir}")
        c = cluster()
        out["task_pids"] = sorted(c.info[t]["pid"] for t in c.tasks)
        out["user_pids"] = sorted(users.values())
        out["started_by_nbdist"] = len(c.processes())
        out["cluster_spec"] = c.cluster_spec
        out["status"] = status(ip)
        _, out["setup_error"] = cell(ip, SETUP)
        _, out["step_error"] = cell(ip, STEP.format(data="ds", flags="--epochs 5"))
        out["step_run"] = frame_summary(nbdist.runs[-1])
        ip.run_line_magic("distribute", "stop")
        deadline = time.monotonic() + 60   # the cluster's engines, restarted by nbdist
        while time.monotonic() < deadline and (len(client.ids) < 2
                                               or set(client.ids) & set(users)):
            time.sleep(0.2)
        out["after_stop_pids"] = sorted(client[:].apply_sync(os.getpid))
        procs = cluster_processes(profile_dir)
        out["controller_alive_after_stop"] = bool(living(procs))
    finally:
        client.close()
        ipcluster("stop", f"--profile-dir={profile_dir}")
        deadline = time.monotonic() + 15
        while living(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        out["left_after_ipcluster_stop"] = [p.pid for p in living(procs)]
        for proc in living(procs):
            proc.kill()


def ps_restart_scenario(ip):
    """--checkpoint when the parameter server dies: restart, rebuild, rerun resumes."""
    import tempfile

    import nbdist

    ip.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")
    _, out["setup_error"] = cell(ip, SETUP)
    ckpt_dir = tempfile.mkdtemp(prefix="nbdist-ps-restart-")
    ckpt_cell = STEP.format(data="ds", flags=f"--epochs 60 --checkpoint {ckpt_dir}")
    ps = cluster().pid("ps", 0)
    thread, _ = when_rows(lambda: os.kill(ps, signal.SIGKILL), min_rows=120)
    _, out["ps_kill_error"] = cell(ip, ckpt_cell)
    thread.join()
    out["killed_run"] = frame_summary(nbdist.runs[-1])
    _, out["restart_error"] = cell(ip, "%distribute restart")
    _, out["rebuild_error"] = cell(ip, SETUP)
    _, out["resume_error"] = cell(ip, ckpt_cell)
    resumed = nbdist.runs[-1]
    out["resumed_run"] = frame_summary(resumed)
    out["resumed_first_step"] = int(resumed.metrics.step.min()) if len(resumed.metrics) else None


def hostbed_scenario(ip):
    """parameter_server on the engines of tests/hostbed.py's hosts (profile dir in
    NBDIST_HOSTBED_PROFILE): 2 workers and 1 parameter server on 3 hosts."""
    import nbdist

    profile_dir = os.environ["NBDIST_HOSTBED_PROFILE"]
    _, out["start_error"] = cell(ip, "%distribute parameter_server --workers 2 --ps 1 "
                                     f"--cluster {profile_dir}")
    c = cluster()
    out["cluster_spec"] = c.cluster_spec
    out["hosts"] = {f"{job} {index}": c.info[(job, index)].get("host") for job, index in c.tasks}
    out["status"] = status(ip)
    _, out["setup_error"] = cell(ip, SETUP)
    _, out["step_error"] = cell(ip, STEP.format(data="ds", flags="--epochs 5"))
    out["step_run"] = frame_summary(nbdist.runs[-1])
    started = time.monotonic()
    ip.run_line_magic("distribute", "stop")
    out["stop_s"] = time.monotonic() - started


def soak_scenario(ip):
    """50 step cells: threads and fds of the kernel and every process of the cluster."""
    import psutil

    import nbdist

    ip.run_line_magic("distribute", "parameter_server")
    _, out["setup_error"] = cell(ip, SETUP)
    step = STEP.format(data="long_ds", flags="--steps 10")

    def counts():
        procs = [psutil.Process(), *cluster().processes()]
        return {str(p.pid): [p.num_threads(), p.num_fds()] for p in procs if alive([p])}

    errors = [cell(ip, step)[1] for _ in range(3)]   # the first traces and fills the pools
    out["before"] = counts()
    errors += [cell(ip, step)[1] for _ in range(50)]
    out["after"] = counts()
    out["errors"] = [e for e in errors if e]
    out["statuses"] = sorted({r.status for r in nbdist.runs})


SCENARIOS = {"main": main_scenario, "hostbed": hostbed_scenario, "faults": fault_scenario,
             "stall": stall_scenario,
             "profile": profile_scenario,
             "ps_restart": ps_restart_scenario, "soak": soak_scenario,
             "input": lambda ip: input_scenario(ip, out, cell, status),
             "tutorial": lambda ip: tutorial_scenario(ip, out, cell, status)}

if __name__ == "__main__":
    ip = shell()
    try:
        SCENARIOS[sys.argv[1]](ip)
    except BaseException:
        out["crash"] = traceback.format_exc()
    finally:
        print("RESULT:" + json.dumps(out, default=str), flush=True)
        try:
            ip.run_line_magic("distribute", "stop")
        except BaseException:
            pass
        os._exit(0)
