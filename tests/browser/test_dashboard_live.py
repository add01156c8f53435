"""The live dashboard in a real browser: it grows while the cell runs, and Stop stops it.

Two traps of the harness (measured; neither is the dashboard's doing):

* ``page.evaluate`` awaits a returned promise, and ``commands.execute('notebook:run-all-cells')``
  resolves only when every cell has run: returned from the snippet, it blocks the test until
  training has ended. The snippets below return nothing.
* ``kernel.status`` is not "a cell is running": JupyterLab's widget manager opens a kernel
  subshell (a control-channel ``create_subshell_request``, ipykernel >= 7) when the first
  widget appears, and the kernel's ``idle`` status for that request sets ``kernel.status`` to
  ``idle`` while the cell keeps running. The cell's own ``executionState`` is read instead.
"""

import time

from labhelpers import shot, write_notebook

# Stop ends the run long before this (~100-200 steps/s here): the margin is for a slow machine.
TOTAL_STEPS = 10_000

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
    f"""%%distribute --step --data ds --steps {TOTAL_STEPS}
a, b = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], global_batch_size=32)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))""",
]

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

# The training cell (the notebook's last) is running.
TRAINING = """() => {
    const cells = window.jupyterapp.shell.currentWidget.content.widgets;
    return cells[cells.length - 1].model.executionState === 'running';
}"""


def test_dashboard_grows_while_the_cell_runs_and_stop_ends_the_run(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "dashboard.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    # Not `() => app.commands.execute(...)`: that promise resolves when the cells have run.
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_function(f"() => ({COUNT_POINTS})() > 20", timeout=120_000)
    assert page.evaluate(TRAINING)
    first = page.evaluate(COUNT_POINTS)
    shot(page, "dashboard-live-1")
    # Each trace keeps at most max_points (bucket means, halved when full), so a read just after
    # a halving can show fewer points than the one before: read again until it grows.
    reads = [first]
    for _ in range(5):
        time.sleep(3)
        reads.append(page.evaluate(COUNT_POINTS))
        assert page.evaluate(TRAINING), f"the cell ended before the dashboard grew: {reads}"
        if reads[-1] > reads[-2]:
            break
    shot(page, "dashboard-live-2")
    print("plotted points, read by read:", reads)
    assert reads[-1] > reads[-2], reads

    page.locator(".nbdist-dashboard button", has_text="Stop").click()
    page.wait_for_function(f"() => !({TRAINING})()", timeout=60_000)
    shot(page, "dashboard-stopped")
    page.evaluate("""() => {
        const app = window.jupyterapp, nb = app.shell.currentWidget.content;
        nb.activeCellIndex = nb.widgets.length - 1;
        app.commands.execute('notebook:insert-cell-below').then(() => {
            nb.activeCell.model.sharedModel.source =
                'import nbdist; print("RUN", nbdist.runs[-1].status, nbdist.runs[-1].steps_done)';
            app.commands.execute('notebook:run-cell');
        });
    }""")
    page.wait_for_function(
        "() => document.body.innerText.includes('RUN stopped')", timeout=60_000)
    text = page.evaluate("() => document.body.innerText")
    steps = int(text.split("RUN stopped", 1)[1].split()[0])
    assert 0 < steps < TOTAL_STEPS
    # The run ended: its widgets gave way to the static final figure (no widget model needed
    # to show it again) and the summary, which says "stopped".
    training = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    assert "stopped" in training.locator(".jp-OutputArea").inner_text()
    assert training.locator(".nbdist-dashboard").count() == 0
    assert training.locator(".jp-RenderedPlotly, .jp-RenderedSVG").count() == 1
    shot(page, "dashboard-final")
