"""`%distribute explain` and `Run.explain()`: runs whose bottleneck is known are named by it.

The rules on runs built by hand are tests/test_explain_rules.py's; the straggler slowed by
`%distribute inject slow` is tests/test_explain_straggler.py's. These tests train real runs
slowed on purpose: a `map` that sleeps (input), a tiny MLP on 4 replicas (dispatch), a conv
net (nothing to fix).
"""

from __future__ import annotations

import pytest
from explain_cells import CONV_STEP, DATA, MLP_STEP, MODELS
from helpers import run_ok
from IPython.utils.capture import capture_output

import nbdist
from nbdist.errors import ConfigError
from nbdist.telemetry.explain import InputRate

# -- runs built by hand -------------------------------------------------------------------------


# -- runs trained for real ----------------------------------------------------------------------

def mlp_step(data: str, steps: int) -> str:
    return MLP_STEP.format(data=data, steps=steps, flags="", model="ex_mlp")


@pytest.fixture(scope="module")
def shell(ip):
    run_ok(ip, DATA)
    run_ok(ip, MODELS)
    return ip


def explained_cell(shell, cell):
    """Run ``cell``, then `%distribute explain`: the text it displayed (a terminal's), the
    table a notebook draws (HTML) and the Explanation."""
    run_ok(shell, cell)
    with capture_output() as out:
        shell.run_line_magic("distribute", "explain")
    (shown,) = out.outputs
    explained = nbdist.runs[-1].explain()
    return shown.data["text/plain"], explained._repr_html_(), explained


def test_a_map_that_sleeps_is_named_input(shell):
    text, page, explained = explained_cell(shell, mlp_step("ex_slow", 60))
    assert explained.bottleneck == "input", text
    assert f"Run {nbdist.runs[-1].id}: " in text and "bottleneck: input" in text
    assert "1. The input pipeline sets the pace: the Python work in its `map`" in text
    assert "`.prefetch(" in text
    assert "bottleneck: <b>input</b>" in page and "waiting for input" in page
    assert explained.shares["input"] > 0.4, text


def test_a_python_map_is_named_input_with_its_fix_the_same_when_measured_again(shell):
    import tensorflow as tf

    theirs = iter(shell.user_ns["ex_py"])   # the user's own iterator, one batch in
    first_x = next(theirs)[0].numpy()
    text, _, explained = explained_cell(shell, mlp_step("ex_py", 40))
    assert explained.bottleneck == "input", text
    advice = explained.advice[0]
    assert "the Python work in its `map`" in advice.text, text
    assert "num_parallel_calls=tf.data.AUTOTUNE" in advice.text
    assert "Python work (tf.py_function) in its `map`" in text
    run = nbdist.runs[-1]
    assert isinstance(run.input_rate, InputRate) and run.input_rate.batches >= 3
    assert nbdist.runs[-1].explain().advice[0] == advice   # measured once per run
    run.input_rate = None                                    # timed again
    again = run.explain()
    assert again.bottleneck == "input", again.text
    assert again.advice[0].gain == pytest.approx(advice.gain, rel=0.25), again.text
    # the user's iterator goes on where it was
    second_x = next(theirs)[0].numpy()
    assert tf.reduce_all(second_x == shell.user_ns["ex_x"][64:128]).numpy()
    assert (first_x == shell.user_ns["ex_x"][:64]).all()


def test_a_tiny_mlp_on_4_replicas_is_named_dispatch(shell):
    text, _, explained = explained_cell(shell, mlp_step("ex_fast", 300))
    assert explained.bottleneck == "dispatch", text
    assert "--steps-per-call auto" in explained.advice[0].text


def test_a_conv_net_has_nothing_to_fix(shell):
    text, _, explained = explained_cell(shell, CONV_STEP.format(steps=24))
    assert explained.bottleneck == "balanced", text
    assert "Nothing to fix" in text


def test_explain_names_a_run_by_its_number_and_refuses_others(shell):
    run_ok(shell, mlp_step("ex_fast", 20))
    last = nbdist.runs[-1]
    with capture_output() as out:
        shell.run_line_magic("distribute", f"explain {last.id}")
        shell.run_line_magic("distribute", "explain -1")
    assert [o.data["text/plain"].split(":")[0] for o in out.outputs] == [f"Run {last.id}"] * 2
    with pytest.raises(ConfigError, match=f"There is no Run 999: this kernel has Runs 1-{last.id}"):
        shell.run_line_magic("distribute", "explain 999")
    with pytest.raises(ConfigError, match="takes at most one run number, not 'last'"):
        shell.run_line_magic("distribute", "explain last")
    run_ok(shell, mlp_step("ex_fast", 20).replace(
        "--steps 20", "--steps 20 --timing-every 0"))
    with pytest.raises(ConfigError, match="no timed steps"):
        shell.run_line_magic("distribute", "explain")


# -- a worker slowed on purpose -----------------------------------------------------------------

