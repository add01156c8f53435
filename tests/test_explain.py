"""`%distribute explain` and `Run.explain()` on real runs: what a user reads, under any load.

The verdict rules are tested on runs built by hand (tests/test_explain_rules.py). Which
bottleneck a real run shows depends on the machine's load (a busy machine slows the compute,
not a map that sleeps), so these tests train the runs built to have one (tests/explain_cells.py:
a `map` that sleeps, a Python map, a tiny MLP on 4 replicas, a conv net) and check what holds
whatever the load: the text and the table a notebook draws name the same bottleneck and
advice, the parts add up to the measured step, the input pipeline is timed once per run and
the user's iterator goes on where it was. How often each is named right, and the measures
behind it, are benchmarks/explain.py's (`--runs tests`); the straggler slowed by `%distribute
inject slow` is tests/test_explain_straggler.py's.
"""

from __future__ import annotations

import html

import pytest
from explain_cells import CONV_STEP, DATA, MLP_STEP, MODELS
from helpers import run_ok
from IPython.utils.capture import capture_output
from test_explain_rules import _parts_add_up

import nbdist
from nbdist.errors import ConfigError
from nbdist.telemetry.explain import BOTTLENECKS, InputRate


def mlp_step(data: str, steps: int) -> str:
    return MLP_STEP.format(data=data, steps=steps, flags="", model="ex_mlp")


@pytest.fixture(scope="module")
def shell(ip):
    run_ok(ip, DATA)
    run_ok(ip, MODELS)
    return ip


def explained_cell(shell, cell):
    """Run ``cell``, then `%distribute explain`: the text it displayed (a terminal's), the
    table a notebook draws (HTML) and the Explanation, checked to agree."""
    run_ok(shell, cell)
    with capture_output() as out:
        shell.run_line_magic("distribute", "explain")
    (shown,) = out.outputs
    run = nbdist.runs[-1]
    explained = run.explain()
    text, page = shown.data["text/plain"], explained._repr_html_()
    assert explained.bottleneck in BOTTLENECKS, text
    first = text.splitlines()[0]
    assert first.startswith(f"Run {run.id}: ") and first.endswith(
        f"bottleneck: {explained.bottleneck}"), text
    assert f"bottleneck: <b>{explained.bottleneck}</b>" in page
    if explained.advice:
        assert explained.bottleneck == explained.advice[0].kind
        for i, advice in enumerate(explained.advice, 1):
            assert f"  {i}. {advice.line()}" in text
            assert f"<li>{html.escape(advice.line())}</li>" in page
    else:
        assert explained.bottleneck == "balanced" and "Nothing to fix: " in text
    assert set(explained.shares) and sum(explained.shares.values()) == pytest.approx(1.0)
    _parts_add_up(explained, run)
    return text, page, explained


def test_a_map_that_sleeps_is_explained_with_its_pipeline_timed(shell):
    _, _, explained = explained_cell(shell, mlp_step("ex_slow", 60))
    run = nbdist.runs[-1]
    assert isinstance(run.input_rate, InputRate) and run.input_rate.batches >= 3
    assert explained.input_rate is run.input_rate


def test_a_python_map_is_timed_once_per_run_and_the_users_iterator_goes_on(shell):
    import tensorflow as tf

    theirs = iter(shell.user_ns["ex_py"])   # the user's own iterator, one batch in
    first_x = next(theirs)[0].numpy()
    _, _, explained = explained_cell(shell, mlp_step("ex_py", 40))
    run = nbdist.runs[-1]
    assert isinstance(run.input_rate, InputRate) and run.input_rate.batches >= 3
    timed = run.input_rate
    assert run.explain().advice == explained.advice     # measured once per run
    assert run.input_rate is timed
    run.input_rate = None                                # timed again
    again = run.explain()
    assert isinstance(run.input_rate, InputRate) and run.input_rate is not timed
    assert again.bottleneck in BOTTLENECKS, again.text
    # the user's iterator goes on where it was
    second_x = next(theirs)[0].numpy()
    assert tf.reduce_all(second_x == shell.user_ns["ex_x"][64:128]).numpy()
    assert (first_x == shell.user_ns["ex_x"][:64]).all()


def test_a_tiny_mlp_on_4_replicas_is_explained_per_replica(shell):
    _, _, explained = explained_cell(shell, mlp_step("ex_fast", 300))
    assert sorted(explained.breakdown.replica) == [0, 1, 2, 3]


def test_a_conv_net_is_explained_per_replica(shell):
    _, _, explained = explained_cell(shell, CONV_STEP.format(steps=24))
    assert sorted(explained.breakdown.replica) == [0, 1, 2, 3]


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

