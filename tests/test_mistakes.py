"""Mistakes new users make, each answered with one paragraph: what is wrong and the one change.
A refused command changes nothing: the session's strategy, its backend and the user's
namespace are as they were (through a real IPython shell)."""

from __future__ import annotations

import pytest
from helpers import run_err

from nbdist.errors import ConfigError, LossError, StepCodeError
from nbdist.session import current_session


def _state(shell):
    """What a refused command must leave as it was."""
    backend = current_session(shell).backend
    return (backend, backend and backend.spec,
            {k: id(v) for k, v in shell.user_ns.items() if not k.startswith("_")})


def refused(shell, code: str, error=ConfigError) -> str:
    """Run ``code``, which must be refused with ``error`` and change no state; its message."""
    before = _state(shell)
    err = run_err(shell, code)
    assert isinstance(err, error), repr(err)
    assert _state(shell) == before
    message = str(err)
    assert "\n" not in message   # one paragraph
    return message


@pytest.mark.parametrize("code, said", [
    ("%distribute multiworker --worker 2",
     "--worker (no s) picks the worker `%distribute pull NAME --worker i` reads from. To start "
     "2 worker processes: `%distribute multiworker --workers 2`."),
    ("%%distribute --date train_ds\nx = 1",
     "--date is not a flag of a `%%distribute` cell (two %). Did you mean `--data train_ds`? "
     "`%distribute --help` lists every flag."),
    ("%distribute mirrored --devics 2", "Did you mean `--devices 2`?"),
    ("%%distribute --work 2 --step --data ds\nloss = 1.0", "Did you mean `--workers 2`?"),
    ("%%distribute --steps --data ds\nx = 1",
     "--steps needs a value (N) right after it, e.g. `--steps 100`. --steps: step mode: steps "
     "per epoch at most (default: all)."),
    ("%%distribute --step --data\nx = 1",
     "--data needs a value (NAME) right after it, e.g. `--data train_ds`."),
    ("%%distribute --workers two\nx = 1",
     "--workers 'two': --workers takes a whole number, e.g. `--workers 2`."),
    ("%distribute multiworker --keras new",
     "--keras 'new' is not one of its choices: auto, legacy, keras3, e.g. `--keras legacy`."),
    ("%%distribute --checkpoint /tmp/ck ü2 --step --data ds\nx = 1",
     "`ü2` after `--checkpoint /tmp/ck` reads as another argument: a path with spaces must be "
     "quoted, `--checkpoint '/tmp/ck ü2'` (or give a path without spaces)."),
    ("%%distribute --step --data ds --checkpoint /tmp/my ck dir\nx = 1",
     "`ck dir` after `--checkpoint /tmp/my` reads as another argument: a path with spaces must "
     "be quoted, `--checkpoint '/tmp/my ck dir'`"),
    ("%%distribute --step --data ds --checkpoint-every 50\nx_tb = 1",
     "--checkpoint-every 50 saves a step cell's training every 50 steps into its --checkpoint "
     "directory (besides after each epoch), so it needs --checkpoint DIR: add it, e.g. "
     "`%%distribute --step --data train_ds --checkpoint ckpt/run1 --checkpoint-every 100`, or "
     "drop --checkpoint-every."),
    ("%%distribute --checkpoint /tmp/ck --checkpoint-every 5\nx_tb = 1",
     "so it needs --step --data NAME: add it"),
    ("%%distribute --step --data ds --checkpoint /tmp/ck --checkpoint-every 0\nx_tb = 1",
     "--checkpoint-every 0: give how many steps apart to save, a whole number of at least 1, "
     "e.g. `--checkpoint-every 100` (each epoch's end is saved anyway)."),
    ("%%distribute --step --data ds --checkpoint /tmp/ck --checkpoint-every ten\nx_tb = 1",
     "--checkpoint-every 'ten': --checkpoint-every takes a whole number, e.g. "
     "`--checkpoint-every 100`. --checkpoint-every: step mode, with --checkpoint: also save "
     "every K steps (default: each epoch)."),
    ("%distribute multiworker --cluster ''",
     "--cluster was given an empty value: it names an ipyparallel profile whose engines run "
     "the workers (without --cluster they run on this machine), e.g. `%distribute multiworker "
     "--cluster ssh`, or drop --cluster. The notebook's strategy is unchanged."),
    ("%distribute parameter_server --partitioner ' '",
     "--partitioner was given an empty value"),
    ("%%distribute --tensorboard /proc/nbdist-logs\nx_tb = 1",
     "--tensorboard '/proc/nbdist-logs': nbdist could not write the run's scalars there (/proc "
     "takes no new files: "),
    ("%%distribute --tensorboard ''\nx_tb = 1",
     "--tensorboard '': nbdist could not write the run's scalars there (no directory given), "
     "so the cell did not run. Give a directory you can write to (it is created if missing), "
     "e.g. `--tensorboard logs/run1`."),
])
def test_a_mistaken_line_is_refused_with_the_one_change(ip, code, said):
    assert said in refused(ip, code)
    assert "x_tb" not in ip.user_ns   # the cell did not run


def test_a_quoted_path_and_a_strategy_after_a_path_are_not_mistakes(ip, tmp_path):
    logs = tmp_path / "tb logs"
    ip.run_cell(f"%%distribute --tensorboard '{logs}'\nx_tb_ok = 1\n", store_history=False)
    assert ip.user_ns.pop("x_tb_ok") == 1
    err = run_err(ip, f"%%distribute --checkpoint {tmp_path} mirrored --devices 2\nx = 1")
    assert "kernel's strategy" in str(err)   # the strategy word is the strategy, not the path


# -- step cells --------------------------------------------------------------------------------
@pytest.fixture
def trained(ip):
    """`model`, `optimizer`, a tuple dataset `train_ds` and a dict one `dict_ds` of it."""
    from helpers import regression_data, run_ok

    run_ok(ip, regression_data("128"))
    run_ok(ip, "dict_ds = tf.data.Dataset.from_tensor_slices("
               "{'features': features, 'label': targets}).batch(GLOBAL_BATCH)")
    run_ok(ip, "%%distribute\n"
               "model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(3)])\n"
               "optimizer = tf.keras.optimizers.SGD(0.1)")
    return ip


def _refused_step(shell, cell: str, error=StepCodeError) -> str:
    """A step cell refused before it trains: the model's weights are unchanged too."""
    weights = [w.copy() for w in shell.user_ns["model"].get_weights()]
    message = refused(shell, cell, error)
    assert all((a == b).all() for a, b in
               zip(weights, shell.user_ns["model"].get_weights(), strict=True))
    return message


@pytest.mark.parametrize("line, what", [
    ("loss = 0.5", "the Python float 0.5"),
    ("loss = 3", "the Python int 3"),
    ("loss = tf.constant(2.0) * 3", "a tensor computed from constants alone"),
])
def test_a_loss_that_depends_on_nothing_is_refused_before_training(trained, line, what):
    said = _refused_step(trained, f"%%distribute --step --data train_ds\nx, y = batch\n{line}\n",
                         LossError)
    assert said == (
        f"cell line 3 `{line}`: `loss` is {what}: it depends neither on the batch nor on any "
        "variable, so every step would report the same loss and train nothing. Compute it "
        "from the batch and the model inside a `with tf.GradientTape() as tape:` block, "
        "`loss = loss_fn(y, model(x, training=True))`, then apply its gradients "
        "(`optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), "
        "model.trainable_variables))`).")


def test_a_loss_of_the_batch_or_of_a_variable_alone_is_not_refused(trained):
    from helpers import run_ok

    run_ok(trained, "%%distribute --step --data train_ds --steps 1\nx, y = batch\n"
                    "loss = tf.reduce_mean(x)\n")
    run_ok(trained, "%%distribute --step --data train_ds --steps 1\n"
                    "loss = tf.reduce_sum(model.trainable_variables[0])\n")


STEP_BODY = """with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(x) - y))
optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                              model.trainable_variables))
"""
DICT_SPEC = ("(the --data dataset's element_spec: {'features': TensorSpec(shape=(None, 8), "
             "dtype=tf.float32, name=None), 'label': TensorSpec(shape=(None, 3), "
             "dtype=tf.float32, name=None)})")


def test_a_dict_dataset_used_as_a_tuple_names_the_line_its_keys_and_the_fix(trained):
    from helpers import run_ok

    # the same code ran on a tuple dataset first: TensorFlow then names that cell's file
    run_ok(trained, "%%distribute --step --data train_ds --steps 1\nx, y = batch\n" + STEP_BODY)
    for flags in ("", " --steps-per-call 2"):
        said = _refused_step(trained, f"%%distribute --step --data dict_ds{flags}\n"
                                      "x, y = batch\n" + STEP_BODY)
        assert said == (
            f"cell line 2 `x, y = batch`: `batch` is a dict with keys 'features', 'label' "
            f"{DICT_SPEC}: unpacking it gives its keys, not its tensors. Take them by key: "
            "`batch['features'], batch['label']`.")
    said = _refused_step(trained, "%%distribute --step --data dict_ds\n"
                                  "x, y = batch[0], batch[1]\n" + STEP_BODY)
    assert said == (
        f"cell line 2 `x, y = batch[0], batch[1]`: `batch` is a dict with keys 'features', "
        f"'label' {DICT_SPEC}: it has no item 0; take its tensors by key, not by position: "
        "`batch['features'], batch['label']`.")
    said = _refused_step(trained, "%%distribute --step --data train_ds\n"
                                  "x, y = batch['features'], batch['label']\n" + STEP_BODY)
    assert said.startswith("cell line 2 `x, y = batch['features'], batch['label']`: `batch` is "
                           "a tuple of 2 (the --data dataset's element_spec: (TensorSpec(")
    assert said.endswith("not a dict: take its parts by position, `batch[0], batch[1]`, or "
                         "unpack it: `x, y = batch`.")


# -- TensorFlow's own errors for code pasted from its guides: the change first ----------------
KERAS_IO_LOOP = """%%distribute
for step, (x_batch, y_batch) in enumerate(train_ds):
    with tf.GradientTape() as tape:
        logits = model(x_batch, training=True)
        loss_value = tf.reduce_mean(tf.square(logits - y_batch))
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply(grads, model.trainable_weights)
"""


@pytest.mark.parametrize("cell, advice, tensorflow", [
    (KERAS_IO_LOOP,
     "The cell updates a distributed model's variables outside `strategy.run` (an optimizer's "
     "`apply` or `apply_gradients` in a plain Python loop over the dataset, as keras.io's and "
     "TensorFlow's custom training loops do before they wrap the step in `strategy.run`): "
     "TensorFlow allows it only inside each replica's step. Make the loop's body a step cell, "
     "`%%distribute --step --data train_ds` on its first line and `x, y = batch` for the "
     "loop's unpacking: nbdist loops over the dataset and runs the body on every replica "
     "under `strategy.run`.",
     "TensorFlow's error, ValueError: DistributedVariable.handle is not available outside the "
     "replica context"),
    ("%%distribute\nmodel.compile(optimizer='sgd', loss='mse')\n"
     "model.fit(train_ds.unbatch().batch(2), epochs=1, verbose=0)\n",
     "A batch had fewer examples than the 4 replicas, so a replica got an empty slice "
     "(`[0, ...]` below) and TensorFlow cannot add up the replicas' results: give `fit`, "
     "`evaluate` and `predict` batches of at least 4 examples (`batch_size=`, or "
     "`dataset.batch(...)` with a multiple of the replicas), and drop a smaller last batch: "
     "`dataset.batch(BATCH, drop_remainder=True)`; to run one example, call the model in a "
     "plain cell instead: `model(x[:1])`.",
     "TensorFlow's error, InvalidArgumentError: "),
    ("%%distribute\nbn = tf.keras.Sequential([tf.keras.Input((8,)), "
     "tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(3)])\n"
     "bn.compile(optimizer='sgd', loss='mse')\n"
     "bn.evaluate(features[:1], targets[:1], verbose=0)\n",
     "A batch had fewer examples than the 4 replicas", "Inputs to operation AddN of type AddN "
     "must have the same size and shape."),
])
def test_tensorflows_error_for_a_known_mistake_comes_after_the_change(trained, cell, advice,
                                                                      tensorflow):
    from nbdist.errors import KnownTensorFlowError

    err = run_err(trained, cell)
    assert isinstance(err, KnownTensorFlowError), repr(err)
    said, theirs = str(err).split("\n\n", 1)
    assert said.startswith(advice) and "\n" not in said, said
    assert tensorflow in theirs and str(err.__cause__).strip() in theirs   # never instead


# -- parameter_server: pasted TF_CONFIG code -------------------------------------------------------
PS_TF_CONFIG = """import json, os
cluster = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222", "10.0.0.3:2222"],
           "ps": ["10.0.0.4:2222", "10.0.0.5:2222"]}
tf_config = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
os.environ["TF_CONFIG"] = json.dumps(tf_config)
"""


class _ParameterServers:
    """Stands for a parameter_server backend: records what would run."""

    def __init__(self, workers: int = 2, ps: int = 1):
        from nbdist.spec import StrategySpec

        self.spec = StrategySpec("parameter_server", workers=workers, ps=ps)
        self.replicas, self.devices, self.worker_keras = workers, ("CPU:0",), None
        self.sent = []

    def run_scope_cell(self, cell, observers):
        self.sent.append(cell.text)

    def kernel_strategy(self):
        return None


@pytest.mark.parametrize("code, said", [
    (PS_TF_CONFIG,
     "cell line 6 `os.environ[\"TF_CONFIG\"] = json.dumps(tf_config)`: nbdist sets TF_CONFIG "
     "for its workers itself (each worker gets its own, with free ports) and builds the "
     "strategy on each, so a cell must not set it. `%distribute parameter_server --workers 3 "
     "--ps 2` starts the workers on this machine (the 3 workers and 2 ps its TF_CONFIG lists), "
     "`%distribute parameter_server --cluster PROFILE` on the engines of an ipyparallel cluster "
     "(SSH, MPI, Slurm...) such as the hosts it names; then run the cell without the TF_CONFIG "
     "lines: its strategy line then uses the notebook's strategy."),
    (PS_TF_CONFIG + "strategy = tf.distribute.ParameterServerStrategy(resolver)\n",
     "`%distribute parameter_server --workers 3 --ps 2` starts the workers on this machine"),
    # built from what the cell cannot read: it lists ps tasks all the same, as the session's
    (PS_TF_CONFIG.replace('["10.0.0.4:2222", "10.0.0.5:2222"]', "[f'h{i}:1' for i in range(2)]"),
     "This notebook's `%distribute parameter_server --workers 2 --ps 1` already runs those "
     "workers with TF_CONFIG set: remove the TF_CONFIG lines and run the cell again"),
])
def test_pasted_tf_config_listing_ps_tasks_gets_the_parameter_server_line(ip, code, said):
    from nbdist.session import Session
    from nbdist.spec import RunSpec

    session = Session(ip)
    session.backend = backend = _ParameterServers(workers=2, ps=1)
    with pytest.raises(ConfigError) as err:
        session.run_scope_cell(code, RunSpec(step=False), [])
    assert said in str(err.value) and "multiworker" not in str(err.value), str(err.value)
    assert backend.sent == [] and "TF_CONFIG" not in __import__("os").environ


