"""Step mode's `--data` under `%distribute multiworker` (2 real workers), as TensorFlow's
multi-worker custom-training-loop tutorial writes it: a dataset function sharded by
`input_context.input_pipeline_id`, or the `DistributedDataset` each worker builds from it.
Each worker's rows must come from its own shard, exactly as TensorFlow's own loop reads it;
a refused `--data` or `--keras` line must change nothing (no Run, no directory, the workers
keep their state).
"""


import pytest
from helpers import MEAN_OF_BATCH, assert_changed_nothing, run_err, run_ok, tutorial_step

import nbdist
from nbdist.cluster.multiworker import keras_choice
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.errors import ConfigError
from nbdist.session import current_session

# The tutorial's mnist.py and dataset cells, with synthetic data: example i holds the value i.
SETUP = """%%distribute
import numpy as np
import tensorflow as tf

per_worker_batch_size = 8
num_workers = 2
global_batch_size = per_worker_batch_size * num_workers

def make_dataset():
    x = np.arange(64, dtype="float32")[:, None]
    return tf.data.Dataset.from_tensor_slices((x, 3 * x))

def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = make_dataset()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset

strategy = tf.distribute.get_strategy()   # the cell runs under strategy.scope()
multi_worker_model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
shard_fn = lambda input_context: dataset_fn(global_batch_size, input_context)
multi_worker_dataset = strategy.distribute_datasets_from_function(shard_fn)
optimizer = tf.keras.optimizers.SGD(0.0001)
"""

TRAIN = tutorial_step("multi_worker_model", "global_batch_size")

# TensorFlow's own loop over the same distributed dataset, on every worker (the tutorial's).
TF_LOOP = """%%distribute
@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        return tf.reduce_mean(x)
    return strategy.run(step_fn, args=(next(iterator),))

iterator = iter(multi_worker_dataset)
tf_losses = [float(train_step(iterator)) for _ in range(4)]
"""


@pytest.fixture(scope="module")
def mw(ip):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    run_ok(ip, SETUP)
    yield ip
    ip.run_line_magic("distribute", "stop")
    assert live_clusters() == []
    ip.run_line_magic("distribute", "mirrored --devices 4")


def by_worker(run):
    """{worker: [loss of each step]} from a run's rows."""
    m = run.metrics.sort_values("step")
    return {int(w): g["loss"].tolist() for w, g in m.groupby("worker")}


@pytest.mark.parametrize("data", ["shard_fn", "multi_worker_dataset"])
def test_each_worker_reads_its_own_shard_as_tensorflow_does(mw, data):
    run_ok(mw, f"%%distribute --step --data {data}\n" + MEAN_OF_BATCH)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.total_steps == 4 and run.steps_done == 4
    rows = by_worker(run)
    # 64 examples, 2 pipelines: worker w reads examples w, w + 2, ... in per-replica batches of 8
    assert rows == {0: [7.0, 23.0, 39.0, 55.0], 1: [8.0, 24.0, 40.0, 56.0]}
    run_ok(mw, TF_LOOP)
    assert rows == {w: current_session().pull("tf_losses", w) for w in (0, 1)}
    if data == "shard_fn":
        assert any("num_input_pipelines=2" in note for note in run.notes), run.notes


def test_the_tutorial_training_loop_trains_on_the_distributed_dataset(mw):
    run_ok(mw, "%%distribute --step --data multi_worker_dataset --epochs 3\n" + TRAIN)
    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 12
    assert sorted(by_worker(run)) == [0, 1] and run.metrics["grad_norm"].notna().all()
    first, last = run.metrics.groupby("step")["loss"].sum().iloc[[0, -1]]
    assert last < first


def test_a_cell_refused_for_its_data_on_the_workers_changes_nothing(mw, tmp_path, capsys):
    ckpt = tmp_path / "not-yet" / "ckpt"
    before = len(nbdist.runs)
    err = run_err(mw, f"%%distribute --step --data nothing_here --checkpoint {ckpt}\n" + TRAIN)
    assert "no variable `nothing_here`" in str(err), str(err)
    run_ok(mw, "%%distribute\nhalf_batched = (tf.data.Dataset.range(64) if nbdist_worker "
               "else make_dataset().batch(16))")
    err = run_err(mw, f"%%distribute --step --data half_batched --checkpoint {ckpt}\n" + TRAIN)
    assert "worker 1" in str(err) and "is not batched" in str(err), str(err)
    assert_changed_nothing(mw, before, tmp_path / "not-yet", capsys)
    run_ok(mw, f"%%distribute --step --data shard_fn --checkpoint {ckpt}\n" + TRAIN)
    assert nbdist.runs[-1].status == "done" and len(nbdist.runs) == before + 1


def test_a_refused_keras_choice_leaves_the_running_workers_alone(mw, monkeypatch):
    """`--keras legacy` without tf_keras is refused before the workers are stopped."""
    backend = current_session().backend
    current_session().push(kept=42)
    find_spec = keras_choice.importlib.util.find_spec
    monkeypatch.setattr(keras_choice.importlib.util, "find_spec",
                        lambda name, *a: None if name == "tf_keras" else find_spec(name, *a))
    with pytest.raises(ConfigError, match="tf_keras is not installed"):
        mw.run_line_magic("distribute", "multiworker --workers 2 --keras legacy")
    monkeypatch.undo()
    assert current_session().backend is backend and not backend.broken
    assert current_session().pull("kept", 1) == 42
    run_ok(mw, "%%distribute --step --data shard_fn\n" + MEAN_OF_BATCH)
    assert nbdist.runs[-1].status == "done"
