"""The controls TensorBoard's scalars page has, clicked in JupyterLab on a finished dashboard
and on ``nbdist.compare``: the x axis (step, relative time, wall time), smoothing, linear/log
per panel, one panel expanded to the whole figure and back; runs named by ``--name`` and by
their learning rate, and hidden from the comparison by a legend click.
Screenshots: test-artifacts/dashboard-controls-{time,expanded,compare}.png."""

from labhelpers import (
    MIRRORED_SETUP,
    dismiss_news,
    run_all_and_wait,
    shot_of,
    step_cell,
    write_notebook,
)

CELLS = [
    *MIRRORED_SETUP,
    step_cell(40).replace("--steps 40", "--steps 40 --name 'slow start'", 1),
    "optimizer.learning_rate.assign(0.1)",
    step_cell(40),
    "import nbdist\nnbdist.compare(nbdist.runs[-2:], smoothing=0.6)",
]
FINISHED, COMPARE = len(CELLS) - 2, len(CELLS) - 1

# What the figure in a cell shows: its x axis, y axes, traces' x ranges and opacities.
STATE = """plot => ({
    xtitle: plot.layout.xaxis.title.text, xtype: plot.layout.xaxis.type || 'linear',
    yaxes: Object.fromEntries(Object.entries(plot.layout).filter(([k]) => /^yaxis\\d*$/.test(k))
        .map(([k, a]) => [k, {type: a.type, domain: a.domain, visible: a.visible}])),
    lastx: plot._fullData.map(t => t.x && t.x.length ? t.x[t.x.length - 1] : null),
    faint: plot.data.filter(t => t.opacity === 0.2).length,
    legend: [...plot.querySelectorAll('.infolayer .legend .legendtext')].map(e => e.textContent),
    shown: plot._fullData.filter(t => t.visible === true).map(t => t.name),
    title: plot.layout.title.text,
})"""


def _button(plot, label, nth=0):
    plot.locator(".updatemenu-button", has_text=label).nth(nth).click()


def test_finished_figure_and_compare_controls_change_what_is_drawn(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "controls.ipynb", CELLS)
    errors = []
    lab_page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page = lab_page.open_notebook(name)
    page.set_viewport_size({"width": 1400, "height": 1400})
    run_all_and_wait(page, timeout_ms=240_000)
    dismiss_news(page)
    cells = page.locator(".jp-Notebook .jp-Cell")

    finished = cells.nth(FINISHED)
    plot = finished.locator(".nbdist-figure .js-plotly-plot")
    plot.scroll_into_view_if_needed()
    before = plot.evaluate(STATE)
    assert before["xtitle"] == "step" and "lr 0.1" in before["title"], before
    # x axis: relative time, each step at the second it ended; then wall time; then steps
    finished.locator("select.nbdist-x-axis").select_option("time")
    page.wait_for_function("p => p.layout.xaxis.title.text.startsWith('seconds')",
                           arg=plot.element_handle(), timeout=10_000)
    timed = plot.evaluate(STATE)
    last = [x for x in timed["lastx"] if isinstance(x, (int, float))]
    assert last and max(last) < max(x for x in before["lastx"] if x is not None), (before, timed)
    shot_of(finished, "dashboard-controls-time")
    finished.locator("select.nbdist-x-axis").select_option("wall")
    page.wait_for_function("p => p.layout.xaxis.type === 'date'", arg=plot.element_handle(),
                           timeout=10_000)
    finished.locator("select.nbdist-x-axis").select_option("step")
    page.wait_for_function("p => p.layout.xaxis.title.text === 'step'",
                           arg=plot.element_handle(), timeout=10_000)
    # smoothing: the raw lines stay, faint, under the smoothed ones
    finished.locator(".nbdist-figure-smoothing").fill("0.8")
    page.wait_for_function("p => p.data.filter(t => t.opacity === 0.2).length >= 4",
                           arg=plot.element_handle(), timeout=10_000)
    # log scale on the step time panel (the last with buttons), linear on the loss panel
    time_axis = sorted(before["yaxes"])[-1]
    _button(plot, "linear", nth=0)              # the loss panel is "loss: linear"
    assert plot.evaluate(STATE)["yaxes"]["yaxis"]["type"] == "linear"
    _button(plot, "log", nth=0)
    page.wait_for_function("p => p.layout.yaxis.type === 'log'", arg=plot.element_handle())
    # expand the loss panel to the whole figure, then back
    _button(plot, "expand", nth=0)
    page.wait_for_function("p => p.layout.yaxis.domain[0] === 0 && p.layout.yaxis.domain[1] === 1",
                           arg=plot.element_handle(), timeout=10_000)
    grown = plot.evaluate(STATE)["yaxes"]
    assert grown[time_axis]["visible"] is False, grown
    shot_of(finished, "dashboard-controls-expanded")
    _button(plot, "expand", nth=0)
    page.wait_for_function("p => p.layout.yaxis.domain[0] > 0", arg=plot.element_handle(),
                           timeout=10_000)

    # compare: named by --name and by learning rate; a legend click hides a run
    cells.nth(COMPARE).scroll_into_view_if_needed()    # the notebook draws cells in view
    compare = cells.nth(COMPARE).locator(".nbdist-figure .js-plotly-plot")
    compare.scroll_into_view_if_needed()
    drawn = compare.evaluate(STATE)
    print("compare:", drawn["title"], drawn["legend"])
    assert drawn["legend"] == ["slow start", drawn["legend"][1]], drawn
    assert drawn["legend"][1].endswith("lr 0.1"), drawn
    assert drawn["faint"] == 2, drawn
    compare.locator(".infolayer .legend .traces").first.click()
    page.wait_for_function("p => p._fullData.filter(t => t.visible === 'legendonly').length === 2",
                           arg=compare.element_handle(), timeout=10_000)
    _button(compare, "relative time")
    page.wait_for_function("p => p.layout.xaxis.title.text.startsWith('seconds')",
                           arg=compare.element_handle(), timeout=10_000)
    shot_of(cells.nth(COMPARE), "dashboard-controls-compare")
    assert not errors, errors
