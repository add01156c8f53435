"""A page reloaded while a ``%%distribute`` cell trains gets the live dashboard back, with a
Stop button that stops the run; a second tab on the notebook gets it too; when the run ends the
final figure and the summary replace the views these pages got.

The reloaded page has none of the running cell's outputs (the file on disk has whatever was
last saved; here nothing: the cells' ids differ too, so the kernel's view is placed by the
cell's code), and its cell does not show as running: the dashboard's header is what moves.
The second tab opens the notebook saved mid-run: its view takes the saved view's place.
"""

import time

from figurechecks import check_final_figure
from labhelpers import (
    KERNEL_CONNECTED,
    MIRRORED_SETUP,
    RUN_ALL_NOWAIT,
    run_new_cell,
    shot,
    step_cell,
    write_notebook,
)

# Stop ends the run long before this.
TOTAL_STEPS = 100_000

CELLS = [*MIRRORED_SETUP, step_cell(TOTAL_STEPS)]

# The step the live dashboard's header shows (-1: no dashboard on the page).
STEP = f"""() => {{
    const header = document.querySelector('.nbdist-dashboard .nbdist-header');
    const m = header && header.innerText.match(/step (\\d+)\\/{TOTAL_STEPS}/);
    return m ? Number(m[1]) : -1;
}}"""

def _connected(page) -> None:
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(KERNEL_CONNECTED, timeout=60_000)


def _moves(page, timeout_s: float = 60) -> tuple[int, int]:
    """The header's step, read until it has grown: the dashboard is live."""
    page.wait_for_function(f"() => ({STEP})() >= 0", timeout=timeout_s * 1000)
    first = page.evaluate(STEP)
    deadline = time.monotonic() + timeout_s
    while page.evaluate(STEP) <= first and time.monotonic() < deadline:
        time.sleep(0.5)
    return first, page.evaluate(STEP)


def test_a_reloaded_page_and_a_second_tab_get_the_live_dashboard_and_stop_it(
        lab_server, lab_page, browser):
    name = write_notebook(lab_server["dir"], "reload.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.on("dialog", lambda dialog: dialog.accept())      # "leave with unsaved changes?"
    page.evaluate(RUN_ALL_NOWAIT)
    before = _moves(page, 180)
    assert before[1] > before[0], before

    # Reloaded mid-run: the dashboard is back and live, no "Loading widget..." left.
    page.reload()
    _connected(page)
    first, later = _moves(page)
    assert later > first > before[1], (before, first, later)
    training = page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
    assert training.locator(".nbdist-dashboard").count() == 1
    assert "Loading widget" not in training.inner_text()
    shot(page, "dashboard-reloaded-live")

    # Saved now (as autosave does), the file holds that view; a second tab opening it gets a
    # view of its own in that place. Both follow the run.
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    saved = lab_server["dir"] / name
    deadline = time.monotonic() + 30
    while "nbdist live dashboard of Run 1" not in saved.read_text():
        assert time.monotonic() < deadline, "the notebook was not saved"
        time.sleep(0.5)
    other = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
    try:
        other.goto(f"{lab_server['url']}/lab/workspaces/reload-2/tree/{name}?reset")
        _connected(other)
        first2, later2 = _moves(other)
        assert later2 > first2, (first2, later2)
        cell2 = other.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1)
        assert cell2.locator(".nbdist-dashboard").count() == 1
        assert "Loading widget" not in cell2.inner_text()
        assert page.evaluate(STEP) >= first2 - 50     # the reloaded page keeps up
        shot(other, "dashboard-second-tab-live")

        # Stop on the reloaded page stops the run; the final figure replaces both views.
        training.locator(".nbdist-dashboard button", has_text="Stop").click()
        for p in (page, other):
            p.wait_for_function(
                "() => !document.querySelector('.nbdist-dashboard') &&"
                " document.body.innerText.includes('stopped')", timeout=120_000)
        for cell in (training, cell2):
            text = cell.locator(".jp-OutputArea").inner_text()
            assert "stopped" in text, text
            check_final_figure(cell)
            assert cell.locator(".nbdist-live-picture").count() == 0
        shot(other, "dashboard-second-tab-final")
    finally:
        other.context.close()
    shot(page, "dashboard-reloaded-final")

    # The kernel agrees: the run stopped early.
    run_new_cell(page, 'import nbdist; print("RUN", nbdist.runs[-1].status, '
                       'nbdist.runs[-1].steps_done)')
    page.wait_for_function("() => document.body.innerText.includes('RUN stopped')",
                           timeout=60_000)
    steps = int(page.evaluate("() => document.body.innerText").split("RUN stopped", 1)[1]
                .split()[0])
    assert later < steps < TOTAL_STEPS
