"""Step mode's `--data` as TensorFlow's distributed-input tutorials build it, under the kernel's
mirrored strategy (4 logical CPUs): a dataset, a dataset function `fn(input_context)` and a
`tf.distribute.DistributedDataset`, read exactly as TensorFlow's own loop reads them; and the
refusals, each before anything changed (no Run, no --checkpoint directory).

The multiworker and parameter_server cases are in test_cluster.py and test_paramserver.py.
"""

import os

import pytest
from helpers import MEAN_OF_BATCH, assert_changed_nothing, run_err, run_ok, tutorial_step

import nbdist
from nbdist.errors import ConfigError, DataError
from nbdist.session import current_session

# As in TensorFlow's "Distributed input" tutorial: a dataset function gets an InputContext,
# batches per replica and shards by input pipeline; the notebook gets the strategy.
SETUP = """%%distribute
import numpy as np
import tensorflow as tf

GLOBAL_BATCH_SIZE = 16
features = np.arange(64, dtype="float32")[:, None]   # example i holds the value i
labels = 2 * features

def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(GLOBAL_BATCH_SIZE)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset.prefetch(2)

strategy = tf.distribute.get_strategy()
dataset = tf.data.Dataset.from_tensor_slices((features, labels)).batch(GLOBAL_BATCH_SIZE)
dist_dataset = strategy.experimental_distribute_dataset(dataset)
dist_fn_dataset = strategy.distribute_datasets_from_function(dataset_fn)
model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.001)
"""

TRAIN = tutorial_step("model", "GLOBAL_BATCH_SIZE")

# TensorFlow's own loop over the same input (the tutorial's way), for comparison.
TF_LOOP = """%%distribute
@tf.function
def tf_step(inputs):
    return strategy.run(lambda b: tf.reduce_mean(b[0]), args=(inputs,))

tf_rows = [[float(v) for v in strategy.experimental_local_results(tf_step(inputs))]
           for inputs in {data}]
"""


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    return ip


def per_replica(run):
    """A run's losses as [[replica 0, replica 1, ...] for each step]."""
    table = run.metrics.pivot(index="step", columns="replica", values="loss")
    return table.values.tolist()


def test_a_dataset_function_is_read_as_distribute_datasets_from_function_reads_it(shell):
    run_ok(shell, "%%distribute --step --data dataset_fn\n" + MEAN_OF_BATCH)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.total_steps == 4 and run.steps_done == 4
    # one input pipeline; each step the 4 replicas take its next 4 per-replica batches of 4
    assert per_replica(run)[0] == [1.5, 5.5, 9.5, 13.5]
    run_ok(shell, TF_LOOP.format(data="strategy.distribute_datasets_from_function(dataset_fn)"))
    assert per_replica(run) == shell.user_ns["tf_rows"]
    assert any("num_input_pipelines=1, input_pipeline_id=0" in n for n in run.notes), run.notes


@pytest.mark.parametrize("name, source", [
    ("dist_dataset", "strategy.experimental_distribute_dataset(dataset)"),
    ("dist_fn_dataset", "strategy.distribute_datasets_from_function(dataset_fn)"),
])
def test_a_distributed_dataset_is_used_as_it_is(shell, name, source):
    run_ok(shell, f"%%distribute --step --data {name} --epochs 2\n" + MEAN_OF_BATCH)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.total_steps == 8 and run.steps_done == 8
    run_ok(shell, TF_LOOP.format(data=source))
    assert per_replica(run) == shell.user_ns["tf_rows"] * 2
    # the plain dataset, distributed by nbdist, gives each replica the same examples
    run_ok(shell, "%%distribute --step --data dataset\n" + MEAN_OF_BATCH)
    if name == "dist_dataset":
        assert per_replica(nbdist.runs[-1]) == shell.user_ns["tf_rows"]


def test_the_tutorial_training_step_trains_on_each_kind_of_input(shell):
    for data in ("dataset", "dataset_fn", "dist_dataset", "dist_fn_dataset"):
        run_ok(shell, f"%%distribute --step --data {data} --epochs 3\n" + TRAIN)
        run = nbdist.runs[-1]
        assert run.status == "done" and run.steps_done == 12, (data, run.status)
        assert len(run.metrics) == 12 * 4 and run.metrics["grad_norm"].notna().all()


def test_a_dataset_distributed_by_another_strategy_is_refused(shell):
    run_ok(shell, "other = tf.distribute.OneDeviceStrategy('/cpu:0')\n"
                  "foreign = other.experimental_distribute_dataset(dataset)")
    before = len(nbdist.runs)
    err = run_err(shell, "%%distribute --step --data foreign\n" + MEAN_OF_BATCH)
    assert isinstance(err, DataError), repr(err)
    text = str(err)
    assert "another strategy (a OneDeviceStrategy) than this notebook's MirroredStrategy" in text
    assert "tf.distribute.get_strategy()" in text and "\n" not in text
    assert len(nbdist.runs) == before


@pytest.mark.parametrize("setup, words", [
    ("bad = lambda: dataset", "a function without arguments"),
    ("def bad(global_batch_size, input_context):\n    return dataset",
     "a function of 2 arguments; a dataset function takes one"),
    ("bad = iter(dataset)", "is an iterator"),
    ("bad = lambda input_context: [1, 2]", "the dataset function returned a builtins.list"),
    ("bad = lambda input_context: tf.data.Dataset.from_tensor_slices((features, labels[:, 0]))",
     "is not batched.*get_per_replica_batch_size"),
    ("bad = tf.data.Dataset.from_tensor_slices((np.zeros((64, 4)), np.zeros((64, 1))))",
     r"is not batched: its elements are single examples \(component shapes \(4,\), \(1,\).*"
     r"bad = bad.batch\(GLOBAL_BATCH, drop_remainder=True\)"),
    ("bad = lambda input_context: dataset_fn(input_context).repeat()", "repeats forever"),
])
def test_what_is_not_data_says_what_to_do(shell, setup, words):
    import re

    run_ok(shell, setup)
    before = len(nbdist.runs)
    err = run_err(shell, "%%distribute --step --data bad\n" + MEAN_OF_BATCH)
    assert isinstance(err, (DataError, ConfigError)), repr(err)
    assert re.search(words, str(err)), str(err)
    assert len(nbdist.runs) == before


@pytest.mark.parametrize("setup", [
    "",                                                        # no such variable
    "bad = [1, 2, 3]",
    "bad = tf.data.Dataset.range(64)",                          # not batched
    "bad = tf.distribute.OneDeviceStrategy('/cpu:0').experimental_distribute_dataset(dataset)",
    "bad = dataset.repeat()",                                   # never ends
])
def test_a_cell_refused_for_its_data_changes_nothing(shell, tmp_path, setup, capsys):
    """No Run (none left "running"), no --checkpoint directory: refused before any change."""
    shell.user_ns.pop("bad", None)
    run_ok(shell, setup)
    ckpt = tmp_path / "not-yet" / "ckpt"
    before = len(nbdist.runs)
    err = run_err(shell, f"%%distribute --step --data bad --checkpoint {ckpt}\n" + TRAIN)
    assert isinstance(err, (DataError, ConfigError)), repr(err)
    assert_changed_nothing(shell, before, tmp_path / "not-yet", capsys)
    run_ok(shell, f"%%distribute --step --data dataset --checkpoint {ckpt}\n" + TRAIN)
    assert nbdist.runs[-1].status == "done" and len(nbdist.runs) == before + 1
    assert os.path.isdir(ckpt)


def test_a_dataset_of_unknown_length_warns_about_steps(shell, capsys):
    run_ok(shell, "filtered = dataset.unbatch().filter(lambda x, y: x[0] < 48).batch(16)")
    run_ok(shell, "%%distribute --step --data filtered\n" + TRAIN)
    out = capsys.readouterr().out
    assert "--data filtered: TensorFlow cannot tell how many batches it has" in out
    assert "`.repeat()` before `.filter(...)`), the epoch never ends: give --steps N" in out
    assert nbdist.runs[-1].status == "done" and nbdist.runs[-1].steps_done == 3
    run_ok(shell, "%%distribute --step --data filtered --steps 2\n" + TRAIN)
    assert "cannot tell" not in capsys.readouterr().out


def test_a_small_batch_that_may_be_an_unbatched_dataset_says_both(shell):
    run_ok(shell, "tiny = tf.data.Dataset.from_tensor_slices((features, labels))")
    err = run_err(shell, "%%distribute --step --data tiny\n" + TRAIN)
    assert isinstance(err, DataError) and "batches of 1 examples, fewer than the 4" in str(err)
    assert "If it is not batched (its elements are single examples of shape ((1,), (1,)))" \
        in str(err)
    assert current_session().backend.spec.name == "mirrored"
