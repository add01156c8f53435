"""The live dashboard in Notebook 7: nbdist's extension loads there (plotly.js for the figure
comes from it, once per page), a small `%%distribute` cell draws, then leaves its final figure."""

from figurechecks import FINAL
from labhelpers import COUNT_POINTS, RUN_ALL_NOWAIT, shot, write_notebook

CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    """import time
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True).repeat()

def pause(_):         # ~5 s of training: time to see the live dashboard
    time.sleep(0.02)
    return 0""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)""",
    """%%distribute --step --data ds --steps 250
a, b = batch
with tf.control_dependencies([tf.py_function(pause, [0], tf.int32)]):
    a = tf.identity(a)
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], global_batch_size=32)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))""",
]


def test_notebook7_draws_the_live_dashboard(notebook7_server, notebook7_page):
    name = write_notebook(notebook7_server["dir"], "nb7.ipynb", CELLS)
    page = notebook7_page.open_notebook(name)
    assert page.evaluate("() => window.jupyterapp.hasPlugin('nbdist:plotly')")
    assert page.evaluate("() => window.jupyterapp.isPluginActivated('nbdist:plugin')")
    page.evaluate(RUN_ALL_NOWAIT)
    page.wait_for_function(f"() => ({COUNT_POINTS})() > 10", timeout=120_000)
    header = page.locator(".nbdist-dashboard .nbdist-header").inner_text()
    assert "step" in header and "/250" in header, header
    # plotly.js came from nbdist's extension (no network here for a CDN fallback).
    assert page.evaluate("() => typeof window.nbdistPlotly === 'function'")
    shot(page, "notebook7-dashboard-live")
    cell = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    cell.locator(FINAL).first.wait_for(timeout=120_000)
    assert "Run 1 (step, mirrored, 2 replicas): done, 250 steps" in cell.inner_text()
    shot(page, "notebook7-dashboard-final")
