"""The ``input`` scenario of tests/ps_scenario.py: step mode's ``--data`` under
``%distribute parameter_server`` written as TensorFlow's parameter-server tutorial writes its
input (a dataset function, the per-worker dataset built with the coordinator, a distributed
dataset), against the tutorial's own ``coordinator.schedule`` loop over the same input.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from typing import Any

from helpers import MEAN_OF_BATCH, tutorial_step

# The tutorial's cells (`strategy` and `coordinator` are the session's), with data whose
# values say which input context TensorFlow gave the worker: 10 * pipelines + pipeline id.
SETUP = """%%distribute
import numpy as np
import tensorflow as tf

strategy = tf.distribute.get_strategy()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

def dataset_fn(input_context):
    global_batch_size = 8
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    value = 10.0 * input_context.num_input_pipelines + input_context.input_pipeline_id
    x = tf.fill((64, 1), value)
    y = 2.0 * x
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset.prefetch(2)

@tf.function
def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(dataset_fn)

per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
dist_dataset = strategy.distribute_datasets_from_function(dataset_fn)
short_fn = lambda: strategy.distribute_datasets_from_function(   # 3 batches, not repeated
    lambda input_context: tf.data.Dataset.from_tensors(([[1.0]], [[2.0]])).repeat(3))
counting_fn = lambda: strategy.distribute_datasets_from_function(   # 0, 1, 2, ... per worker
    lambda input_context: tf.data.Dataset.range(1000).map(
        lambda i: ([[tf.cast(i, tf.float32)]], [[2.0]])))
model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.01)
"""

TF_LOOP = """%%distribute
@tf.function
def step_fn(iterator):
    def replica_fn(batch_data, labels):
        return tf.reduce_mean(batch_data)
    batch_data, labels = next(iterator)
    losses = strategy.run(replica_fn, args=(batch_data, labels))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

per_worker_iterator = iter(per_worker_dataset)
remote = [coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in range(20)]
coordinator.join()
tf_losses = sorted({float(r.fetch()) for r in remote})
"""


# Examples 0..127, each different: sharded by the input context (a no-op here, pipeline 0 of 1),
# by the worker, and shuffled with a seed per worker.
SHARD_CHECK = """%%distribute
xs = np.arange(128 * 4, dtype="float32").reshape(128, 4) / 512
examples = lambda: tf.data.Dataset.from_tensor_slices((xs, xs.sum(axis=1, keepdims=True)))
def context_sharded_fn(input_context):
    data = examples().shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return data.batch(4).repeat()
def worker_sharded_fn(input_context):
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    return examples().shard(2, worker).batch(4).repeat()
def worker_seeded_fn(input_context):
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    return examples().shuffle(128, seed=tf.cast(worker, tf.int64)).batch(4).repeat()
"""


def summary(run: Any) -> dict[str, Any]:
    m = run.metrics.sort_values("step")
    return {"status": run.status, "steps": run.steps_done, "total": run.total_steps,
            "losses": sorted({float(v) for v in m["loss"]}),
            "first_last": [float(m["loss"].iloc[0]), float(m["loss"].iloc[-1])],
            "workers": sorted({int(w) for w in m["worker"]}), "notes": run.notes}


def input_scenario(ip: Any, out: dict[str, Any], cell: Any, status: Any) -> None:
    import nbdist

    ip.run_line_magic("distribute", "parameter_server --workers 2 --ps 1")
    _, out["setup_error"] = cell(ip, SETUP)
    _, out["tf_loop_error"] = cell(ip, TF_LOOP)
    out["tf_losses"] = ip.user_ns.get("tf_losses")
    for name in ("dataset_fn", "per_worker_dataset", "dist_dataset", "per_worker_dataset_fn"):
        _, out[f"{name}_error"] = cell(ip, f"%%distribute --step --data {name} --steps 40\n"
                                           + MEAN_OF_BATCH)
        out[name] = summary(nbdist.runs[-1])
    _, out["shard_check_error"] = cell(ip, SHARD_CHECK)
    for name in ("context_sharded_fn", "worker_sharded_fn", "worker_seeded_fn"):
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            _, out[f"{name}_error"] = cell(ip, f"%%distribute --step --data {name} --steps 40\n"
                                               + MEAN_OF_BATCH)
        out[name] = dict(summary(nbdist.runs[-1]), printed=printed.getvalue())
    _, out["train_error"] = cell(ip, "%%distribute --step --data dataset_fn --steps 20 "
                                     "--epochs 2\n" + tutorial_step("model", "8"))
    out["train"] = summary(nbdist.runs[-1])
    _, out["ran_out_error"] = cell(
        ip, "%%distribute --step --data short_fn --steps 40\n" + MEAN_OF_BATCH)
    out["ran_out"] = summary(nbdist.runs[-1])
    _, out["assert_error"] = cell(   # each worker's 6th batch fails the cell's own check
        ip, "%%distribute --step --data counting_fn --steps 40\n"
            "x, y = batch\ntf.debugging.assert_less(x, 5.0)\nloss = tf.reduce_mean(x)\n")
    out["assert_run"] = summary(nbdist.runs[-1])
    _, out["after_ran_out_error"] = cell(
        ip, "%%distribute --step --data dataset_fn --steps 10\n" + MEAN_OF_BATCH)
    before = len(nbdist.runs)
    ckpt = os.path.join(tempfile.mkdtemp(prefix="nbdist-ps-input-"), "not-yet")
    _, out["no_steps_error"] = cell(ip, f"%%distribute --step --data dataset_fn --checkpoint "
                                        f"{ckpt}\n" + MEAN_OF_BATCH)
    out["runs_added"] = len(nbdist.runs) - before
    out["ckpt_created"] = os.path.exists(ckpt)
    out["status_after_refusal"] = status(ip)
