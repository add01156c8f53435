"""Code pasted from TensorFlow's and Keras' pages into `%%distribute` cells, as written: it
trains on the session's strategy, or one clear sentence names the change to make.

The shared `ip` shell runs `%distribute mirrored --devices 4` (tests/conftest.py)."""

import os

import pytest
from helpers import assert_changed_nothing, run_err, run_ok

import nbdist
from nbdist.errors import ConfigError, NbdistWarning, StepCodeError

MNIST_LIKE = """
import numpy as np
import tensorflow as tf
import keras
rng = np.random.default_rng(0)
images = rng.random((64, 28, 28, 1)).astype("float32")
labels = rng.integers(0, 10, 64)
train_dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)
"""

# TensorFlow's "Distributed training with Keras": the strategy cell and the model cell
TF_KERAS_TUTORIAL = """%%distribute
strategy = tf.distribute.MirroredStrategy()
print('Number of devices: {}'.format(strategy.num_replicas_in_sync))

with strategy.scope():
  model = tf.keras.Sequential([
      tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64, activation='relu'),
      tf.keras.layers.Dense(10)
  ])

  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=tf.keras.optimizers.Adam(),
                metrics=['accuracy'])
model.fit(train_dataset, epochs=1)
"""


@pytest.fixture
def shell(ip):
    run_ok(ip, MNIST_LIKE)
    return ip


def test_tf_keras_tutorial_with_its_own_mirrored_strategy_trains_on_the_sessions(shell, capsys):
    session_strategy = nbdist.strategy()
    capsys.readouterr()
    run_ok(shell, TF_KERAS_TUTORIAL)
    out = capsys.readouterr().out
    assert ("nbdist: `tf.distribute.MirroredStrategy()` on cell line 2 uses the notebook's "
            "mirrored strategy (4 replicas); nothing else was built.\n") in out
    assert "Number of devices: 4\n" in out
    ns = shell.user_ns
    assert ns["strategy"] is session_strategy is nbdist.strategy()   # never a second one
    assert ns["model"].distribute_strategy is session_strategy
    run = nbdist.runs[-1]
    assert (run.mode, run.status, run.replicas, run.steps_done) == ("fit", "done", 4, 4)


# keras.io "Multi-GPU distributed training with TensorFlow": fault tolerance
KERAS_IO_HELPERS = """
def get_compiled_model():
    inputs = keras.Input(shape=(784,))
    x = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(10)(x)
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model

flat = images.reshape(64, 784)
train_dataset = tf.data.Dataset.from_tensor_slices((flat, labels)).batch(16)
val_dataset = train_dataset.take(1)
"""

KERAS_IO_RESTORE = """%%distribute
import os

# Prepare a directory to store all the checkpoints.
checkpoint_dir = CKPT
if not os.path.exists(checkpoint_dir):
    os.makedirs(checkpoint_dir)


def make_or_restore_model():
    # Either restore the latest model, or create a fresh one
    # if there is no checkpoint available.
    checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
    if checkpoints:
        latest_checkpoint = max(checkpoints, key=os.path.getctime)
        print("Restoring from", latest_checkpoint)
        return keras.models.load_model(latest_checkpoint)
    print("Creating a new model")
    return get_compiled_model()


def run_training(epochs=1):
    # Create a MirroredStrategy.
    strategy = tf.distribute.MirroredStrategy()

    # Open a strategy scope and create/restore the model
    with strategy.scope():
        model = make_or_restore_model()

        callbacks = [
            # This callback saves a SavedModel every epoch
            # We include the current epoch in the folder name.
            keras.callbacks.ModelCheckpoint(
                filepath=checkpoint_dir + "/ckpt-{epoch}.keras",
                save_freq="epoch",
            )
        ]
        model.fit(
            train_dataset,
            epochs=epochs,
            callbacks=callbacks,
            validation_data=val_dataset,
            verbose=2,
        )


# Running the first time creates the model
run_training(epochs=1)

# Calling the same function again will resume from where we left off
run_training(epochs=1)
"""


def test_keras_io_make_or_restore_model_uses_the_sessions_strategy(shell, capsys, tmp_path):
    run_ok(shell, KERAS_IO_HELPERS)
    shell.user_ns["CKPT"] = str(tmp_path / "ckpt")
    before = len(nbdist.runs)
    capsys.readouterr()
    run_ok(shell, KERAS_IO_RESTORE)
    out = capsys.readouterr().out
    assert ("nbdist: `tf.distribute.MirroredStrategy()` on cell line 24 uses the notebook's "
            "mirrored strategy (4 replicas); nothing else was built.\n") in out
    assert "Creating a new model" in out
    assert f"Restoring from {tmp_path}/ckpt/ckpt-1.keras" in out
    fits = nbdist.runs[before:]
    assert [(r.status, r.replicas) for r in fits] == [("done", 4), ("done", 4)]
    assert shell.user_ns["strategy"] is nbdist.strategy()


def _refused(shell, capsys, cell: str) -> str:
    """Run a cell nbdist must refuse before anything runs; its message. The notebook's
    names, runs and strategy are as they were."""
    ns = shell.user_ns
    session_strategy = nbdist.strategy()
    names = set(ns)
    runs = len(nbdist.runs)
    capsys.readouterr()
    err = run_err(shell, cell)
    assert isinstance(err, ConfigError)
    assert set(ns) == names and ns["strategy"] is session_strategy is nbdist.strategy()
    assert len(nbdist.runs) == runs
    assert "nbdist:" not in capsys.readouterr().out
    assert_changed_nothing(shell, runs, "/nonexistent-nbdist-dir", capsys)
    return str(err)


def test_another_familys_strategy_is_refused_with_the_line_that_builds_it(shell, capsys):
    message = _refused(shell, capsys, """%%distribute
from tensorflow.distribute import MultiWorkerMirroredStrategy
strategy_x = MultiWorkerMirroredStrategy()
with strategy_x.scope():
    model_x = tf.keras.Sequential([tf.keras.layers.Dense(1)])
""")
    assert message == (
        "cell line 3 `MultiWorkerMirroredStrategy()` builds a MultiWorkerMirroredStrategy "
        "(nbdist's `multiworker`), but this notebook's strategy is `%distribute mirrored "
        "--devices 4`, and "
        "TensorFlow cannot mix two strategies. Run `%distribute multiworker --workers 2` first "
        "(nbdist then starts the workers, sets their TF_CONFIG and builds the strategy on "
        "each), then this cell: the line then uses the notebook's strategy.")


def test_devices_the_session_does_not_have_are_refused_with_the_devices_flag(shell, capsys):
    message = _refused(shell, capsys, """%%distribute
strategy_x = tf.distribute.MirroredStrategy(devices=["/gpu:0", "/gpu:1"])
""")
    assert message == (
        'cell line 2 `tf.distribute.MirroredStrategy(devices=["/gpu:0", "/gpu:1"])` asks for '
        "/gpu:0, /gpu:1, but this notebook's strategy runs on CPU:0, CPU:1, CPU:2, CPU:3: run "
        "`%distribute mirrored --devices 2` (GPUs when the machine has them, else the CPU split "
        "into 2 devices), then this cell without the devices argument.")


# The multi-worker listing users copy: TF_CONFIG set by hand, then the strategy
MULTIWORKER_LISTING = """%%distribute
import os, json
os.environ['TF_CONFIG'] = json.dumps({
    'cluster': {'worker': ['host1:12345', 'host2:23456', 'host3:34567']},
    'task': {'type': 'worker', 'index': 0}
})
strategy_x = tf.distribute.experimental.MultiWorkerMirroredStrategy()
"""


def test_tf_config_in_a_cell_is_refused_with_the_multiworker_line(shell, capsys, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    message = _refused(shell, capsys, MULTIWORKER_LISTING)
    assert message == (
        "cell line 3 `os.environ['TF_CONFIG'] = json.dumps({`: nbdist sets TF_CONFIG for its "
        "workers itself (each worker gets its own, with free ports) and builds the strategy on "
        "each, so a cell must not set it. `%distribute multiworker --workers 3` starts the "
        "workers on this machine (the 3 workers its TF_CONFIG lists), `%distribute multiworker "
        "--cluster PROFILE` on the engines of an ipyparallel cluster (SSH, MPI, Slurm...) such "
        "as the hosts it names; then run the cell without the TF_CONFIG lines: its strategy "
        "line then uses the notebook's strategy.")
    assert "TF_CONFIG" not in os.environ


# -- the same code pasted into cells without %%distribute ------------------------------------

def test_a_plain_cell_pasted_under_mirrored_trains_on_the_sessions_strategy(shell, capsys):
    session_strategy = nbdist.strategy()
    before = len(nbdist.runs)
    plain = TF_KERAS_TUTORIAL.removeprefix("%%distribute\n")
    capsys.readouterr()
    run_ok(shell, plain)
    out = capsys.readouterr().out
    assert out.startswith(
        "nbdist: `tf.distribute.MirroredStrategy()` on cell line 1 uses the notebook's mirrored "
        "strategy (4 replicas); nothing else was built.\nNumber of devices: 4\n")
    assert out.count("nbdist: `tf.distribute") == 1
    ns = shell.user_ns
    assert ns["strategy"] is session_strategy is nbdist.strategy()   # never a second one
    assert ns["model"].distribute_strategy is session_strategy
    run, = nbdist.runs[before:]   # its plain model.fit, recorded: it trained on every replica
    assert (run.mode, run.status, run.replicas, run.steps_done) == ("fit", "done", 4, 4)
    # a cell that only uses the strategy runs as written; then %%distribute fits the model
    run_ok(shell, "with strategy.scope():\n    model_u = tf.keras.Sequential([tf.keras.layers."
                  "Dense(1)])\n%distribute status")
    assert "nbdist: `" not in capsys.readouterr().out
    run_ok(shell, "%%distribute\nmodel.fit(train_dataset, epochs=1, verbose=0)")
    assert nbdist.runs[-1].status == "done"


def test_a_plain_cell_building_another_familys_strategy_is_refused(shell, capsys):
    message = _refused(shell, capsys, """
strategy_x = tf.distribute.MultiWorkerMirroredStrategy()
with strategy_x.scope():
    model_x = tf.keras.Sequential([tf.keras.layers.Dense(1)])
""".lstrip())
    assert message == (
        "cell line 1 `tf.distribute.MultiWorkerMirroredStrategy()` builds a "
        "MultiWorkerMirroredStrategy (nbdist's `multiworker`), but this notebook's strategy is "
        "`%distribute "
        "mirrored --devices 4`, and TensorFlow cannot mix two strategies. Run `%distribute "
        "multiworker --workers 2` first (nbdist then starts the workers, sets their TF_CONFIG "
        "and builds the strategy on each), then this cell with `%%distribute` as its first "
        "line: the line then uses the notebook's strategy.")


def test_a_plain_cell_building_a_one_device_baseline_keeps_it_and_says_so(shell, capsys):
    capsys.readouterr()
    run_ok(shell, "baseline_x = tf.distribute.OneDeviceStrategy('/cpu:0')")
    assert type(shell.user_ns["baseline_x"]).__name__ == "OneDeviceStrategy"
    assert capsys.readouterr().out == (
        "nbdist: cell line 1 `tf.distribute.OneDeviceStrategy('/cpu:0')` builds a "
        "OneDeviceStrategy in this kernel beside the notebook's mirrored strategy: models built "
        "in its scope train on its devices, and `%%distribute` cells cannot use them.\n")


def test_without_a_session_a_plain_cell_builds_its_own_strategy_untouched(shell, capsys):
    shell.run_line_magic("distribute", "stop")
    try:
        capsys.readouterr()
        run_ok(shell, "strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])\n"
                      "with strategy.scope():\n"
                      "    model_own = tf.keras.Sequential([tf.keras.layers.Dense(1)])\n")
        assert "nbdist" not in capsys.readouterr().out
        own = shell.user_ns["strategy"]
        assert type(own).__name__ == "MirroredStrategy" and own.num_replicas_in_sync == 2
    finally:
        shell.user_ns.pop("strategy", None)
        shell.run_line_magic("distribute", "mirrored --devices 4")
    assert shell.user_ns["strategy"] is nbdist.strategy()


# keras.io "Customizing what happens in evaluate()" (TensorFlow backend): its test_step
GUIDE_TEST_STEP = """%%distribute
class CustomModel(keras.Model):
    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

inputs = keras.Input((28, 28, 1))
custom = CustomModel(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)))
custom.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
reported = custom.evaluate(images, labels, batch_size=16, verbose=0, return_dict=True)["loss"]
"""


def test_a_custom_test_steps_scaled_loss_is_said_once_with_the_fix(shell, capsys):
    capsys.readouterr()
    run_ok(shell, GUIDE_TEST_STEP)
    run_ok(shell, "%%distribute\nagain = custom.evaluate(images, labels, batch_size=16, verbose=0)")
    assert capsys.readouterr().out == (
        "nbdist: `CustomModel.test_step` reports `self.compute_loss(...)`, which Keras divides "
        "by the replicas in sync so that their gradients add up to the batch's: under these 4 "
        "replicas the loss evaluate (and fit's val_loss) shows is 4 times too small. Multiply "
        "it by `self.distribute_strategy.num_replicas_in_sync` where the step updates its loss "
        "metric or returns it.\n")
    ns = shell.user_ns

    def true_loss():
        logits = ns["custom"].predict(ns["images"], verbose=0)
        return float(ns["custom"].loss(ns["labels"], logits))

    assert ns["reported"] == pytest.approx(true_loss() / 4, rel=1e-4)   # Keras', as said
    fixed = GUIDE_TEST_STEP.replace("update_state(loss)", "update_state(\n                    "
                                    "loss * self.distribute_strategy.num_replicas_in_sync)")
    run_ok(shell, fixed)
    assert "nbdist:" not in capsys.readouterr().out
    assert ns["reported"] == pytest.approx(true_loss(), rel=1e-4)


# TensorFlow's custom-training tutorial: its objects, then its test_step as a step cell
EVAL_OBJECTS = """%%distribute
GLOBAL_BATCH_SIZE = 16
model = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(),
                             tf.keras.layers.Dense(10)])
loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True,
    reduction=tf.keras.losses.Reduction.NONE)
test_loss = tf.keras.metrics.Mean(name='test_loss')
test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name='test_accuracy')
"""

TEST_STEP = """%%distribute --step --data train_dataset --loss t_loss
images, labels = batch

predictions = model(images, training=False)
t_loss = loss_object(labels, predictions)

test_loss.update_state(t_loss)
test_accuracy.update_state(labels, predictions)
"""


def test_the_tutorials_test_step_records_the_mean_of_its_per_example_loss(shell):
    run_ok(shell, EVAL_OBJECTS)
    ns = shell.user_ns
    weights = [w.copy() for w in ns["model"].get_weights()]
    run_ok(shell, TEST_STEP)
    run = nbdist.runs[-1]
    assert (run.status, run.steps_done) == ("done", 4)
    logits = ns["model"].predict(ns["images"], verbose=0)
    per_example = ns["loss_object"](ns["labels"], logits).numpy()
    # each replica's row is the mean of its 4 examples of the step's 16
    expected = per_example.reshape(4, 4, 4).mean(axis=-1)
    got = run.metrics.pivot(index="step", columns="replica", values="loss").to_numpy()
    assert got == pytest.approx(expected, rel=1e-4)
    assert float(ns["test_loss"].result()) == pytest.approx(per_example.mean(), rel=1e-4)
    assert all((w == v).all() for w, v in zip(weights, ns["model"].get_weights(), strict=True))


def test_an_evaluation_step_without_loss_says_what_loss_is_for(shell):
    run_ok(shell, EVAL_OBJECTS)
    err = run_err(shell, TEST_STEP.replace(" --loss t_loss", ""))
    assert isinstance(err, StepCodeError)
    assert str(err) == (
        "The step never assigns `loss`: nbdist returns it from every step to report it "
        "(`--loss NAME` names the variable recorded as the step's loss, also in a step that "
        "only evaluates). Assign the step's loss in the cell (`loss = ...`), or name the "
        "variable that holds it with `--loss NAME`. This cell computes `t_loss`: add "
        "`--loss t_loss` to the `%%distribute` line to record it.")


def test_the_distributed_input_tutorials_toy_step_records_its_loss(shell):
    """`train_step` of TensorFlow's distributed-input tutorial, as a step cell."""
    run_ok(shell, "global_batch_size = 8\n"
                  "dataset = tf.data.Dataset.from_tensors(([1.], [1.])).repeat(16).batch("
                  "global_batch_size)")
    run_ok(shell, "%%distribute --step --data dataset\n"
                  "features, labels = batch\n"
                  "loss = labels - 0.3 * features\n")
    run = nbdist.runs[-1]
    assert (run.status, run.steps_done, run.n_rows) == ("done", 2, 8)
    assert run.metrics["loss"].to_numpy() == pytest.approx([0.7] * 8)


# -- bad inputs: one clear sentence, before anything runs or at the first trace ---------------

BAD_INPUT_OBJECTS = """
single = tf.data.Dataset.from_tensor_slices(np.ones((16, 3), "float32")).batch(8)
pairs = tf.data.Dataset.from_tensor_slices(
    (np.ones((16, 3), "float32"), np.ones((16, 1), "float32"))).batch(8)
dicts = tf.data.Dataset.from_tensor_slices(
    {"image": np.ones((16, 3), "float32"), "label": np.ones((16, 1), "float32")}).batch(8)
"""

BAD_MODEL = """%%distribute
model_b = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
opt_b = tf.keras.optimizers.SGD(0.1)
"""

SINGLE_SPEC = "TensorSpec(shape=(None, 3), dtype=tf.float32, name=None)"
DICT_SPEC = ("{'image': TensorSpec(shape=(None, 3), dtype=tf.float32, name=None), 'label': "
             "TensorSpec(shape=(None, 1), dtype=tf.float32, name=None)}")


@pytest.fixture
def bad(shell):
    run_ok(shell, BAD_INPUT_OBJECTS)
    run_ok(shell, BAD_MODEL)
    return shell


def _step_error(shell, data: str, body: str) -> str:
    """The message of a step cell that fails; nothing trained, the Run says failed or none
    was made."""
    weights = [w.copy() for w in shell.user_ns["model_b"].get_weights()]
    runs = len(nbdist.runs)
    err = run_err(shell, f"%%distribute --step --data {data}\n{body}")
    assert isinstance(err, StepCodeError), repr(err)
    assert len(nbdist.runs) == runs or (nbdist.runs[-1].status, nbdist.runs[-1].n_rows) == (
        "failed", 0)
    after = shell.user_ns["model_b"].get_weights()
    assert all((w == v).all() for w, v in zip(weights, after, strict=True))
    return str(err)


@pytest.mark.parametrize(("data", "body", "message"), [
    ("pairs", "x, y = batch\nloss = 'mse'",
     "cell line 3 `loss = 'mse'`: the loss must be a tensor or number computed from the batch; "
     "'mse' is a str. A loss's name is what `model.compile(loss=...)` takes; in a step, call "
     "the loss function on the batch: `loss = tf.reduce_mean(tf.keras.losses."
     "mean_squared_error(y, model(x)))`."),
    ("single", "xb, yb = batch\nloss = tf.reduce_mean(model_b(xb) - yb)",
     f"cell line 2 `xb, yb = batch`: `batch` is a single tensor here, not a tuple to unpack "
     f"(the --data dataset's element_spec: {SINGLE_SPEC}). Use it as one (`x = batch`), or "
     "make the dataset yield pairs: `tf.data.Dataset.from_tensor_slices((features, labels))`."),
    ("dicts", "x, y = batch\nloss = tf.reduce_mean(model_b(x) - y)",
     f"cell line 2 `x, y = batch`: `batch` is a dict with keys 'image', 'label' (the --data "
     f"dataset's element_spec: {DICT_SPEC}): unpacking it gives its keys, not its tensors. "
     "Take them by key: `batch['image'], batch['label']`."),
    ("dicts", "x = batch['features']\nloss = tf.reduce_mean(model_b(x))",
     f"cell line 2 `x = batch['features']`: `batch` has no key 'features': its keys are "
     f"'image', 'label' (the --data dataset's element_spec: {DICT_SPEC})."),
    ("pairs", "x, y = batch\nmodel_b.fit(x, y)\nloss = 0.0",
     "cell line 3 `model_b.fit(x, y)`: `.fit(...)` runs Keras' own loop over the data, which "
     "cannot run inside the step that nbdist compiles and calls once per batch: use scope mode "
     "(drop --step): `%%distribute` runs the cell under the strategy's scope and records every "
     "`fit`."),
    ("pairs", "x, y = batch\nwith tf.GradientTape() as tape:\n    loss = 3\n"
              "grads = tape.gradient(loss, model_b.trainable_variables)\n"
              "opt_b.apply_gradients(zip(grads, model_b.trainable_variables))",
     "cell line 4 `loss = 3`: the loss must be a tensor computed from the batch and the model; "
     "`loss` is 3, a Python int, which has no gradient, so nothing would train. Compute it "
     "inside the `with tf.GradientTape() as tape:` block from the model's output: "
     "`loss = loss_fn(y, model(x, training=True))`."),
    ("pairs", "x, y = batch\nwith tf.GradientTape() as tape:\n"
              "    loss = tf.reduce_mean(tf.square(y))\n"
              "grads = tape.gradient(loss, model_b.trainable_variables)\n"
              "opt_b.apply_gradients(zip(grads, model_b.trainable_variables))",
     "cell line 5 `grads = tape.gradient(loss, model_b.trainable_variables)`: no gradient "
     "reaches any of the 2 variables differentiated [sequential_2/dense_3/kernel, "
     "sequential_2/dense_3/bias]: the loss does not depend on them, so nothing would train. "
     "Compute the loss from the model's output inside the `with tf.GradientTape() as tape:` "
     "block (`loss = loss_fn(y, model(x, training=True))`), and differentiate the variables "
     "it uses."),
], ids=["loss-str", "unpack-single", "unpack-dict", "missing-key", "fit-in-step",
        "loss-int", "no-gradient"])
def test_a_bad_step_names_its_line_and_the_fix(bad, data, body, message):
    got = _step_error(bad, data, body)
    if "differentiated [" in message:   # Keras numbers its layers per process
        prefix, rest = message.split("[", 1)
        assert got.startswith(prefix + "[") and got.endswith(rest.split("]", 1)[1])
        assert got.count("/kernel") == 1 and got.count("/bias") == 1
    else:
        assert got == message


def test_a_python_side_effect_in_a_step_is_warned_once_at_trace_time(bad):
    run_ok(bad, "seen = []")
    step = ("%%distribute --step --data pairs\nx, y = batch\n"
            "loss = tf.reduce_mean(tf.square(model_b(x) - y))\n"
            "seen.append(loss)\nprint(loss)\n")
    with pytest.warns(NbdistWarning) as caught:
        run_ok(bad, step)
    assert [str(w.message) for w in caught] == [
        "nbdist: cell line 4 `seen.append(loss)` runs only while TensorFlow traces the step "
        "(once), not at every step: it changes `seen` once, with symbolic tensors: keep "
        "per-step values in a tf.Variable (`.assign(...)`), or read the recorded ones from "
        "nbdist.runs[-1].metrics.",
        "nbdist: cell line 5 `print(loss)` runs only while TensorFlow traces the step (once), "
        "not at every step: it prints once, a symbolic tensor rather than its value: use "
        "`tf.print(...)` to print at every step."]
    assert len(bad.user_ns["seen"]) == 4   # once per replica, while tracing; not per step
    assert nbdist.runs[-1].status == "done" and nbdist.runs[-1].steps_done == 2


def test_a_quoted_checkpoint_path_is_the_path(bad, tmp_path):
    target = tmp_path / "a b ü"
    run_ok(bad, f"%%distribute --step --data pairs --checkpoint '{target}'\n"
                "x, y = batch\nwith tf.GradientTape() as tape:\n"
                "    loss = tf.reduce_mean(tf.square(model_b(x) - y))\n"
                "opt_b.apply_gradients(zip(tape.gradient(loss, model_b.trainable_variables),\n"
                "                          model_b.trainable_variables))\n")
    assert target.is_dir() and [p.name for p in tmp_path.iterdir()] == ["a b ü"]
    assert f"checkpointed each epoch into {target}/step (model_b, opt_b)" in nbdist.runs[-1].notes


def test_more_local_workers_than_the_machine_holds_are_refused_with_the_numbers(shell, capsys):
    import psutil

    session_strategy = nbdist.strategy()
    err = run_err(shell, "%distribute multiworker --workers 1000")
    cores = os.cpu_count()
    memory = psutil.virtual_memory().total
    limit = max(2, min(4 * cores, memory // 2**29))
    assert isinstance(err, ConfigError)
    assert str(err) == (
        f"`--workers 1000` would start 1000 worker processes on this machine, which has "
        f"{cores} CPU cores and {memory / 2**30:.1f} GB of memory: each runs its own "
        f"TensorFlow (about 0.5 GB), so it holds at most {limit} (4 per core, as its memory "
        f"allows). Ask for {limit} or fewer, or add `--cluster PROFILE` to run the workers on "
        "the engines of an ipyparallel cluster (SSH, MPI, Slurm...).")
    assert nbdist.strategy() is session_strategy   # the session is as it was
    assert "nbdist: starting" not in capsys.readouterr().out


class _Workers:
    """Stands for a multiworker backend: records what the kernel would send to the workers."""

    def __init__(self):
        from nbdist.spec import StrategySpec

        self.spec = StrategySpec("multiworker", workers=2)
        self.replicas, self.devices, self.worker_keras = 2, ("CPU:0",), None
        self.sent = []

    def run_scope_cell(self, cell, observers):
        self.sent.append(cell.text)

    def kernel_strategy(self):
        return None   # the strategy lives in each worker


def test_multiworker_cells_are_checked_in_the_kernel_before_anything_is_sent(ip, capsys):
    from types import SimpleNamespace

    from nbdist.cluster.inengine import worker
    from nbdist.session import Session
    from nbdist.spec import RunSpec

    session = Session(ip)
    session.backend = backend = _Workers()
    spec = RunSpec(step=False)
    with pytest.raises(ConfigError, match=r"^cell line 3 `os.environ\['TF_CONFIG'\] = json"):
        session.run_scope_cell(MULTIWORKER_LISTING.split("\n", 1)[1], spec, [])
    assert backend.sent == []   # refused in the kernel: no worker saw it
    capsys.readouterr()
    session.run_scope_cell("strategy = tf.distribute.MultiWorkerMirroredStrategy()\n", spec, [])
    assert capsys.readouterr().out == (
        "nbdist: `tf.distribute.MultiWorkerMirroredStrategy()` on cell line 2 uses the "
        "notebook's multiworker strategy (2 replicas); nothing else was built.\n")
    sent, = backend.sent
    assert sent.splitlines()[0] == 'strategy = __import__("nbdist").strategy()'
    # on a worker, that expression is the worker's own strategy
    own = SimpleNamespace(handle=SimpleNamespace(strategy=object()))
    assert worker._STATE is None
    worker._STATE = own
    namespace = {}
    try:
        exec(sent, {}, namespace)   # noqa: S102 - the text the workers would run
    finally:
        worker._STATE = None
    assert namespace["strategy"] is own.handle.strategy
    # a cell without %%distribute runs in the kernel alone: refused, before it runs
    with pytest.raises(ConfigError) as refused:
        session.pasted_in_plain_cell(["import tensorflow as tf\n",
                                      "strategy = tf.distribute.MultiWorkerMirroredStrategy()\n"])
    assert str(refused.value) == (
        "cell line 2 `tf.distribute.MultiWorkerMirroredStrategy()` would build a "
        "MultiWorkerMirroredStrategy in this kernel alone, but the strategy of this notebook's "
        "`%distribute multiworker --workers 2` lives in each worker process. Make `%%distribute` "
        "the cell's first line: the cell then runs on every worker, where this line uses the "
        "notebook's strategy.")
    assert session.pasted_in_plain_cell(["x = 1\n"]) == ["x = 1\n"]
