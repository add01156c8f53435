"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import NoReturn

from nbdist.telemetry.run import RunObserver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: A bound for "returns promptly rather than hanging": far above what the operation takes on a
#: loaded 2-core machine (seconds), well below what the hangs the tests guard against last (a
#: collective without a timeout, or a cell sleeping for a minute or an hour). How fast they are
#: is not asserted: the tests print it, and benchmarks/fault_latency.py measures fault -> error.
PROMPT_S = 30.0


def skip_unless_all_required(reason: str) -> NoReturn:
    """Skip the test with ``reason`` (this machine cannot run it: no root, no sshd, ...); under
    NBDIST_REQUIRE_ALL=1 (the README's test command, CI) fail instead, so that a whole tier
    cannot pass by being skipped."""
    import pytest

    if os.environ.get("NBDIST_REQUIRE_ALL") == "1":
        pytest.fail(f"{reason}; NBDIST_REQUIRE_ALL=1 requires it", pytrace=False)
    pytest.skip(reason)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def mallinfo2() -> _MallInfo2:
    """glibc's ``mallinfo2()``: the heap's counters, summed over all arenas."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2()


# The training step of TensorFlow's custom_training tutorial, as it writes it (the body of its
# train_step(inputs), after `images, labels = inputs`).
TUTORIAL_STEP = """with tf.GradientTape() as tape:
    predictions = model(images, training=True)
    loss = tf.nn.compute_average_loss(loss_object(labels, predictions),
                                      global_batch_size=GLOBAL_BATCH_SIZE)
gradients = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(gradients, model.trainable_variables))
"""


# A small regression the step-mode tests train: GLOBAL_BATCH-example batches of 8 features ->
# 3 targets, seeded, as a kernel cell making `train_ds` (``rows`` examples, an expression of
# GLOBAL_BATCH: not a multiple of it gives a partial last batch).
REGRESSION_DATA = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
features = rng.normal(size=({rows}, 8)).astype("float32")
targets = rng.normal(size=({rows}, 3)).astype("float32")
train_ds = tf.data.Dataset.from_tensor_slices((features, targets)).batch(GLOBAL_BATCH)
"""


def regression_data(rows: str) -> str:
    return REGRESSION_DATA.format(rows=rows)


def regression_step(flags: str = "", data: str = "train_ds", extra: str = "") -> str:
    """The step cell of TensorFlow's custom-training tutorial on that data (the loss scaled by
    the global batch size); ``extra`` is appended to the line computing `loss`."""
    return f"""%%distribute --step --data {data} {flags}
x, y = batch
with tf.GradientTape() as tape:
    per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH){extra}
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def weights_after(shell, build: str, step: str):
    """Run the `build` then the `step` cell: the model's weights after it, and its Run."""
    import nbdist

    run_ok(shell, build)
    run_ok(shell, step)
    return [w.copy() for w in shell.user_ns["model"].get_weights()], nbdist.runs[-1]


def kernel_strategy(shell, line: str = "mirrored --devices 4"):
    """Switch the kernel to ``line`` (the tests' default strategy: conftest's 4 CPUs)."""
    shell.run_line_magic("distribute", "stop")
    shell.run_line_magic("distribute", line)


def run_ok(shell, code: str):
    """Run a cell; fail the test with the cell's error if it raised."""
    result = shell.run_cell(textwrap.dedent(code), store_history=False)
    if result.error_before_exec or result.error_in_exec:
        raise AssertionError(f"cell failed: {result.error_before_exec or result.error_in_exec!r}")
    return result.result


def run_err(shell, code: str) -> BaseException:
    """Run a cell that must fail; return its exception."""
    result = shell.run_cell(textwrap.dedent(code), store_history=False)
    err = result.error_before_exec or result.error_in_exec
    assert err is not None, "the cell was expected to fail but succeeded"
    return err


def when(ready, action, timeout=90):
    """A thread that runs ``action()`` once ``ready()`` is true (polled every 50 ms), so that a
    test acts on what it sees rather than after a fixed delay; if that never happens within
    ``timeout`` s it interrupts the test process (SIGINT), so a failure cannot hang the test.
    Returns ``(thread, done)``: ``done`` gets the monotonic time at which ``action`` ran."""
    done = []

    def watch():
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                done.append(time.monotonic())
                action()
                return
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


def once_running(action, min_rows=20, timeout=90):
    """``when`` the step run started after this call has ``min_rows`` rows and is running."""
    import nbdist

    before = nbdist.runs[-1] if nbdist.runs else None

    def ready():
        run = nbdist.runs[-1] if nbdist.runs else None
        return (run is not None and run is not before and run.status == "running"
                and run.n_rows >= min_rows)

    return when(ready, action, timeout)


class StopAfter(RunObserver):
    """What the dashboard's Stop button does: an observer asking to stop (after ``rows``)."""

    def __init__(self, rows=20):
        self.wanted, self.rows = rows, 0

    def on_step(self, run):
        self.rows = run.n_rows

    def should_stop(self):
        return self.rows >= self.wanted


def interrupt_me():
    """What a kernel interrupt does: SIGINT to this process."""
    os.kill(os.getpid(), signal.SIGINT)


def run_python(code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (fresh TensorFlow device state)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def ipcluster(*args):
    """Run ``ipcluster ARGS`` (as a user would) with nbdist importable on the engines."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", "ipyparallel.cluster", *args], env=env,
                          capture_output=True, text=True, timeout=90)


def cluster_processes(profile_dir, cluster_id=""):
    """The cluster's controller, engines and their children (nannies), as psutil Processes,
    from its cluster file (what was launched, engine restarts included)."""
    import ipyparallel as ipp
    import psutil

    cluster = ipp.Cluster.from_file(profile_dir=profile_dir, cluster_id=cluster_id)
    pids = {cluster.controller.pid}
    for engine_set in cluster.engines.values():
        pids |= {launcher.pid for launcher in engine_set.launchers.values()}
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs += [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return procs


def living(procs):
    """Those of ``procs`` still running (zombies count as gone)."""
    import psutil

    out = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def session_cluster():
    """The session's worker-process backend (multiworker or parameter_server), or None."""
    from nbdist.session import current_session

    backend = current_session().backend
    return backend if backend is not None and backend.exclusive else None


#: A step cell body whose loss on each replica is the mean of the examples it was given, so a
#: run's rows show which data each replica (and worker) read.
MEAN_OF_BATCH = "x, y = batch\nloss = tf.reduce_mean(x)\n"


def tutorial_step(model: str = "model", global_batch: str = "GLOBAL_BATCH_SIZE") -> str:
    """The training step of TensorFlow's custom-training tutorials, as a step cell body."""
    return (f"x, y = batch\n"
            f"with tf.GradientTape() as tape:\n"
            f"    predictions = {model}(x, training=True)\n"
            f"    per_example_loss = tf.square(y - predictions)[:, 0]\n"
            f"    loss = tf.nn.compute_average_loss(per_example_loss, "
            f"global_batch_size={global_batch})\n"
            f"grads = tape.gradient(loss, {model}.trainable_variables)\n"
            f"optimizer.apply_gradients(zip(grads, {model}.trainable_variables))\n")


def assert_changed_nothing(shell, runs_before: int, path, capsys) -> None:
    """After a refused cell: no new Run, none shown "running" by `%distribute status`, and
    ``path`` (a --checkpoint directory) not created."""
    import nbdist

    assert len(nbdist.runs) == runs_before
    assert not os.path.exists(path)
    capsys.readouterr()
    shell.run_line_magic("distribute", "status")
    assert "running" not in capsys.readouterr().out


@contextlib.contextmanager
def host_bed(ip, n: int, cluster: dict | None = None, **kwargs):
    """A bed of ``n`` simulated hosts (tests/hostbed.py, ``kwargs`` go to ``HostBed``) with
    its ipcluster running (``cluster`` goes to ``start_cluster``), for a module's tests:
    skipped with the reason where the bed cannot be made (failed under NBDIST_REQUIRE_ALL=1).
    The session's strategy is stopped before, and after (back to mirrored, no cluster left)."""
    from hostbed import HostBed, skip_reason

    from nbdist.cluster.multiworker.backend import live_clusters

    reason = skip_reason()
    if reason:
        skip_unless_all_required(reason)
    ip.run_line_magic("distribute", "stop")
    with HostBed(n, **kwargs) as bed:
        bed.start_cluster(**(cluster or {}))
        try:
            yield bed
        finally:
            ip.run_line_magic("distribute", "stop")
            ip.run_line_magic("distribute", "mirrored --devices 4")
    assert live_clusters() == []


# A tiny regression the export and family tests train: a model, its optimizer and a dataset
# made in the kernel, then a step cell over them (``factor`` scales the loss).
def run_cell(ip, code: str):
    """``code`` (dedented) run in ``ip`` as a user cell, stored in the history as export needs."""
    return ip.run_cell(textwrap.dedent(code), store_history=True)


def tiny_model_and_data(ip) -> None:
    """``model_ex``, ``opt_ex`` (built under the session's strategy) and ``ds_ex``."""
    assert run_cell(ip, "import numpy as np\nimport tensorflow as tf").success
    assert run_cell(ip, """\
        %%distribute
        model_ex = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        opt_ex = tf.keras.optimizers.SGD(0.1)""").success
    assert run_cell(ip, "ds_ex = tf.data.Dataset.from_tensor_slices((np.ones((32, 4), 'float32'), "
                        "np.ones((32, 1), 'float32'))).batch(8)").success


def tiny_step(factor: str = "1.0") -> str:
    """A step cell training ``model_ex`` on ``ds_ex``, its loss scaled by ``factor``."""
    return f"""\
        %%distribute --step --data ds_ex
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model_ex(x) - y)) * {factor}
        opt_ex.apply_gradients(zip(tape.gradient(loss, model_ex.trainable_variables),
                                   model_ex.trainable_variables))"""


# An exported script with a Keras 3 Adam (tutorial 00's kind of step), for the export and
# launch tests: a seeded model, so the script, which runs the same cells, starts from the
# same weights and its losses can be compared with the notebook's.
def export_adam_step(ip, path):
    """Train the step in the kernel (its session's strategy; 2 epochs of 4 batches of 8) and
    ``%distribute export`` it to ``path``; the notebook's loss of each step (replicas' mean)."""
    import nbdist

    assert run_cell(ip, "import numpy as np\nimport tensorflow as tf\n"
                        "tf.keras.utils.set_random_seed(7)").success
    assert run_cell(ip, """\
        %%distribute
        model_adam = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        opt_adam = tf.keras.optimizers.Adam(0.05)""").success
    assert run_cell(ip, """\
        x_adam = np.arange(128, dtype='float32').reshape(32, 4) / 128
        ds_adam = tf.data.Dataset.from_tensor_slices((x_adam, x_adam.sum(1, keepdims=True)))
        ds_adam = ds_adam.batch(8)""").success
    assert run_cell(ip, """\
        %%distribute --step --data ds_adam --epochs 2
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model_adam(x) - y))
        grads = tape.gradient(loss, model_adam.trainable_variables)
        opt_adam.apply_gradients(zip(grads, model_adam.trainable_variables))""").success
    losses = nbdist.runs[-1].metrics.groupby("step")["loss"].mean().to_numpy()
    assert run_cell(ip, f"%distribute export {path} --force").success
    return losses


#: ``python -c WITHOUT_NBDIST script args``: the script run as if nbdist were not installed
#: (whatever the install: an import of nbdist fails, which is checked first).
WITHOUT_NBDIST = """\
import runpy, sys
sys.modules["nbdist"] = None
try:
    import nbdist
except ImportError:
    pass
else:
    raise SystemExit("nbdist is importable")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
