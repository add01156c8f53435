"""The exported script builds the optimizers the step updates (nbdist.export, on step source)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("step, builds", [
    ("grads = tape.gradient(loss, model.trainable_variables)\n"      # TensorFlow's tutorials
     "optimizer.apply_gradients(zip(grads, model.trainable_variables))",
     ["optimizer.build(model.trainable_variables)"]),
    ("optimizer.apply(grads, model.trainable_weights)",              # keras.io's loops
     ["optimizer.build(model.trainable_weights)"]),
    ("variables = gen.trainable_variables + disc.trainable_variables\n"
     "opt.apply_gradients(zip(tape.gradient(loss, variables), variables))",
     ["opt.build(gen.trainable_variables + disc.trainable_variables)"]),
    ("opt.minimize(loss, var_list=[w, b], tape=tape)", ["opt.build([w, b])"]),
    ("opt = make_optimizer()\nopt.apply(grads, model.trainable_variables)", []),
])
def test_the_script_builds_the_optimizers_the_step_updates(step, builds):
    from nbdist.export.script import _build_optimizers

    text = _build_optimizers("x, y = batch\n" + step)
    assert [line.strip() for line in text.splitlines() if ".build(" in line] == builds
    if builds:
        assert "with strategy.scope():" in text and 'not getattr(' in text
