"""Runs labelled by what sets them apart, through a real IPython shell: ``--name`` on a cell
(and its refusals), the learning rate and global batch read from the cell's optimizer and
dataset, ``Run.label`` and ``nbdist.compare``'s legend, title and controls."""


import pytest
from helpers import run_ok
from test_magics import BODY, SETUP

import nbdist
from nbdist.errors import ConfigError
from nbdist.widgets.compare import comparison_figure

LR_BUILD = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD({lr})
"""


def train(shell, lr, flags=""):
    run_ok(shell, LR_BUILD.format(lr=lr))
    run_ok(shell, f"%%distribute --step --data ds --steps 3 {flags}\n{BODY}")
    return nbdist.runs[-1]


@pytest.mark.timeout(300)
def test_runs_are_labelled_by_their_learning_rate_or_their_name(ip):
    run_ok(ip, SETUP)
    fast, slow = train(ip, 0.1), train(ip, 0.001)
    assert fast.params == {"learning_rate": 0.1, "global_batch": 32}
    assert slow.params == {"learning_rate": 0.001, "global_batch": 32}
    fig = comparison_figure([fast, slow])
    legend = [t["name"] for t in fig["data"] if t.get("showlegend", True)]
    assert legend == [f"run {fast.id} · lr 0.1", f"run {slow.id} · lr 0.001"]
    # what they share is said once, in the title
    assert fig["layout"]["title"]["text"] == \
        "global loss: 2 runs · mirrored · 4 replicas · batch 32"
    # the raw lines are faint copies in their run's legend group: a legend click hides both
    groups = [t["legendgroup"] for t in fig["data"]]
    assert groups == legend * 2
    named = train(ip, 0.01, "--name 'small step'")
    assert named.title == "small step" and named.label == "small step"
    assert f"Run {named.id} · small step · mirrored" in \
        nbdist.runs[-1].plot().layout.title.text
    fig = nbdist.compare([fast, named])
    assert [t.name for t in fig.data if t.showlegend is not False] == \
        [f"run {fast.id} · lr 0.1", "small step"]
    # alone among this kernel's runs of another learning rate, Run.label says its own
    # (whatever else differs from the kernel's earlier runs is said too, e.g. their batch)
    parts = slow.label.split(" · ")
    assert parts[0] == f"run {slow.id}" and "lr 0.001" in parts, slow.label


@pytest.mark.parametrize("flag, says", [
    ("--name ''", "--name '' is empty"),
    ("--name " + "x" * 41, "has 41 characters (at most 40)"),
    ("--name", "--name needs a value"),
])
def test_a_bad_name_is_refused_before_anything_runs(ip, flag, says):
    run_ok(ip, SETUP)
    before = len(nbdist.runs)
    with pytest.raises(ConfigError) as err:
        ip.run_cell_magic("distribute", f"--step --data ds --steps 2 {flag}", BODY)
    assert says in str(err.value), str(err.value)
    assert len(nbdist.runs) == before
