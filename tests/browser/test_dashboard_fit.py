"""A `model.fit` dashboard in JupyterLab: a progress bar with the time left, the status bar
following the fit's steps, then the notebook saved and opened again shows the final figure
(no "Error displaying widget: model not found")."""

import json
import re

from figurechecks import FINAL, check_fit_panels
from labhelpers import RUN_ALL_NOWAIT, dismiss_news, shot, shot_of, write_notebook

STEPS = 3 * 40      # epochs x batches

CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    """import time
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(40 * 32, 8)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True)

class Slow(tf.keras.callbacks.Callback):    # ~6 s of training: time to look at it
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(ds, epochs=3, verbose=0, callbacks=[Slow()])""",
]

FIT_RUNNING = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    return cells[cells.length - 1].model.executionState === 'running';
}"""

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_fit_shows_its_progress_and_time_left_and_the_saved_notebook_reopens(
        lab_server, lab_page, browser):
    name = write_notebook(lab_server["dir"], "fit.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.evaluate(RUN_ALL_NOWAIT)
    page.wait_for_function(
        "() => { const h = document.querySelector('.nbdist-dashboard .nbdist-header');"
        " return h && / left/.test(h.innerText); }", timeout=120_000)
    assert page.evaluate(FIT_RUNNING)
    header = page.locator(".nbdist-dashboard .nbdist-header").inner_text()
    assert re.search(rf"step \d+/{STEPS}\s*·\s*epoch [1-3]/3", header), header
    bar = page.locator(".nbdist-dashboard .widget-hprogress")
    assert bar.is_visible() and bar.evaluate("e => getComputedStyle(e).visibility") == "visible"
    # The status bar follows the fit (it stayed at "step 0" while Keras trained).
    page.wait_for_function(
        f"() => /step [1-9][0-9]*\\/{STEPS}/.test("
        "document.querySelector('.nbdist-status-item').textContent)", timeout=30_000)
    check_fit_panels(page)
    dismiss_news(page)
    shot(page, "dashboard-fit-live")
    shot_of(page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1).locator(
        ".jp-OutputArea"), "dashboard-fit-live-output")

    page.wait_for_function(f"() => !({FIT_RUNNING})()", timeout=120_000)
    training = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    training.locator(FINAL).first.wait_for(timeout=30_000)
    assert f"step {STEPS}/{STEPS} (epoch 3/3)" in training.inner_text()
    shot(page, "dashboard-fit-final")
    shot_of(training.locator(".jp-OutputArea"), "dashboard-fit-final-output")

    # Saved, the notebook holds the final figure, not the widgets; opened again in a new
    # page it draws it, with no widget model to look for.
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    saved = json.loads((lab_server["dir"] / name).read_text())
    outputs = saved["cells"][-1]["outputs"]
    assert not [o for o in outputs if WIDGET_VIEW in o.get("data", {})], outputs
    assert any("image/svg+xml" in o.get("data", {}) for o in outputs), outputs
    again = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    try:
        again.goto(f"{lab_server['url']}/lab/workspaces/fit-again/tree/{name}?reset")
        cell = again.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
        cell.locator(FINAL).first.wait_for(timeout=60_000)
        assert "model not found" not in again.evaluate("() => document.body.innerText")
        shot(again, "dashboard-fit-reopened")
    finally:
        again.context.close()
