"""The magics through a real IPython shell: happy paths and every bad input of the core."""

import re
import socket
import time

import pytest
from helpers import interrupt_me, once_running, run_err, run_ok

import nbdist
from nbdist.errors import (
    ConfigError,
    DataError,
    DeviceError,
    NbdistError,
    RunInterrupted,
    StepCodeError,
)

SETUP = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 32
rng = np.random.default_rng(0)
xs = rng.normal(size=(GLOBAL_BATCH * 8, 4)).astype("float32")
ys = rng.normal(size=(GLOBAL_BATCH * 8, 1)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(GLOBAL_BATCH, drop_remainder=True)
def make_counter():
    return tf.Variable(0.0)
"""

BUILD = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam(0.01)
"""

BODY = """x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0], global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    run_ok(ip, BUILD)
    return ip


def step_cell(flags: str, body: str = BODY) -> str:
    return f"%%distribute --step --data ds {flags}\n{body}"


def assert_usable(shell):
    run_ok(shell, step_cell("--steps 2"))
    assert nbdist.runs[-1].status == "done"


def test_status_shows_strategy_devices_and_equivalent_code(ip, capsys):
    ip.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    assert "mirrored" in out and "replicas   4" in out and "/device:CPU:3" in out
    assert "tf.distribute.MirroredStrategy" in out and "set_logical_device_configuration" in out


def test_step_mode_records_one_row_per_step_and_replica(shell):
    run_ok(shell, step_cell("--epochs 2"))
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.status == "done" and run.steps_done == 16 and run.total_steps == 16
    assert len(frame) == 16 * 4 and set(frame["epoch"]) == {0, 1}
    assert frame["loss"].notna().all() and frame["grad_norm"].notna().all()
    assert frame["step_ms"].gt(0).all()
    timed_steps = frame.groupby("step")["allreduce_ms"].first().notna()
    assert timed_steps.iloc[:2].all() and 2 <= timed_steps.sum() <= 4   # paced, not every step


def test_metrics_have_the_documented_columns_and_data_ms_is_the_input_wait(shell):
    """README: one row per (step, replica) with these columns; data_ms is the time spent
    waiting for the input pipeline (here one that takes 50 ms per batch, against `ds`; it
    runs ahead while the first step is traced, then the steps wait for it)."""
    run_ok(shell, step_cell("--steps 6"))
    quick = nbdist.runs[-1].metrics
    assert list(quick.columns) == [
        "step", "epoch", "replica", "worker", "loss", "grad_norm", "allreduce_ms", "wait_ms",
        "compute_ms", "other_collective_ms", "step_ms", "data_ms", "wall_time"]
    run_ok(shell, """
import time
def slowly(x):
    time.sleep(0.05)
    return x
slow_ds = ds.repeat().map(
    lambda x, y: (tf.ensure_shape(tf.numpy_function(slowly, [x], tf.float32), x.shape), y))
""")
    run_ok(shell, "%%distribute --step --data slow_ds --steps 30\n" + BODY)
    slow = nbdist.runs[-1].metrics
    assert list(slow.columns) == list(quick.columns)
    for frame in (quick, slow):
        assert frame["data_ms"].notna().all() and (frame["data_ms"] >= 0).all()
        assert frame.groupby("step")["data_ms"].nunique().eq(1).all()   # one value per step
    waits = slow.groupby("step")["data_ms"].first()
    assert waits.iloc[-10:].min() > 25            # a step takes a few ms: ~50 ms waited
    assert waits.iloc[-10:].median() > 10 * quick["data_ms"].median()


def test_scope_mode_fit_is_recorded(shell):
    run_ok(shell, """%%distribute
model.compile(optimizer="adam", loss="mse")
history = model.fit(ds, epochs=2, verbose=0)
""")
    run = nbdist.runs[-1]
    assert run.mode == "fit" and run.status == "done" and run.steps_done == 16
    frame = run.metrics
    assert (frame["replica"] == -1).all() and frame["loss"].notna().all()
    assert frame["loss"].iloc[-1] == pytest.approx(shell.user_ns["history"].history["loss"][-1])


def test_python_control_flow_on_tensors_works_in_the_step(shell):
    run_ok(shell, step_cell("--steps 3", """x, y = batch
with tf.GradientTape() as tape:
    err = tf.square(model(x) - y)[:, 0]
    if tf.reduce_mean(err) > 1000.0:      # a tensor condition: AutoGraph makes it tf.cond
        err = err / 1000.0
    total = tf.constant(0.0)
    for i in tf.range(3):                 # a loop over a tensor: tf.while_loop
        total += tf.cast(i, tf.float32) * 0.0
    loss = tf.nn.compute_average_loss(err + total, global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""))
    assert nbdist.runs[-1].status == "done" and nbdist.runs[-1].steps_done == 3


def test_show_code_prints_the_generated_step(shell, capsys):
    run_ok(shell, step_cell("--steps 1 --show-code"))
    out = capsys.readouterr().out
    assert "def _nbdist_step(batch):" in out and "optimizer.apply_gradients" in out


def test_a_terminal_keeps_the_summary_of_each_run_not_a_figure(shell, capsys):
    """IPython keeps every displayed bundle of the session (``history_manager.outputs``): a
    terminal, which prints only text, must not be given a figure per run to keep."""
    outputs = shell.history_manager.outputs
    before = {count: len(kept) for count, kept in outputs.items()}
    run_ok(shell, step_cell("--steps 2"))
    new = [o.bundle for count, kept in outputs.items() for o in kept[before.get(count, 0):]]
    assert new and all(set(bundle) == {"text/plain"} for bundle in new), new
    assert f"Run {len(nbdist.runs)} (step, mirrored" in capsys.readouterr().out


@pytest.mark.parametrize("line, kind, words", [
    ("mirored --devices 2", ConfigError, "Did you mean `mirrored`"),
    ("mirrored --devices 0", ConfigError, "--devices 0"),
    ("mirrored --devices -3", ConfigError, "--devices -3"),
    ("mirrored --gpus 2", ConfigError, "--gpus is not a flag of the `%distribute` line"),
    ("mirrored --devices 8", DeviceError, "Restart the kernel"),
    ("parameter_server --workers 2 --ps 0", ConfigError, "--ps 0 is not allowed"),
])
def test_bad_strategy_lines(shell, line, kind, words):
    with pytest.raises(kind, match=words):
        shell.run_line_magic("distribute", line)
    assert nbdist.session.current_session().backend.replicas == 4
    assert_usable(shell)


def test_more_gpus_than_exist(monkeypatch):
    from nbdist import strategies

    monkeypatch.setattr(strategies, "physical_gpus", lambda: ["GPU:0", "GPU:1"])
    with pytest.raises(DeviceError, match="asks for 4 GPUs but this machine has 2"):
        strategies.ensure_local_devices(4)


@pytest.mark.parametrize("flags, body, kind, words", [
    ("", BODY, ConfigError, "--data needs a value"),
    ("--steps 1", "x = (\n", StepCodeError, "cell line 2"),
    ("--steps 1", "x, y = batch\nprediction = model(x)\n", StepCodeError, "assign"),
    ("--steps 1", BODY + "return loss\n", StepCodeError, "cell line 7 `return loss`"),
    ("--steps 1", BODY + "yield loss\n", StepCodeError, "cell line 7"),
    ("--steps 1 --grads loss", BODY, StepCodeError, "list of gradient tensors"),
    ("--steps 1", "counter = tf.Variable(0.0)\n" + BODY, StepCodeError,
     r"cell line 2 `counter = tf\.Variable\(0\.0\)`: the step creates a tf\.Variable"),
    # created by a helper, under lines that only mention tf.Variable( (the line is the call's)
    ("--steps 1", "# no tf.Variable(1.0) here\nnote = 'tf.Variable(2)'\ncounter = make_counter()\n"
     + BODY, StepCodeError, r"cell line 4 `counter = make_counter\(\)`: the step creates"),
    ("--steps 1 --steps-per-call 2", "note = 'tf.Variable(2)'\nc = make_counter()\n" + BODY,
     StepCodeError, r"cell line 3 `c = make_counter\(\)`: the step creates a tf\.Variable"),
    ("--steps 1", BODY + "tf.debugging.assert_all_finite(tf.math.log(-tf.abs(x) - 1.0), 'bad')\n",
     StepCodeError, "cell line 7 .*InvalidArgumentError.*bad"),
])
def test_bad_step_cells(shell, flags, body, kind, words):
    cell = f"%%distribute --step --data {flags}\n{body}" if not flags else step_cell(flags, body)
    err = run_err(shell, cell)
    assert isinstance(err, kind), repr(err)
    assert re.search(words, str(err)), str(err)
    assert_usable(shell)


def test_step_without_data(shell):
    err = run_err(shell, "%%distribute --step\n" + BODY)
    assert isinstance(err, ConfigError) and "--step needs --data" in str(err)


@pytest.mark.parametrize("setup, words", [
    ("", "no variable `nothing_here`"),
    ("nothing_here = [1, 2, 3]", "builtins.list, which nbdist cannot read"),
    ("nothing_here = tf.data.Dataset.range(10)", "single examples"),
    ("nothing_here = ds.unbatch().batch(2)", "fewer than the 4"),
    ("nothing_here = ds.repeat()", "repeats forever"),
])
def test_bad_datasets(shell, setup, words):
    shell.user_ns.pop("nothing_here", None)
    run_ok(shell, setup)
    err = run_err(shell, "%%distribute --step --data nothing_here\n" + BODY)
    assert isinstance(err, (DataError, ConfigError)) and words in str(err), str(err)
    assert_usable(shell)


def test_kernel_interrupt_stops_at_a_step_boundary_and_keeps_the_partial_run(shell):
    run_ok(shell, "long_ds = ds.repeat()")
    watcher, sent = once_running(interrupt_me)        # once rows arrive: tracing is over
    err = run_err(shell, "%%distribute --step --data long_ds --steps 100000\n" + BODY)
    returned = time.monotonic()
    watcher.join()
    assert isinstance(err, RunInterrupted), repr(err)
    assert returned - sent[0] < 30
    run = nbdist.runs[-1]
    assert run.status == "interrupted" and 0 < run.steps_done < 100000
    assert len(run.metrics) == run.steps_done * 4   # whole steps only
    assert_usable(shell)


def test_tpu_without_a_tpu_fails_fast(shell):
    started = time.monotonic()
    with pytest.raises(DeviceError, match="No TPU could be reached"):
        shell.run_line_magic("distribute", "stop")
        try:
            shell.run_line_magic("distribute", "tpu")
        finally:
            shell.run_line_magic("distribute", "mirrored --devices 4")
    assert time.monotonic() - started < 60


def test_tpu_address_that_never_answers_is_bounded(shell, monkeypatch):
    from nbdist import strategies

    monkeypatch.setattr(strategies, "TPU_PROBE_TIMEOUT_S", 15)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    address = f"grpc://127.0.0.1:{silent.getsockname()[1]}"
    started = time.monotonic()
    try:
        with pytest.raises(DeviceError, match="No TPU could be reached"):
            shell.run_line_magic("distribute", "stop")
            try:
                shell.run_line_magic("distribute", f"tpu --tpu {address}")
            finally:
                shell.run_line_magic("distribute", "mirrored --devices 4")
    finally:
        silent.close()
    assert time.monotonic() - started < 40


def test_central_storage_fit_does_not_show_keras_wrong_loss(shell):
    shell.run_line_magic("distribute", "stop")
    shell.run_line_magic("distribute", "central_storage --devices 2")
    try:
        run_ok(shell, """%%distribute
cs_model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
cs_model.compile(optimizer="adam", loss="mse")
cs_model.fit(ds, epochs=1, verbose=0)
""")
    finally:
        shell.run_line_magic("distribute", "stop")
        shell.run_line_magic("distribute", "mirrored --devices 4")
    run = nbdist.runs[-1]
    assert run.strategy == "central_storage" and run.steps_done == 8
    frame = run.metrics
    assert frame["loss"].isna().all() and frame["keras_reported_loss"].notna().all()
    assert any("CentralStorageStrategy" in note for note in run.notes)


def test_central_storage_step_mode_records_real_losses(shell):
    shell.run_line_magic("distribute", "stop")
    shell.run_line_magic("distribute", "central_storage --devices 2")
    try:
        run_ok(shell, BUILD)
        run_ok(shell, step_cell("--steps 4"))
    finally:
        shell.run_line_magic("distribute", "stop")
        shell.run_line_magic("distribute", "mirrored --devices 4")
    frame = nbdist.runs[-1].metrics
    assert len(frame) == 8 and frame["loss"].notna().all() and frame["grad_norm"].gt(0).all()


def test_rebuilding_the_strategy_in_one_kernel_keeps_collectives_working(shell):
    """TensorFlow remembers collective keys per process: each new strategy needs fresh ones."""
    try:
        for line in ("mirrored --devices 2", "mirrored --devices 3", "mirrored --devices 3"):
            shell.run_line_magic("distribute", "stop")
            shell.run_line_magic("distribute", line)
            run_ok(shell, BUILD)
            run_ok(shell, step_cell("--steps 2"))
            assert nbdist.runs[-1].replicas == int(line[-1])
    finally:
        shell.run_line_magic("distribute", "stop")
        shell.run_line_magic("distribute", "mirrored --devices 4")


def _traceback_shown(capsys) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)


@pytest.mark.parametrize("cell, user_line, inner", [
    ("x = 1\ny = tb_helper(x)\n", "----> 3 y = tb_helper(x)", "return v / 0"),
    # through nbdist's recording of model.fit, into Keras
    ("tb_model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs='two', verbose=0)\n",
     "----> 2 tb_model.fit(", "keras"),
])
def test_a_scope_cell_error_shows_the_users_frames_not_nbdists(ip, capsys, cell, user_line,
                                                               inner):
    run_ok(ip, "def tb_helper(v):\n    return v / 0\n")
    run_ok(ip, "%%distribute\nimport keras, numpy as np\n"
               "tb_model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])\n"
               "tb_model.compile('sgd', 'mse')\n")
    capsys.readouterr()
    err = run_err(ip, "%%distribute\n" + cell)
    assert not isinstance(err, NbdistError)
    text = _traceback_shown(capsys)
    assert user_line in text and inner in text, text
    assert "nbdist/" not in text and "contextlib" not in text, text


# -- after `%distribute stop`, what messages suggest: the kernel's last strategy line ---------

def test_after_stop_every_suggestion_is_the_last_strategy_line(shell, capsys):
    try:
        shell.run_line_magic("distribute", "stop")
        run_ok(shell, "%distribute   one_device    # a comment is not part of the line")
        with pytest.raises(NbdistError):   # refused: the last line stays the one that worked
            shell.run_line_magic("distribute", "mirrored --devices 99")
        shell.run_line_magic("distribute", "stop")
        again = "`%distribute one_device` again (the last strategy of this kernel)"
        err = run_err(shell, step_cell("--steps 2"))
        assert isinstance(err, ConfigError), repr(err)
        assert str(err) == (f"No strategy is set. Run {again} first, or put the strategy on "
                            "the cell line: `%%distribute one_device`."), str(err)
        with pytest.raises(ConfigError) as raised:
            nbdist.strategy()
        assert str(raised.value) == (f"No strategy is set: run {again} first; `strategy` is "
                                     "then the notebook's.")
        capsys.readouterr()
        shell.run_line_magic("distribute", "status")
        assert capsys.readouterr().out == f"nbdist: no strategy set. Try {again}.\n"
        shell.run_line_magic("distribute", "")   # the picker, as text in a terminal
        assert ("Choose one with a line, e.g. `%distribute one_device` (the last one in this "
                "kernel).") in capsys.readouterr().out
        # one_device has no workers: what needs them still names a worker family
        with pytest.raises(ConfigError, match=r"Start them with `%distribute multiworker "
                                              r"--workers N`\.$"):
            shell.run_line_magic("distribute", "restart")
        assert "mirrored --devices 2" not in str(err) + str(raised.value)
    finally:
        shell.run_line_magic("distribute", "stop")
        shell.run_line_magic("distribute", "mirrored --devices 4")


def test_the_suggestion_is_generic_only_in_a_kernel_that_never_set_a_strategy(ip):
    from nbdist.backends.base import WORKERS_LINE
    from nbdist.session import GENERIC_LINE, Session
    from nbdist.spec import StrategySpec

    fresh = Session(ip)   # no strategy line run yet
    with pytest.raises(ConfigError, match=re.escape(f"run `{GENERIC_LINE}` (or another "
                                                    "strategy) first")):
        fresh.strategy()
    with pytest.raises(ConfigError, match=re.escape(f"`%{GENERIC_LINE}`.")):
        fresh.require(None)
    assert fresh.status_text() == (f"nbdist: no strategy set. Try `{GENERIC_LINE}` (or "
                                   "another strategy).")
    with pytest.raises(ConfigError, match=re.escape(f"`{WORKERS_LINE}`")):
        fresh.push()
    # a worker family's line, as the user typed it with --keras: suggested whole, and on a
    # cell line without --keras (the cell takes no --keras); refusals that need workers name it
    fresh._remember(StrategySpec("multiworker", workers=2), "legacy",
                    "%distribute multiworker --workers 2 --keras legacy")
    line = "%distribute multiworker --workers 2 --keras legacy"
    with pytest.raises(ConfigError) as err:
        fresh.require(None)
    assert str(err.value) == (f"No strategy is set. Run `{line}` again (the last strategy of "
                              "this kernel) first, or put the strategy on the cell line: "
                              "`%%distribute multiworker --workers 2`.")
    for act in (fresh.restart, fresh.push, lambda: fresh.inject("kill", "1")):
        with pytest.raises(ConfigError, match=re.escape(f"`{line}`")):
            act()
    with pytest.raises(ConfigError, match="lives in each worker process"):
        fresh.strategy()
    # without a typed line (the picker, an inline strategy): the spec's own
    fresh._remember(StrategySpec("parameter_server", workers=2, ps=1), None, None)
    assert fresh.last_line == "%distribute parameter_server --workers 2 --ps 1"
