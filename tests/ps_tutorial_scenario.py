"""The ``tutorial`` scenario of tests/ps_scenario.py: TensorFlow's parameter-server tutorial
as a user types it into nbdist cells: its Embedding sharded over 2 parameter servers
(``--partitioner``), trained in step mode with ``--checkpoint``, and its distributed
evaluation (``coordinator.schedule``/``join`` over a per-worker dataset) under CPU stress.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

LINE = "parameter_server --workers 2 --ps 2 --partitioner min_size:1k"

# The tutorial's model (an Embedding over a vocabulary, then Dense), in tf_keras: Keras 3
# layers cannot take gradients of a sharded variable.
SETUP = """%%distribute
import numpy as np
import tensorflow as tf
import keras
import tf_keras

strategy = tf.distribute.get_strategy()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
VOCAB = 1000                       # 1000 x 16 float32 = 64 KiB: 2 shards of >= 1 KiB
rng = np.random.default_rng(0)
ids = rng.integers(0, VOCAB, size=(256, 3))
labels = (ids[:, :1] % 2).astype("float32")          # learnable from the first id alone
ds = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(32, drop_remainder=True)

emb_model = tf_keras.Sequential([tf_keras.Input((3,), dtype="int64"),
                                 tf_keras.layers.Embedding(VOCAB, 16),
                                 tf_keras.layers.Flatten(),
                                 tf_keras.layers.Dense(1, activation="sigmoid")])
emb_opt = tf_keras.optimizers.Adam(0.05)
shards = [v.device for v in emb_model.layers[0].embeddings.variables]

dense_model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
dense_opt = keras.optimizers.Adam(0.01)
things = {"net": dense_model}

k3_model = keras.Sequential([keras.Input((3,), dtype="int64"), keras.layers.Embedding(VOCAB, 16),
                             keras.layers.Flatten(), keras.layers.Dense(1, activation="sigmoid")])
k3_opt = keras.optimizers.Adam(0.05)
"""

# The same model in Keras 3: its Embedding is sharded too, which Keras 3 cannot train.
K3_STEP = """%%distribute --step --data ds --epochs 1
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(keras.losses.binary_crossentropy(y, k3_model(x)))
grads = tape.gradient(loss, k3_model.trainable_variables)
k3_opt.apply_gradients(zip(grads, k3_model.trainable_variables))
"""

EMB_STEP = """%%distribute --step --data ds --epochs 3 --checkpoint {ckpt}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf_keras.losses.binary_crossentropy(y, emb_model(x)))
grads = tape.gradient(loss, emb_model.trainable_variables)
emb_opt.apply_gradients(zip(grads, emb_model.trainable_variables))
"""

DENSE_STEP = """%%distribute --step --data ds --epochs 2 --checkpoint {ckpt}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square({model}(tf.cast(x, tf.float32)) - y))
grads = tape.gradient(loss, {model}.trainable_variables)
dense_opt.apply_gradients(zip(grads, {model}.trainable_variables))
"""

# The tutorial's evaluation, with every step evaluating the same 64 examples (one batch), so
# each scheduled step adds exactly the inline evaluation's counts: a lost or doubled step
# shows in `count`, a step run on other weights in the accuracy. Run for the tf_keras model
# (accuracy 1.0 once trained) and for the Keras 3 one with Keras 3 metrics (a fraction).
EVAL = """%%distribute
eval_accuracy = {metrics}.Accuracy()

@tf.function
def eval_step(iterator):
    def replica_fn(batch_data, labels):
        pred = {call}
        actual_pred = tf.cast(tf.greater(pred, 0.5), tf.int64)
        eval_accuracy.update_state(labels, actual_pred)
    batch_data, labels = next(iterator)
    strategy.run(replica_fn, args=(batch_data, labels))

def eval_dataset_fn():
    return tf.data.Dataset.from_tensor_slices((ids[:64], labels[:64])).batch(64).repeat()

per_worker_eval_dataset = coordinator.create_per_worker_dataset(eval_dataset_fn)
per_worker_eval_iterator = iter(per_worker_eval_dataset)
eval_results = []
for _ in range({rounds}):
    eval_accuracy.reset_state()
    for _ in range({steps}):
        coordinator.schedule(eval_step, args=(per_worker_eval_iterator,))
    coordinator.join()
    eval_results.append((float(eval_accuracy.result()), float(eval_accuracy.count)))
inline = {metrics}.Accuracy()
batch_data = ids[:64]
inline.update_state(labels[:64], tf.cast({call} > 0.5, tf.int64))
inline_accuracy = float(inline.result())
"""

EVALUATED = [("tf_keras", "tf_keras.metrics", "emb_model(batch_data, training=False)"),
             ("keras3", "keras.metrics",
              "dense_model(tf.cast(batch_data, tf.float32), training=False)")]
BUSY = "while True:\n    sum(range(10000))\n"


def stress(n: int) -> list[subprocess.Popen]:
    """``n`` busy-loop processes (the caller kills them; they die with this process too)."""
    def die_with_parent() -> None:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG

    return [subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=die_with_parent)
            for _ in range(n)]


def tutorial_scenario(ip: Any, out: dict[str, Any], cell: Any, status: Any) -> None:
    import nbdist

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        _, out["start_error"] = cell(ip, f"%distribute {LINE}")
    out["start_printed"] = printed.getvalue()
    out["status"] = status(ip)
    _, out["setup_error"] = cell(ip, SETUP)
    out["shards"] = ip.user_ns.get("shards")
    k3_before = [v.numpy().copy() for v in ip.user_ns["k3_model"].variables]
    runs_before = len(nbdist.runs)
    _, out["k3_error"] = cell(ip, K3_STEP)
    out["k3_unchanged"] = (len(nbdist.runs) == runs_before
                           and not ip.user_ns["k3_opt"].built
                           and all((before == v.numpy()).all() for before, v in zip(
                               k3_before, ip.user_ns["k3_model"].variables, strict=True)))
    ckpt = tempfile.mkdtemp(prefix="nbdist-ps-tutorial-")
    _, out["emb_error"] = cell(ip, EMB_STEP.format(ckpt=os.path.join(ckpt, "emb")))
    if out["emb_error"]:
        return
    run = nbdist.runs[-1]
    rows = run.metrics.sort_values("step")
    out["emb"] = {"status": run.status, "steps": run.steps_done, "notes": run.notes,
                  "epoch_median": rows.groupby("epoch")["loss"].median().round(4).tolist(),
                  "rows": rows[["step", "worker", "loss"]].round(4).values.tolist()}
    for name, model in (("complete", "dense_model"), ("reached", 'things["net"]')):
        _, out[f"{name}_error"] = cell(ip, DENSE_STEP.format(
            ckpt=os.path.join(ckpt, name), model=model))
        out[f"{name}_notes"] = nbdist.runs[-1].notes
    busy = stress(6)
    try:
        for name, metrics, call in EVALUATED:
            _, out[f"{name}_eval_error"] = cell(ip, EVAL.format(
                rounds=3, steps=8, metrics=metrics, call=call))
            out[f"{name}_eval"] = ip.user_ns.get("eval_results")
            out[f"{name}_inline"] = ip.user_ns.get("inline_accuracy")
    finally:
        for proc in busy:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
