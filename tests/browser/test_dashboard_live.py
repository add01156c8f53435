"""The live dashboard in a real browser: it grows while the cell runs, its header and the
status bar follow it (replica 1 is made slow: both name the straggler; the status bar names
the run's bottleneck too, and keeps it once the run ended), and Stop stops it.
The dashboard's screenshot is the README's picture (``pytest --update-docs`` puts it in docs/).

Two traps of the harness (measured; neither is the dashboard's doing):

* ``page.evaluate`` awaits a returned promise, and ``commands.execute('notebook:run-all-cells')``
  resolves only when every cell has run: returned from the snippet, it blocks the test until
  training has ended. The snippets below return nothing.
* ``kernel.status`` is not "a cell is running": JupyterLab's widget manager opens a kernel
  subshell (a control-channel ``create_subshell_request``, ipykernel >= 7) when the first
  widget appears, and the kernel's ``idle`` status for that request sets ``kernel.status`` to
  ``idle`` while the cell keeps running. The cell's own ``executionState`` is read instead.
"""

import json
import re
import time

from figurechecks import check_final_figure, check_final_smoothing, check_live_figure
from labhelpers import (
    COUNT_POINTS,
    LAST_CELL_RUNNING,
    RUN_ALL_NOWAIT,
    dismiss_news,
    doc_shot,
    run_new_cell,
    shot,
    shot_of,
    write_notebook,
)

# Stop ends the run long before this: the margin is for a slow machine.
TOTAL_STEPS = 10_000

CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    """import time
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(640, 8)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True).repeat()

def lag(replica):       # replica 1 computes 10 ms longer: a straggler
    if int(replica) == 1:
        time.sleep(0.01)
    return replica""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)""",
    f"""%%distribute --step --data ds --steps {TOTAL_STEPS} --timing-every 1
a, b = batch
replica = tf.distribute.get_replica_context().replica_id_in_sync_group
with tf.control_dependencies([tf.py_function(lag, [replica], tf.int32)]):
    a = tf.identity(a)
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], global_batch_size=32)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))""",
]

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The status bar's names of the bottlenecks (labextension/src/state.ts, BOTTLENECK_LABELS).
BOTTLENECK_LABELS = {"input": "input-bound", "dispatch": "dispatch-bound",
                     "communication": "communication-bound", "straggler": "straggler-bound",
                     "tiny model": "model too small", "balanced": "balanced"}
# The status bar's verdict on the running run: what follows its step (the last item).
LIVE_VERDICT = rf"step \d+/{TOTAL_STEPS} · ([^·]+)$"

# The training cell (the notebook's last) is running.
TRAINING = LAST_CELL_RUNNING


# The header's items, each with the number of lines it is drawn on, and the header's lines.
HEADER_LAYOUT = """() => {
    const header = document.querySelector('.nbdist-dashboard .nbdist-header');
    const items = [...header.querySelectorAll('span')];
    const tops = new Set(items.map(s => Math.round(s.getBoundingClientRect().top)));
    return {text: header.innerText, lines: tops.size,
            split: items.filter(s => s.getClientRects().length > 1).map(s => s.innerText)};
}"""


def test_dashboard_grows_while_the_cell_runs_and_stop_ends_the_run(
        lab_server, lab_page, browser, request):
    name = write_notebook(lab_server["dir"], "dashboard.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.set_viewport_size({"width": 1400, "height": 1500})    # the whole dashboard in view
    page.evaluate(RUN_ALL_NOWAIT)
    page.wait_for_function(f"() => ({COUNT_POINTS})() > 20", timeout=120_000)
    assert page.evaluate(TRAINING)
    first = page.evaluate(COUNT_POINTS)
    shot(page, "dashboard-live-1")

    # The header: where the run is, in two lines, no item broken across lines.
    layout = page.evaluate(HEADER_LAYOUT)
    assert re.search(rf"step \d+/{TOTAL_STEPS} · epoch 1/1 · [\d.]+ steps/s · .+ left",
                     layout["text"]), layout
    assert layout["lines"] <= 2 and layout["split"] == [], layout
    # The slow replica is named under the header and in the status bar, which turns red.
    page.wait_for_function(
        "() => document.querySelector('.nbdist-dashboard .nbdist-notes').innerText"
        ".includes('straggler: replica 1')", timeout=60_000)
    page.wait_for_function(
        "() => { const e = document.querySelector('.nbdist-status-item');"
        " return e && e.textContent.includes('straggler replica 1')"
        " && e.classList.contains('nbdist-status-alert'); }", timeout=30_000)
    status = page.locator(".nbdist-status-item").text_content()
    assert re.search(rf"step \d+/{TOTAL_STEPS}", status), status
    doc_shot(page.locator(".nbdist-dashboard"), "dashboard", request.config)
    dismiss_news(page)
    training = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    check_live_figure(page)
    # the picture a mid-run save keeps is under the live dashboard, hidden while it is live
    assert training.locator(".nbdist-live-picture").count() == 1
    assert training.locator(".nbdist-live-picture").is_hidden()
    shot_of(training.locator(".jp-OutputArea"), "dashboard-live-smoothed")
    # Saved during the run (as autosave does), the file holds the live widget view.
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    saved = lab_server["dir"] / name
    deadline = time.monotonic() + 30
    while WIDGET_VIEW not in saved.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    (lab_server["dir"] / "saved-live.ipynb").write_text(saved.read_text())
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

    # Once the run has trained long enough to be explained, the status bar names its bottleneck
    page.wait_for_function(
        f"() => new RegExp({json.dumps(LIVE_VERDICT)}).test("
        "document.querySelector('.nbdist-status-item').textContent)", timeout=60_000)
    live = re.search(LIVE_VERDICT, page.locator(".nbdist-status-item").text_content())
    print("the status bar's live verdict:", live and live.group(1))
    assert live and live.group(1) in BOTTLENECK_LABELS.values(), live
    assert page.evaluate(TRAINING)

    page.locator(".nbdist-dashboard button", has_text="Stop").click()
    # A click reaches the kernel between steps; a loaded machine delays it, hence the margin.
    page.wait_for_function(f"() => !({TRAINING})()", timeout=120_000)
    shot(page, "dashboard-stopped")
    run_new_cell(page, 'import nbdist; print("RUN", nbdist.runs[-1].status, '
                       'nbdist.runs[-1].steps_done, nbdist.runs[-1].explain().bottleneck)')
    page.wait_for_function(
        "() => document.body.innerText.includes('RUN stopped')", timeout=60_000)
    text = page.evaluate("() => document.body.innerText")
    steps, bottleneck = text.split("RUN stopped", 1)[1].split("\n")[0].split(maxsplit=1)
    assert 0 < int(steps) < TOTAL_STEPS
    # The status bar keeps the stopped run's verdict: what `%distribute explain` says of it.
    status = page.locator(".nbdist-status-item").text_content()
    assert status.endswith(f"stopped · {BOTTLENECK_LABELS[bottleneck.strip()]}"), status
    # The run ended: its widgets gave way to the static final figure (no widget model needed
    # to show it again) and the summary, which says "stopped".
    assert "stopped" in training.locator(".jp-OutputArea").inner_text()
    assert training.locator(".nbdist-dashboard").count() == 0
    check_final_figure(training)
    check_final_smoothing(training)
    shot(page, "dashboard-final")
    # Saved now, the finished figure is one picture (SVG) and its JSON: no PNG copy of it
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 30
    while WIDGET_VIEW in saved.read_text() and time.monotonic() < deadline:
        time.sleep(0.5)
    final_text = saved.read_text()
    assert "application/vnd.nbdist.figure.v1+json" in final_text
    assert "image/png" not in final_text
    shot_of(training.locator(".jp-OutputArea"), "dashboard-final-output")

    # The copy saved during the run, opened with a new kernel that never had its widgets:
    # the view says which run it was instead of "Error displaying widget: model not found".
    again = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    try:
        again.goto(f"{lab_server['url']}/lab/workspaces/saved-live/tree/saved-live.ipynb?reset")
        again.wait_for_function(
            "() => document.body.innerText.includes('was saved while it ran')",
            timeout=120_000)
        assert "model not found" not in again.evaluate("() => document.body.innerText")
        # ... and the dashboard's picture as of the save, shown at the output's width
        picture = again.locator(".nbdist-live-picture img")
        picture.wait_for(state="visible", timeout=30_000)
        assert picture.evaluate("e => e.getBoundingClientRect().width") > 900
        shot(again, "dashboard-saved-live-reopened")
    finally:
        again.context.close()
