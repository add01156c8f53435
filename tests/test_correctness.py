"""Step mode trains what hand-written tf.distribute code trains, with and without timing."""

import numpy as np
import pytest
from helpers import kernel_strategy, regression_data, regression_step, run_ok, weights_after

import nbdist

SETUP = regression_data("GLOBAL_BATCH * 24") + """
def make_model(sync_bn=False):
    layers = [tf.keras.Input((8,)), tf.keras.layers.Dense(32, activation="relu")]
    if sync_bn:   # a collective for the batch statistics before the gradients' all-reduce
        layers.append(tf.keras.layers.BatchNormalization(synchronized=True))
    model = tf.keras.Sequential([*layers, tf.keras.layers.Dense(3)])
    init = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.Dense):
            layer.set_weights([init.normal(scale=0.3, size=w.shape).astype("float32")
                               for w in layer.get_weights()])
    return model
"""

BUILD = """%%distribute
model = make_model({model_args})
optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
"""


@pytest.fixture
def mirrored(ip):
    run_ok(ip, SETUP)
    yield ip
    kernel_strategy(ip)


def train(shell, flags="", model_args=""):
    return weights_after(shell, BUILD.format(model_args=model_args), regression_step(flags))


def test_four_replicas_equal_one_device_on_the_same_global_batches(mirrored):
    weights4, run4 = train(mirrored)
    assert run4.status == "done" and run4.steps_done == 24 and run4.replicas == 4
    kernel_strategy(mirrored, "one_device")
    weights1, run1 = train(mirrored)
    assert run1.replicas == 1 and run1.steps_done == 24
    for w4, w1 in zip(weights4, weights1, strict=True):
        np.testing.assert_allclose(w4, w1, rtol=1e-5, atol=1e-6)
    # The replicas' losses sum to the single device's loss of the same global batch.
    per_step4 = run4.metrics.groupby("step")["loss"].sum().to_numpy()
    np.testing.assert_allclose(per_step4, run1.metrics["loss"].to_numpy(), rtol=1e-5)


def test_per_replica_losses_equal_a_hand_written_strategy_run_loop(mirrored):
    _, run = train(mirrored)
    ours = run.metrics.pivot(index="step", columns="replica", values="loss").to_numpy()
    strategy = nbdist.strategy()
    mirrored.user_ns["strategy"] = strategy
    run_ok(mirrored, """
        with strategy.scope():
            model = make_model()
            optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
            optimizer.build(model.trainable_variables)

        def step_fn(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def distributed_step(inputs):
            return strategy.run(step_fn, args=(inputs,))

        hand_losses = []
        for inputs in strategy.experimental_distribute_dataset(train_ds):
            per_replica = distributed_step(inputs)
            hand_losses.append([float(v) for v in strategy.experimental_local_results(per_replica)])
    """)
    theirs = np.array(mirrored.user_ns["hand_losses"])
    assert theirs.shape == ours.shape == (24, 4)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("model_args", ["", "sync_bn=True"])
def test_allreduce_timing_is_per_replica_positive_and_changes_no_weight(mirrored, model_args):
    """Also with SyncBatchNormalization, whose batch statistics are other collectives the timed
    step stamps too: its weights and moving statistics stay bit-identical."""
    timed_weights, timed = train(mirrored, "--timing-every 1", model_args)
    plain_weights, plain = train(mirrored, "--timing-every 0", model_args)
    assert len(timed_weights) == (4 if not model_args else 8)
    for a, b in zip(timed_weights, plain_weights, strict=True):
        np.testing.assert_array_equal(a, b)
    frame = timed.metrics
    assert frame["allreduce_ms"].notna().all()
    assert (frame["allreduce_ms"] >= 0).all() and np.isfinite(frame["allreduce_ms"]).all()
    assert (frame.groupby("step")["allreduce_ms"].max() > 0).all()
    assert sorted(frame["replica"].unique()) == [0, 1, 2, 3]
    # wait time is measured against the last replica to arrive: someone waited zero
    assert (frame.groupby("step")["wait_ms"].min() == 0).all()
    # the gradients' bytes (and BatchNormalization's gamma and beta), not the statistics'
    assert timed.allreduce_bytes == 4 * (8 * 32 + 32 + 32 * 3 + 3 + (64 if model_args else 0))
    others = frame["other_collective_ms"]
    assert (others > 0).all() if model_args else (others == 0).all()
    assert plain.metrics["allreduce_ms"].isna().all()
    assert plain.metrics["other_collective_ms"].isna().all()
    assert frame["grad_norm"].gt(0).all() and plain.metrics["grad_norm"].gt(0).all()


def _pace(plain_ms, timed_ms, steps=3000):
    """Steps the automatic pacer times, given the two variants' step times."""
    from nbdist.step.runner import TimingPacer

    pacer, timed_steps = TimingPacer(None), []
    for step in range(steps):
        timed = pacer.due(step)
        timed_steps += [step] if timed else []
        pacer.observe(step, timed_ms if timed else plain_ms, timed)
    return timed_steps


@pytest.mark.parametrize("plain_ms, timed_ms", [(1.0, 6.0), (2.0, 4.0), (10.0, 12.0),
                                                (50.0, 51.0), (1.0, 100.0)])
def test_automatic_timing_keeps_its_cost_near_one_percent_and_samples_twice_a_second(
        plain_ms, timed_ms):
    timed = _pace(plain_ms, timed_ms)
    gaps = np.diff(timed[3:])                 # after the first estimates settle
    cost = (timed_ms - plain_ms) / (gaps.mean() * plain_ms)
    longest = max(100, int(np.ceil(500 / plain_ms)))
    assert gaps.min() >= 5 and gaps.max() <= longest
    assert cost <= 0.0101 or gaps.max() == longest, (cost, gaps.max())
    assert gaps.max() * plain_ms <= max(500, 100 * plain_ms)   # the allreduce stays sampled
