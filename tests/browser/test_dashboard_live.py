"""The live dashboard in a real browser: it grows while the cell runs, and Stop stops it."""

import time

from labhelpers import shot, write_notebook

CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    """import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True).repeat()""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)""",
    """%%distribute --step --data ds --steps 20000
a, b = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], global_batch_size=32)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))""",
]

# Points drawn in the loss plot's lines: plotly draws each trace as one SVG path "M..L..L..".
COUNT_POINTS = """() => {
    const plot = document.querySelector('.nbdist-dashboard .js-plotly-plot');
    if (!plot) return 0;
    let n = 0;
    for (const path of plot.querySelectorAll('.scatterlayer .trace path.js-line')) {
        n += (path.getAttribute('d') || '').split(/[ML]/).length - 1;
    }
    return n;
}"""

KERNEL_BUSY = ("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
               " === 'busy'")


def test_dashboard_grows_while_the_cell_runs_and_stop_ends_the_run(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "dashboard.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(f"() => ({COUNT_POINTS})() > 20", timeout=180_000)
    first = page.evaluate(COUNT_POINTS)
    shot(page, "dashboard-live-1")
    assert page.evaluate(KERNEL_BUSY)
    time.sleep(4)
    second = page.evaluate(COUNT_POINTS)
    assert page.evaluate(KERNEL_BUSY), "the cell ended before the second read"
    shot(page, "dashboard-live-2")
    assert second > first, (first, second)

    page.locator(".nbdist-dashboard button", has_text="Stop").click()
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
        " === 'idle'", timeout=60_000)
    shot(page, "dashboard-stopped")
    page.evaluate("""async () => {
        const app = window.jupyterapp, nb = app.shell.currentWidget.content;
        nb.activeCellIndex = nb.widgets.length - 1;
        await app.commands.execute('notebook:insert-cell-below');
        nb.activeCell.model.sharedModel.source =
            'import nbdist; print("RUN", nbdist.runs[-1].status, nbdist.runs[-1].steps_done)';
        await app.commands.execute('notebook:run-cell');
    }""")
    page.wait_for_function(
        "() => document.body.innerText.includes('RUN stopped')", timeout=60_000)
    text = page.evaluate("() => document.body.innerText")
    steps = int(text.split("RUN stopped", 1)[1].split()[0])
    assert 0 < steps < 20000
