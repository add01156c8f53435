"""Mixed precision in step mode: the gradient norm and the all-reduce time are the true ones on
every optimizer path.

A user following Keras' mixed precision guide sets a ``mixed_float16`` policy and wraps the
optimizer in a loss scale optimizer: the cell scales the loss, so its gradients are the true
ones times the loss scale (32768 to start with). Each optimizer path (Keras 3 ``apply`` and
``apply_gradients``, its ``LossScaleOptimizer``; tf_keras ``apply_gradients``, ``minimize``
and its ``LossScaleOptimizer``; Keras 3 has no ``minimize``) trains the same seeded model on
the same data under ``float32``, ``mixed_float16`` and ``mixed_bfloat16``, on ``mirrored
--devices 2``, timing every step. Every row must have its gradient all-reduce timed, and the
first step's gradient norm per replica must be the float32 plain optimizer's, within the
policy's precision; a scaled loss's scale is the ``loss_scale_factor`` column.
"""

import numpy as np
import pytest
from helpers import kernel_strategy, run_ok

import nbdist
from nbdist.step.runner import SKIPPED_NOTE, UNSCALED_NOTE
from nbdist.widgets.figure import run_figure
from nbdist.widgets.svgplot import figure_svg

DATA = """
import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
features = rng.normal(size=(4 * GLOBAL_BATCH, 8)).astype("float32")
targets = rng.normal(size=(4 * GLOBAL_BATCH, 3)).astype("float32")
mp_ds = tf.data.Dataset.from_tensor_slices((features, targets)).batch(GLOBAL_BATCH)
"""

# The model and optimizer, built under `policy` (the last layer in float32, as Keras' guide
# says), the policy then set back so that later cells and tests build in float32.
BUILD = """%%distribute
import {keras}
{keras}.mixed_precision.set_global_policy("{policy}")
{keras}.utils.set_random_seed(1)
model = {keras}.Sequential([{keras}.Input((8,)), {keras}.layers.Dense(16, activation="relu"),
                            {keras}.layers.Dense(3, dtype="float32")])
optimizer = {keras}.optimizers.Adam(1e-3)
if {wrap}:
    optimizer = {keras}.mixed_precision.LossScaleOptimizer(optimizer)
{keras}.mixed_precision.set_global_policy("float32")
"""

STEP = """%%distribute --step --data mp_ds --steps 3 --timing-every 1
x, y = batch
with tf.GradientTape() as tape:
    per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
    {tape_end}
{after}
"""

GRADS = "grads = tape.gradient({target}, model.trainable_variables)\n"
APPLY_GRADIENTS = "optimizer.apply_gradients(zip(grads, model.trainable_variables))"

# path -> (library, wraps in a LossScaleOptimizer, the tape's last line, the lines after it)
PATHS = {
    "keras-apply": ("keras", False, "", GRADS.format(target="loss") +
                    "optimizer.apply(grads, model.trainable_variables)"),
    "keras-apply_gradients": ("keras", False, "", GRADS.format(target="loss") + APPLY_GRADIENTS),
    "keras-lso-apply_gradients": ("keras", True, "scaled = optimizer.scale_loss(loss)",
                                  GRADS.format(target="scaled") + APPLY_GRADIENTS),
    "keras-lso-apply": ("keras", True, "scaled = optimizer.scale_loss(loss)",
                        GRADS.format(target="scaled") +
                        "optimizer.apply(grads, model.trainable_variables)"),
    "tf_keras-apply_gradients": ("tf_keras", False, "", GRADS.format(target="loss")
                                 + APPLY_GRADIENTS),
    "tf_keras-minimize": ("tf_keras", False, "",
                          "optimizer.minimize(loss, model.trainable_variables, tape=tape)"),
    # as tf_keras's guide writes it: the cell's `grads` are unscaled by the optimizer
    "tf_keras-lso-apply_gradients": ("tf_keras", True, "scaled = optimizer.get_scaled_loss(loss)",
                                     GRADS.format(target="scaled") +
                                     "grads = optimizer.get_unscaled_gradients(grads)\n" +
                                     APPLY_GRADIENTS),
    # the cell's `grads` are the scaled ones, unscaled only where they are applied
    "tf_keras-lso-scaled_grads": ("tf_keras", True, "scaled = optimizer.get_scaled_loss(loss)",
                                  GRADS.format(target="scaled") +
                                  "optimizer.apply_gradients(zip(optimizer.get_unscaled_"
                                  "gradients(grads), model.trainable_variables))"),
    "tf_keras-lso-minimize": ("tf_keras", True, "",
                              "optimizer.minimize(loss, model.trainable_variables, tape=tape)"),
}
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
#: How far a norm computed through each policy's precision may be from float32's.
RTOL = {"float32": 1e-5, "mixed_float16": 5e-3, "mixed_bfloat16": 2e-2}
INITIAL_SCALE = 2.0 ** 15    # both libraries' LossScaleOptimizer default


@pytest.fixture(scope="module")
def shell(ip):
    kernel_strategy(ip, "mirrored --devices 2")
    run_ok(ip, DATA)
    yield ip
    kernel_strategy(ip)


def _train(shell, path: str, policy: str):
    library, wrap, tape_end, after = PATHS[path]
    run_ok(shell, BUILD.format(keras=library, policy=policy, wrap=wrap))
    run_ok(shell, STEP.format(tape_end=tape_end, after=after))
    return nbdist.runs[-1]


@pytest.fixture(scope="module")
def float32_norms(shell):
    """Each library's first-step gradient norms per replica, float32 and a plain Adam."""
    out = {}
    for library in ("keras", "tf_keras"):
        run = _train(shell, f"{library}-apply_gradients", "float32")
        out[library] = run.metrics.query("step == 0")["grad_norm"].to_numpy()
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("path", PATHS)
def test_every_optimizer_path_times_its_allreduce_and_shows_the_true_gradient_norm(
        request, shell, float32_norms, path, policy):
    library, wrap, _, after = PATHS[path]
    if library == "tf_keras":
        request.getfixturevalue("tf_keras")   # skipped without it, failed in CI
    run = _train(shell, path, policy)
    frame = run.metrics
    assert run.status == "done" and run.replicas == 2 and run.steps_done == 3
    assert len(frame) == 6
    # The gradient all-reduce is timed on every row: a loss scale optimizer's is no longer
    # missed ("no all_reduce was seen in the step").
    assert frame["allreduce_ms"].notna().all() and (frame["allreduce_ms"] > 0).all(), \
        frame["allreduce_ms"].tolist()
    assert not any("no all_reduce" in note for note in run.notes), run.notes
    assert run.allreduce_bytes == (8 * 16 + 16 + 16 * 3 + 3) * 4   # the float32 gradients
    if "minimize" in path:   # the cell names no gradients: nothing to show
        assert frame["grad_norm"].isna().all()
    else:
        first = frame.query("step == 0")["grad_norm"].to_numpy()
        # Equal to float32's, not the scaled norm (32768 times it).
        np.testing.assert_allclose(first, float32_norms[library], rtol=RTOL[policy])
    if wrap:   # the loss is scaled (by the cell, or inside minimize)
        # The scale each step scaled its loss by, per row (no step overflowed here).
        assert (frame["loss_scale_factor"] == INITIAL_SCALE).all(), frame["loss_scale_factor"]
    else:
        assert "loss_scale_factor" not in frame
    # The note says the norm was divided when the cell's `grads` are the scaled gradients.
    scaled_grads = wrap and "minimize" not in path and "grads = optimizer.get_unscaled" not in after
    assert (UNSCALED_NOTE.format(grads="grads") in run.notes) == scaled_grads, run.notes


def test_steps_a_loss_scale_optimizer_skips_have_no_allreduce_time_and_say_why(shell):
    # A loss scale far too high: every step's float16 gradients overflow, the optimizer skips
    # the update (no all-reduce) and halves the scale.
    run_ok(shell, BUILD.format(keras="keras", policy="mixed_float16", wrap=True).replace(
        "LossScaleOptimizer(optimizer)", "LossScaleOptimizer(optimizer, initial_scale=2.0**24)"))
    _, _, tape_end, after = PATHS["keras-lso-apply_gradients"]
    run_ok(shell, STEP.format(tape_end=tape_end, after=after))
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.status == "done" and run.steps_done == 3
    scales = frame.groupby("step")["loss_scale_factor"].first().tolist()
    assert scales == [2.0 ** 24, 2.0 ** 23, 2.0 ** 22]
    # NaN, not 0 ms: nothing was all-reduced.
    assert frame[["allreduce_ms", "wait_ms", "compute_ms"]].isna().all().all()
    assert SKIPPED_NOTE.format(steps="3 timed steps") in run.notes, run.notes
    # The dashboard draws the scale on a panel of its own (the static picture too).
    figure = run_figure(run)
    [line] = [t for t in figure["data"] if t.get("name") == "loss scale"]
    assert line["y"].tolist() == scales
    assert "loss scale" in figure_svg(figure)


