"""The cells of runs whose bottleneck is known, shared by tests/test_explain.py and
benchmarks/explain.py: a tiny MLP fed by a ``map`` that sleeps 40 ms a batch (input), the same
map run 16 in parallel and prefetched (its fix), a ``tf.py_function`` map of 12 ms a batch
run one batch at a time (``ex_py``), the MLP on cached input (dispatch, at 4
replicas) and a small conv net (nothing to fix). ``MLP_STEP`` takes ``data``, ``steps``,
``flags`` and ``model`` (``ex_mlp``; its optimizer is ``{model}_opt``)."""

DATA = """
import time
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(0)
ex_x = rng.normal(size=(64 * 50, 8)).astype("float32")
ex_y = rng.normal(size=(64 * 50, 3)).astype("float32")
def ex_sleep(x, y):
    time.sleep(0.04)
    return x, y
def ex_read(x, y):
    return tf.numpy_function(ex_sleep, [x, y], [tf.float32, tf.float32])
ex_base = tf.data.Dataset.from_tensor_slices((ex_x, ex_y)).batch(64)
ex_fast = ex_base.cache().repeat().prefetch(8)
ex_slow = ex_base.map(ex_read).repeat()
ex_threads = tf.data.Options()
ex_threads.threading.private_threadpool_size = 16   # tf.data's default: one thread per core
ex_slow_fixed = ex_base.map(ex_read, num_parallel_calls=16).repeat().prefetch(
    tf.data.AUTOTUNE).with_options(ex_threads)
def ex_decode(x, y):
    time.sleep(0.012)   # stands in for Python work per batch: decoding, augmenting
    return x, y
def ex_py_read(x, y):
    x, y = tf.py_function(ex_decode, [x, y], [tf.float32, tf.float32])
    return tf.ensure_shape(x, [None, 8]), tf.ensure_shape(y, [None, 3])
ex_py = ex_base.map(ex_py_read).repeat()
ex_images = tf.data.Dataset.from_tensor_slices((
    rng.normal(size=(256, 32, 32, 3)).astype("float32"),
    rng.integers(0, 10, size=(256,)).astype("int32"))).batch(64).cache().repeat().prefetch(4)
"""
MODELS = """%%distribute
ex_mlp = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                              tf.keras.layers.Dense(3)])
ex_mlp_opt = tf.keras.optimizers.SGD(0.01)
ex_conv = tf.keras.Sequential([
    tf.keras.Input((32, 32, 3)), tf.keras.layers.Conv2D(32, 3, activation="relu"),
    tf.keras.layers.Conv2D(64, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Conv2D(64, 3, activation="relu"), tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(10)])
ex_conv_opt = tf.keras.optimizers.SGD(0.01)
"""
MLP_STEP = """%%distribute --step --data {data} --steps {steps} {flags}
x, y = batch
with tf.GradientTape() as tape:
    per_example = tf.reduce_sum(tf.square({model}(x, training=True) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=64)
grads = tape.gradient(loss, {model}.trainable_variables)
{model}_opt.apply_gradients(zip(grads, {model}.trainable_variables))
"""
CONV_STEP = """%%distribute --step --data ex_images --steps {steps}
x, y = batch
with tf.GradientTape() as tape:
    logits = ex_conv(x, training=True)
    per_example = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=64)
grads = tape.gradient(loss, ex_conv.trainable_variables)
ex_conv_opt.apply_gradients(zip(grads, ex_conv.trainable_variables))
"""
