"""Helpers for the browser tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
DOCS = ROOT / "docs"

# The notebook the page shows has a kernel, connected.
KERNEL_CONNECTED = (
    "() => { const w = window.jupyterapp.shell.currentWidget;"
    " return w && w.sessionContext && w.sessionContext.session &&"
    " w.sessionContext.session.kernel &&"
    " w.sessionContext.session.kernel.connectionStatus === 'connected'; }")


# A notebook's first cells: nbdist on 2 mirrored replicas, a repeating dataset `ds`, a linear
# `model` and its `optimizer`; then `step_cell(steps)` trains it.
MIRRORED_SETUP = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    """import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True).repeat()""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)""",
]


def step_cell(steps: int) -> str:
    return f"""%%distribute --step --data ds --steps {steps}
a, b = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], global_batch_size=32)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))"""


# The notebook's last cell is running (not ``kernel.status``: see test_dashboard_live.py).
LAST_CELL_RUNNING = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    return cells[cells.length - 1].model.executionState === 'running';
}"""

# Every cell of the notebook, started without waiting: the promise that
# `commands.execute('notebook:run-all-cells')` returns resolves only when every cell has run.
RUN_ALL_NOWAIT = "() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }"

# Points drawn in the dashboard's lines (all panels): plotly draws a trace as one SVG path "M..L..".
COUNT_POINTS = """() => {
    const plot = document.querySelector('.nbdist-dashboard .js-plotly-plot');
    if (!plot) return 0;
    let n = 0;
    for (const path of plot.querySelectorAll('.scatterlayer .trace path.js-line')) {
        n += (path.getAttribute('d') || '').split(/[ML]/).length - 1;
    }
    return n;
}"""


def write_notebook(directory: Path, name: str, cells: list[str]) -> str:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": c} for c in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (directory / name).write_text(json.dumps(nb))
    return name


def run_all_and_wait(page, timeout_ms: int = 180_000) -> None:
    """Run every cell and wait until the kernel is idle with every cell executed."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const cells = w.content.widgets.filter(c => c.model.type === 'code');"
        " return w.sessionContext.session.kernel.status === 'idle' &&"
        " cells.every(c => c.model.executionCount !== null); }",
        timeout=timeout_ms)


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def doc_shot(locator, name: str, config) -> Path:
    """A screenshot of ``locator`` (an element) the README shows: to test-artifacts/, and to
    docs/ too with ``pytest --update-docs`` (tests/conftest.py)."""
    path = ARTIFACTS / f"{name}.png"
    locator.screenshot(path=str(path))
    if config.getoption("--update-docs"):
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS / path.name)
    return path


def shot_of(locator, name: str) -> Path:
    """A screenshot of one element as it is now (a live dashboard never stands still, so not
    ``locator.screenshot``, which waits for the element to be stable), within the viewport."""
    path = ARTIFACTS / f"{name}.png"
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    view = locator.page.viewport_size
    top = max(0.0, box["y"])
    clip = {"x": max(0.0, box["x"]), "y": top, "width": min(box["width"], view["width"]),
            "height": min(box["y"] + box["height"], view["height"]) - top}
    locator.page.screenshot(path=str(path), clip=clip)
    return path


def dismiss_news(page) -> None:
    """Answer JupyterLab's "notified about news?" toast, which covers outputs in screenshots."""
    button = page.locator(".jp-toast-button", has_text="No")
    if button.count():
        button.first.click()


def run_new_cell(page, source: str) -> None:
    """Add a cell with ``source`` at the end of the current notebook and run it, as a user
    types one; returns once it is sent (wait for its output with ``page.wait_for_function``)."""
    page.evaluate("""async (source) => {
        const app = window.jupyterapp, nb = app.shell.currentWidget.content;
        nb.activeCellIndex = nb.widgets.length - 1;
        await app.commands.execute('notebook:insert-cell-below');
        nb.activeCell.model.sharedModel.source = source;
        await app.commands.execute('notebook:run-cell');
    }""", source)
