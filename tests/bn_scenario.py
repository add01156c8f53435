"""The BatchNormalization vs SyncBatchNormalization step cell of tests/test_timing.py, also
run by benchmarks/syncbn.py: a small conv net with two BatchNormalization layers, trained by
the same ``%%distribute --step`` cell with ``synchronized=False`` or ``True``.

Run ``SETUP``, then ``BUILD.format(synchronized=...)``, then ``STEP.format(data=..., flags=...)``
(``bn_ds``: 30 global batches of 64; ``bn_ds.repeat()`` for longer runs).
"""

SETUP = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
bn_x = rng.normal(size=(GLOBAL_BATCH * 30, 12, 12, 3)).astype("float32")
bn_y = rng.integers(0, 4, size=(GLOBAL_BATCH * 30,)).astype("int32")
bn_ds = tf.data.Dataset.from_tensor_slices((bn_x, bn_y)).batch(GLOBAL_BATCH, drop_remainder=True)
bn_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
def make_bn_model(synchronized):
    return tf.keras.Sequential([
        tf.keras.Input((12, 12, 3)),
        tf.keras.layers.Conv2D(4, 3, name="conv1"),
        tf.keras.layers.BatchNormalization(synchronized=synchronized, name="bn1"),
        tf.keras.layers.ReLU(),
        tf.keras.layers.Conv2D(16, 3, name="conv2"),
        tf.keras.layers.BatchNormalization(synchronized=synchronized, name="bn2"),
        tf.keras.layers.ReLU(), tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(4, name="head")])
"""

BUILD = """%%distribute
model = make_bn_model({synchronized})
optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
"""

STEP = """%%distribute --step --data {data} {flags}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(bn_loss(y, model(x, training=True)),
                                      global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

# Per replica (float32): each conv's kernel and bias, each BN's gamma and beta, the head.
GRADIENT_BYTES = 4 * (3 * 3 * 3 * 4 + 4 + 2 * 4 + 3 * 3 * 4 * 16 + 16 + 2 * 16
                      + 8 * 8 * 16 * 4 + 4)
