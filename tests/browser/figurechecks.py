"""What the browser tests check of the dashboard's figure (live and finished): the output
area's full width, the legend's names, one look per aggregate, whole-step ticks, the loss
toggle clear of plotly's mode bar, the smoothing slider."""

from __future__ import annotations

# The live figure as drawn: its width and its output area's, legend names, the traces' looks,
# the step axis' tick labels, where the loss toggle and plotly's mode bar are.
FIGURE = """() => {
    const plot = document.querySelector('.nbdist-dashboard .nbdist-live-figure');
    const area = plot.closest('.jp-OutputArea-output');
    const box = e => { const r = e.getBoundingClientRect();
                       return {x: r.x, y: r.y, right: r.right, bottom: r.bottom}; };
    return {
        width: plot.getBoundingClientRect().width, area: area.getBoundingClientRect().width,
        legend: [...plot.querySelectorAll('.infolayer .legend .legendtext')].map(
            e => e.textContent),
        lines: plot.data.filter(t => t.mode === 'lines').map(
            t => ({name: t.name, width: t.line.width, dash: t.line.dash || 'solid',
                   color: t.line.color})),
        xticks: [...plot.querySelectorAll('.xtick text')].map(e => e.textContent),
        toggle: box(plot.querySelector('.updatemenu-container')),
        modebar: box(plot.querySelector('.modebar')),
        xtitle: box(plot.querySelector('.g-xtitle')),
        legendbox: box(plot.querySelector('.infolayer .legend')),
    };
}"""

# The live figure's own layout drawn with 3 steps of data (what the first redraw shows).
EARLY_TICKS = """async () => {
    const plot = document.querySelector('.nbdist-dashboard .nbdist-live-figure');
    const Plotly = await globalThis.nbdistPlotly();    // nbdist's lab extension ships it
    const div = document.createElement('div');
    div.style.width = plot.getBoundingClientRect().width + 'px';
    document.body.appendChild(div);
    const layout = JSON.parse(JSON.stringify(plot.layout));
    await Plotly.newPlot(div, [{x: [0, 1, 2], y: [1, 0.5, 0.4], mode: 'lines'}], layout);
    const ticks = [...div.querySelectorAll('.xtick text')].map(e => e.textContent);
    Plotly.purge(div);
    div.remove();
    return ticks;
}"""

AGGREGATES = {"global loss (sum of replicas)", "slowest replica's all-reduce",
              "host step time (whole step)"}


def overlap(a, b):
    return (a["x"] < b["right"] and b["x"] < a["right"]
            and a["y"] < b["bottom"] and b["y"] < a["bottom"])


def check_live_figure(page):
    # plotly's mode bar shows while the pointer is over the figure
    page.locator(".nbdist-live-figure .nsewdrag").first.hover()
    fig = page.evaluate(FIGURE)
    print("live figure:", {k: fig[k] for k in ("width", "area", "legend", "xticks")})
    assert fig["width"] >= 0.95 * fig["area"], fig        # the output area's full width
    assert fig["legend"][:2] == ["replica 0", "replica 1"], fig["legend"]
    assert AGGREGATES <= set(fig["legend"]), fig["legend"]
    replicas = [t for t in fig["lines"] if t["name"].startswith("replica")]
    aggregates = [t for t in fig["lines"] if not t["name"].startswith("replica")]
    assert len({(t["dash"], t["color"]) for t in aggregates}) == len(aggregates) == 3
    assert min(t["width"] for t in aggregates) > max(t["width"] for t in replicas)
    assert all(float(t.replace(",", "")).is_integer() for t in fig["xticks"]), fig["xticks"]
    early = page.evaluate(EARLY_TICKS)
    print("x ticks of the same layout after 3 steps:", early)
    assert early and all(float(t).is_integer() for t in early), early
    assert not overlap(fig["toggle"], fig["modebar"]), (fig["toggle"], fig["modebar"])
    assert not overlap(fig["xtitle"], fig["legendbox"])
    # Smoothing: each line drawn smoothed over its faint raw copy (no legend entry)
    page.locator(".nbdist-smoothing").fill("0.6")
    page.wait_for_function("""() => document.querySelector('.nbdist-live-figure').data
        .filter(t => t.opacity === 0.2 && t.hoverinfo === 'skip').length >= 10""",
        timeout=10_000)


# The finished figure: nbdist's renderer (labextension/src/figure.ts), or its SVG.
FINAL = ".nbdist-figure, .jp-RenderedSVG"


def check_final_figure(cell):
    """The finished figure: the same full width and the same legend as the live one."""
    final = cell.locator(FINAL)
    assert final.count() == 1
    width = final.evaluate("e => e.getBoundingClientRect().width")
    area = final.evaluate("e => e.closest('.jp-OutputArea-output').getBoundingClientRect().width")
    assert width >= 0.95 * area, (width, area)
    legend = final.evaluate(
        "e => [...e.querySelectorAll('.infolayer .legend .legendtext, text')]"
        ".map(t => t.textContent)")
    assert AGGREGATES <= set(legend), legend


# The finished figure's faint raw lines (drawn under smoothed ones), as plotly or as SVG.
FAINT_LINES = """e => {
    const plot = e.matches('.js-plotly-plot') ? e : e.querySelector('.js-plotly-plot');
    return plot ? plot.data.filter(t => t.opacity === 0.2 && t.hoverinfo === 'skip').length
                : e.querySelectorAll('polyline[stroke-opacity="0.2"]').length;
}"""


def check_final_smoothing(cell):
    """The smoothing set on the live slider (check_live_figure sets 0.6) is the final
    figure's: each line smoothed over its faint raw copy, as the live figure drew it."""
    faint = cell.locator(FINAL).evaluate(FAINT_LINES)
    assert faint >= 10, faint


# The annotations of the live figure: the notes line, then the panel titles.
PANEL_TITLES = """() => {
    const plot = document.querySelector('.nbdist-dashboard .nbdist-live-figure');
    return plot ? [...plot.querySelectorAll('.annotation-text')].map(e => e.textContent) : null;
}"""


def check_fit_panels(page):
    """model.fit measures no gradient norms or all-reduce times: no empty panels, one line
    saying why."""
    # the plot's node appears before plotly draws its annotations into it
    page.wait_for_function(f"() => (({PANEL_TITLES})() || []).length > 0", timeout=60_000)
    texts = page.evaluate(PANEL_TITLES)
    assert texts == ["model.fit reports the loss and the step time: gradient norms and "
                     "all-reduce times are measured in --step cells",
                     "loss", "step time per worker (ms)"], texts
