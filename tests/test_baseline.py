"""`%distribute explain --baseline`: one replica's speed on a run's own step, measured on
copies of what the step trains (``nbdist.step.baseline``), and the runs it refuses."""

from __future__ import annotations

import re

import numpy as np
import pytest
from explain_cells import DATA, MLP_STEP, MODELS
from helpers import run_ok
from IPython.utils.capture import capture_output

import nbdist
from nbdist.errors import ConfigError
from nbdist.step.baseline import measure_baseline
from nbdist.telemetry.run import Run

ALIASES = """
bl_ds, bl_mlp, bl_mlp_opt = ex_fast, ex_mlp, ex_mlp_opt
def bl_forward(x):   # the step reaches the model through the notebook's function too
    return bl_mlp(x, training=True)
"""


@pytest.fixture(scope="module")
def shell(ip):
    run_ok(ip, DATA)
    run_ok(ip, MODELS)
    run_ok(ip, ALIASES)
    return ip


def state(shell):
    """The model's weights and the optimizer's variables, as arrays."""
    ns = shell.user_ns
    return ([w.copy() for w in ns["bl_mlp"].get_weights()],
            [v.numpy() for v in ns["bl_mlp_opt"].variables])


def test_baseline_measures_one_replica_and_changes_nothing(shell):
    run_ok(shell, MLP_STEP.format(data="bl_ds", steps=40, flags="", model="bl_mlp")
           .replace("bl_mlp(x, training=True)", "bl_forward(x)"))
    run = nbdist.runs[-1]
    weights, slots = state(shell)
    names, runs = set(shell.user_ns), len(nbdist.runs)
    with capture_output() as out:
        shell.run_line_magic("distribute", "explain --baseline")
    (shown,) = out.outputs
    text = shown.data["text/plain"]
    assert "  scaling: 4 replicas give " in text and "at batch 16 (" in text, text
    after_weights, after_slots = state(shell)
    assert all(np.array_equal(a, b) for a, b in zip(weights, after_weights, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(slots, after_slots, strict=True))
    assert set(shell.user_ns) == names and len(nbdist.runs) == runs
    efficiency = float(re.search(r"\(efficiency (\d+)%\)", text).group(1)) / 100
    assert 0 < efficiency <= 1.5, text
    assert run.explain().baseline is None


def test_baseline_refuses_what_it_cannot_measure(shell):
    with pytest.raises(ConfigError, match="--baseline applies to `%distribute explain"):
        shell.run_line_magic("distribute", "status --baseline")
    worker = Run(id=5, mode="step", strategy="multiworker", replicas=1, workers=2)
    with pytest.raises(ConfigError, match="trained on worker processes .* mirrored --devices 1"):
        measure_baseline(worker, shell.user_ns, None)
    fit = Run(id=6, mode="fit", strategy="mirrored", replicas=4)
    with pytest.raises(ConfigError, match="Run 6 is a Keras fit"):
        measure_baseline(fit, shell.user_ns, None)
    loaded = Run(id=0, mode="step", strategy="mirrored", replicas=4)
    with pytest.raises(ConfigError, match="keeps no step cell"):
        measure_baseline(loaded, shell.user_ns, None)
    run_ok(shell, MLP_STEP.format(data="bl_ds", steps=8, flags="", model="bl_mlp"))
    run_ok(shell, "del bl_ds")
    with pytest.raises(ConfigError, match="--data bl_ds, which is no longer in the notebook"):
        shell.run_line_magic("distribute", "explain --baseline")
    run_ok(shell, "bl_ds = ex_fast; del bl_mlp_opt")
    try:
        with pytest.raises(ConfigError, match="step reads `bl_mlp_opt`, no longer in the notebook"):
            shell.run_line_magic("distribute", "explain --baseline")
    finally:   # the module's other tests train it, in any order
        run_ok(shell, "bl_mlp_opt = ex_mlp_opt")


def test_a_model_the_copy_cannot_reach_is_refused_untouched(shell):
    """A model the step reaches through an attribute is not copied: tracing the step on one
    replica finds its variables, and no step runs."""
    run_ok(shell, "class Holder: pass\nbl_holder = Holder(); bl_holder.model = ex_mlp")
    run_ok(shell, MLP_STEP.format(data="ex_fast", steps=8, flags="", model="bl_holder.model")
           .replace("bl_holder.model_opt", "ex_mlp_opt"))
    weights = [w.copy() for w in shell.user_ns["ex_mlp"].get_weights()]
    with pytest.raises(ConfigError, match="reached through an object or function the one-"):
        shell.run_line_magic("distribute", "explain --baseline")
    after = shell.user_ns["ex_mlp"].get_weights()
    assert all(np.array_equal(a, b) for a, b in zip(weights, after, strict=True))
