"""The cells of the 2-worker cluster tests (tests/test_cluster.py), also used by
benchmarks/fault_latency.py: each worker's own data (seeded by its index), a linear model,
the step cell, and an input pipeline that gets stuck on worker 1."""

SETUP = """%%distribute
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 32
rng = np.random.default_rng(nbdist_worker)
xs = rng.normal(size=(GLOBAL_BATCH * 8, 4)).astype("float32")
ys = xs.sum(axis=1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(GLOBAL_BATCH, drop_remainder=True)
long_ds = ds.repeat()
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.05)
"""

STEP = """%%distribute --step --data {data} {flags}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0], global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def _worker_1_input(name: str, source: str, fault: str, at: str) -> str:
    """Cell lines making ``name``: a generator ``source`` whose worker 1 runs ``fault`` (cell
    lines, indented 12) at its example ``at``; unsharded, so each worker reads all of it."""
    return f"""def {source}():
    for i in range(10**6):
        if nbdist_worker == 1 and i == {at}:
{fault}        yield xs[i % len(xs)], ys[i % len(ys)]
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
{name} = tf.data.Dataset.from_generator({source}, output_signature=(
    tf.TensorSpec((4,), tf.float32), tf.TensorSpec((1,), tf.float32))
).batch(GLOBAL_BATCH, drop_remainder=True).with_options(options)
"""


def stuck_input(at: str) -> str:
    """Cell lines making ``stuck_ds``: worker 1's generator writes the time to STALL_FILE and
    sleeps for an hour at its example ``at`` (an expression); its `time.sleep` is the cell's
    line 7 when the lines follow a ``%%distribute`` header."""
    return "import time\n" + _worker_1_input("stuck_ds", "slow_source", (
        '            open(STALL_FILE, "w").write(str(time.time()))\n'
        "            time.sleep(3600)\n"), at)


def raising_input(at: str) -> str:
    """Cell lines making ``bad_ds``: worker 1's generator raises ``ValueError`` at its example
    ``at`` (an expression), on the cell's line 5 when the lines follow a ``%%distribute``
    header; worker 0's input never fails."""
    return _worker_1_input("bad_ds", "bad_source", (
        '            raise ValueError("bad record at example %d" % i)\n'), at)


# The per-replica step of TensorFlow's custom-training tutorial, inside a tf.function
_STEP_FN = """    def step_fn(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0],
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
"""

#: A hand-written custom loop typed into a scope cell, its tf.function defined in the cell:
#: ``{steps}`` steps over ``long_ds``.
SCOPE_LOOP = ("""%%distribute
dist = strategy.experimental_distribute_dataset(long_ds.take({steps}))
@tf.function
def train(it):
""" + _STEP_FN + """    return strategy.run(step_fn, args=(next(it),))
it = iter(dist)
for _ in range({steps}):
    train(it)
""")

#: TensorFlow's tutorial train step, defined once (``tutorial_step(iterator)``: the summed loss)
TUTORIAL_STEP = ("""%%distribute
@tf.function
def tutorial_step(iterator):
""" + _STEP_FN + """    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
""")
