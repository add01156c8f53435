"""`%distribute pull` and `push` refuse TensorFlow and Keras objects at once, and the cluster
stays usable; a pulled name that is a Keras model comes as a model of the kernel's Keras.

Pickling a Keras History pickles its model on the one worker it comes from; saving the model
reads its metrics' SyncOnReadVariables, an all-reduce that only that worker would join, so it
would wait for the others for ever. The refusal comes from a check on the worker, by type,
before anything is pickled.

One 2-worker cluster serves the module; the kernel's own strategy (4 logical CPUs, conftest)
is restored at the end for the other test modules. The walker's own tests are
tests/test_cluster_pull_walker.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import psutil
import pytest
from cluster_cells import SETUP, STEP
from helpers import run_ok

import nbdist
from nbdist.backends.base import no_workers
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.errors import ConfigError
from nbdist.session import current_session

#: A refusal, a check and a pull of plain data each take milliseconds; this bounds them.
AT_ONCE_S = 2.0
#: A pull still blocked after this long is interrupted, so the old behaviour (blocked in a
#: collective forever) fails the test instead of hanging it.
BLOCKED_S = 20.0

FIT = """%%distribute
model.compile(optimizer="sgd", loss="mse")
history = model.fit(ds, epochs=1, verbose=0)
"""


@pytest.fixture(scope="module")
def mw(ip):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    session = current_session()
    try:
        run_ok(ip, SETUP)
        yield ip
    finally:
        procs = session.backend.processes() if session.backend is not None else []
        ip.run_line_magic("distribute", "stop")
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert live_clusters() == []
    assert not [p.pid for p in procs if _alive(p)], "processes left after %distribute stop"


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def not_blocked(what: str, seconds: float = BLOCKED_S):
    """Fail (not hang) when the block takes over ``seconds``: interrupt it with SIGINT, as
    Kernel > Interrupt would, and turn the KeyboardInterrupt into the test's failure.
    (ipyparallel's blocking calls swallow it and return: HEAD's pull then "pulled" an
    AsyncResult after ``seconds``, which ``refused`` reports.)"""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    except KeyboardInterrupt:
        pytest.fail(f"{what} was still blocked after {seconds:g} s", pytrace=False)
    finally:
        done.set()
        watcher.join()


def refused(shell, line: str) -> tuple[str, float]:
    """The refusal ``%distribute LINE`` raises, and how long it took."""
    start = time.monotonic()
    with not_blocked(f"%distribute {line}"):
        try:
            shell.run_line_magic("distribute", line)
        except ConfigError as err:
            return str(err), time.monotonic() - start
    pytest.fail(f"%distribute {line} was not refused (it returned after "
                f"{time.monotonic() - start:.1f} s)", pytrace=False)


def cluster():
    return current_session().backend


def assert_usable(shell, capsys) -> None:
    """A step cell trains on both workers (no collective was aborted) and the cluster is
    not marked broken."""
    with not_blocked("the step cell after the refusal"):
        run_ok(shell, STEP.format(data="ds", flags="--steps 2"))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 2, (run.status, run.notes)
    assert cluster().broken is None
    capsys.readouterr()
    shell.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    assert "BROKEN" not in out and out.count("alive, pid") == 2


def test_under_a_strategy_in_the_kernel_a_model_is_already_here(ip, capsys):
    ip.run_line_magic("distribute", "mirrored --devices 4")
    run_ok(ip, "import keras\nkernel_net = keras.Sequential([keras.Input((4,)), "
               "keras.layers.Dense(1)])\nsame_net = kernel_net")
    capsys.readouterr()
    ip.run_line_magic("distribute", "pull kernel_net")
    assert capsys.readouterr().out == (
        "nbdist: `kernel_net` is already in this kernel: under mirrored every cell runs here, "
        "so there is nothing to pull.\n")
    assert ip.user_ns["kernel_net"] is ip.user_ns["same_net"]
    with pytest.raises(ConfigError) as err:   # a value that is not a model: refused as before
        ip.run_line_magic("distribute", "pull same_net_weights")
    assert str(err.value) == no_workers("pull")


def test_pulling_a_history_is_refused_at_once_and_its_history_dict_comes(mw, tf_keras, capsys):
    run_ok(mw, FIT)
    assert nbdist.runs[-1].mode == "fit" and nbdist.runs[-1].status == "done"
    text, took = refused(mw, "pull history --worker 1")
    with capsys.disabled():
        print(f"\nrefused `pull history --worker 1` in {took * 1000:.0f} ms")
    assert took < AT_ONCE_S
    assert text.startswith("`%distribute pull history` refused: `history` on worker 1 is a "
                           "Keras History callback (tf_keras.src.callbacks.History)"), text
    assert "read its variables" in text and "collective" in text and "stall" in text, text
    assert "Pull `history.history` instead: a dict of lists" in text, text
    assert "\n" not in text and "Nothing was pickled" in text

    start = time.monotonic()
    with not_blocked("pull history.history"):
        mw.run_line_magic("distribute", "pull history.history --worker 1")
    took = time.monotonic() - start
    assert "pulled history.history from worker 1 into `history_history`" in \
        capsys.readouterr().out
    assert mw.user_ns["history_history"]["loss"]
    assert took < AT_ONCE_S
    pulled = current_session().pull("history.history", 1)
    assert isinstance(pulled, dict) and list(pulled) == ["loss"] and len(pulled["loss"]) == 1
    assert current_session().pull("history.history['loss']", 1) == pulled["loss"]
    assert_usable(mw, capsys)


def test_models_variables_datasets_and_what_holds_them_are_refused_with_what_to_pull(
        mw, tf_keras, capsys):
    run_ok(mw, "%%distribute\nresults = {'model': model, 'epochs': 3}\nv = model.weights[0]\n"
               "t = tf.constant([1.0, 2.0]) * (nbdist_worker + 1)\n")
    cases = {
        "optimizer": ("`optimizer` on worker 0 is a Keras optimizer (tf_keras.", "pull those"),
        "results": ("`results` on worker 0 holds a Keras model (tf_keras.src.engine.sequential."
                    "Sequential) at `results['model']`",
                    "Pull the model itself instead: `%distribute pull results['model']`"),
        "v": ("`v` on worker 0 is a variable (tensorflow.python.distribute.values."
              "MirroredVariable)", "`value = v.numpy()`"),
        "ds": ("`ds` on worker 0 is a dataset", "list(ds.take(2).as_numpy_iterator())"),
        "strategy": ("`strategy` on worker 0 is a tf.distribute strategy",
                     "nothing to copy"),
        "model.weights": ("`model.weights` on worker 0 is not a plain attribute of its "
                          "tf_keras.src.engine.sequential.Sequential",
                          "`value = model.weights` (every worker runs it)"),
    }
    for name, (what, instead) in cases.items():
        text, took = refused(mw, f"pull {name}")
        assert took < AT_ONCE_S, (name, took)
        assert what in text and instead in text, (name, text)
    text, _ = refused(mw, "pull sorted(results)")
    assert "pull takes a variable name, with `.attribute` and `[key]` parts" in text
    text, _ = refused(mw, "pull nothing_here")
    assert text.startswith("worker 0 has no variable `nothing_here`: ") and \
        "`%distribute push nothing_here`" in text

    # plain data still comes: a local EagerTensor, weights computed on every worker, a number
    t = current_session().pull("t", 1)
    np.testing.assert_array_equal(np.asarray(t), [2.0, 4.0])
    run_ok(mw, "%%distribute\nweights = model.get_weights()")
    weights = current_session().pull("weights", 1)
    assert [w.shape for w in weights] == [(4, 1), (1,)]
    assert current_session().pull("results['epochs']", 1) == 3
    assert_usable(mw, capsys)


def test_pushing_a_kernel_side_keras_model_is_refused_at_once(mw):
    run_ok(mw, "import keras\nkernel_model = keras.Sequential([keras.Input((4,)), "
               "keras.layers.Dense(1)])\nkernel_box = {'config': {'units': 1}, "
               "'layers': [kernel_model.layers[0]]}\nlr_scale = 2")
    text, took = refused(mw, "push lr_scale kernel_model")
    print(f"\nrefused `push kernel_model` in {took * 1000:.0f} ms")
    assert took < AT_ONCE_S
    assert text.startswith("`%distribute push kernel_model` refused: `kernel_model` in this "
                           "kernel is a Keras model (keras.src.models.sequential.Sequential)")
    assert "`weights = kernel_model.get_weights()` here" in text and "Nothing was sent" in text
    text, _ = refused(mw, "push kernel_box")
    assert "holds a Keras layer (keras.src.layers.core.dense.Dense) at " \
           "`kernel_box['layers'][0]`" in text, text
    # nothing was sent, not even the plain value pushed with the model
    seen = run_ok(mw, "%%distribute\n'kernel_model' in dir(), 'lr_scale' in dir()")
    assert seen.values == {0: "(False, False)", 1: "(False, False)"}
    mw.run_line_magic("distribute", "push lr_scale")
    assert run_ok(mw, "%%distribute\nlr_scale").values == {0: "2", 1: "2"}


PROBE = "import numpy as np\nprobe = np.linspace(-1, 1, 8, dtype='float32').reshape(2, 4)"
#: A subclassed model, ``{keras}`` being tf.keras on the workers and Keras 3 in the kernel.
SUBCLASSED = """class Doubler({keras}.Model):
    def __init__(self):
        super().__init__()
        self.dense = {keras}.layers.Dense(2)

    def call(self, x):
        return 2 * self.dense(x)

sub = Doubler()
sub(probe)
"""


def workers_predict(shell, name: str) -> np.ndarray:
    """``name``'s output for PROBE on worker 0 (every worker runs the call)."""
    run_ok(shell, f"%%distribute\n{PROBE}\nworker_out = {name}(probe).numpy()")
    return current_session().pull("worker_out", 0)


def pulled(shell, capsys, line: str) -> str:
    capsys.readouterr()
    with not_blocked(f"%distribute {line}"):
        shell.run_line_magic("distribute", line)
    return capsys.readouterr().out


def test_a_sequential_trained_on_the_workers_comes_built_in_the_kernels_keras(
        mw, tf_keras, capsys):
    run_ok(mw, FIT)
    mw.user_ns.pop("model", None)
    assert pulled(mw, capsys, "pull model") == (
        "nbdist: pulled model from worker 0: a Sequential model of this kernel's Keras, built "
        "from its config, with its weights.\n")
    model = mw.user_ns["model"]
    assert type(model).__module__.startswith("keras.src.")   # Keras 3, not tf_keras
    run_ok(mw, PROBE)
    np.testing.assert_allclose(model.predict(mw.user_ns["probe"], verbose=0),
                               workers_predict(mw, "model"), rtol=1e-6)


def test_a_kernel_model_of_the_same_shapes_gets_the_weights_in_place(mw, tf_keras, capsys):
    run_ok(mw, f"import keras\n{PROBE}\nmodel = keras.Sequential([keras.Input((4,)), "
               "keras.layers.Dense(1)])\nbefore = model\nuntrained = model(probe).numpy()")
    run_ok(mw, STEP.format(data="ds", flags="--steps 2"))   # the workers train on
    assert pulled(mw, capsys, "pull model --worker 1") == (
        "nbdist: pulled model from worker 1: its weights are set into this kernel's `model` "
        "(the same object).\n")
    assert mw.user_ns["model"] is mw.user_ns["before"]
    theirs = workers_predict(mw, "model")
    assert not np.allclose(mw.user_ns["untrained"], theirs)
    np.testing.assert_allclose(mw.user_ns["model"](mw.user_ns["probe"]), theirs, rtol=1e-6)


def test_a_subclassed_model_is_refused_until_the_kernel_builds_it(mw, tf_keras, capsys):
    run_ok(mw, f"%%distribute\n{PROBE}\n" + SUBCLASSED.format(keras="tf.keras"))
    mw.user_ns.pop("sub", None)
    text, took = refused(mw, "pull sub")
    assert took < AT_ONCE_S
    assert text.startswith("`%distribute pull sub` refused: `sub` on worker 0 is a Keras model "
                           "(__main__.Doubler) that this kernel cannot make, because it is a "
                           "subclassed model"), text
    assert "Build the model in this kernel first: run the code that makes it in a plain cell" \
        in text and "then run `%distribute pull sub` again" in text and "\n" not in text
    assert "sub" not in mw.user_ns
    # doing what it says: the same code in the kernel, then the same line
    run_ok(mw, f"import keras\n{PROBE}\n" + SUBCLASSED.format(keras="keras"))
    mine = mw.user_ns["sub"]
    assert "(the same object)" in pulled(mw, capsys, "pull sub")
    assert mw.user_ns["sub"] is mine
    np.testing.assert_allclose(mine(mw.user_ns["probe"]), workers_predict(mw, "sub"), rtol=1e-6)
    assert_usable(mw, capsys)


