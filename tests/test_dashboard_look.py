"""What a reader of the dashboard's figures gets whatever the page: no control that uploads the
figure, a static SVG readable on light and dark pages, a failed run's reason clear of the loss
toggle, a mid-run picture of bounded size. (The live theme switch itself: the browser test
tests/browser/test_dashboard_theme.py.)"""

from __future__ import annotations

import re
import threading

import dashboard_helpers
import numpy as np
from dashboard_helpers import Recorder, live_dashboard, make_run

from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets import run_view
from nbdist.widgets.figure import FigureModel, figure_dict, run_figure
from nbdist.widgets.livefigure import LiveFigure
from nbdist.widgets.panels import PLOTLY_CONFIG
from nbdist.widgets.series import RunSeries
from nbdist.widgets.static import FIGURE_MIME, static_bundle
from nbdist.widgets.svgplot import figure_svg

recorder = dashboard_helpers.recorder      # fixture

UPLOADS = {"sendChartToCloud", "sendDataToCloud", "editInChartStudio"}


def _run(steps: int = 30, status: str = "done", error: str | None = None) -> Run:
    run = Run(id=3, mode="step", strategy="mirrored", replicas=2, total_steps=steps)
    for s in range(steps):
        RunWriter(run).record_step(
            s, 0, loss=[1.0 / (s + 1) + r for r in range(2)], step_ms=4.0,
            grad_norm=[1.0] * 2, allreduce_ms=[2.0] * 2, compute_ms=[1.0] * 2)
    RunWriter(run).finish(status, error=error)
    return run


def test_no_figure_offers_to_upload_its_data(tmp_path) -> None:
    assert PLOTLY_CONFIG["showSendToCloud"] is False and PLOTLY_CONFIG["plotlyServerURL"] == ""
    assert UPLOADS <= set(PLOTLY_CONFIG["modeBarButtonsToRemove"])
    for kept in ("zoom2d", "pan2d", "resetScale2d", "toImage"):     # what helps stays
        assert kept not in PLOTLY_CONFIG["modeBarButtonsToRemove"]
    run = _run()
    assert static_bundle(run)[FIGURE_MIME]["config"] == PLOTLY_CONFIG       # finished
    live = LiveFigure(figure_dict(FigureModel(RunSeries(replicas=2))))
    try:
        assert live.figure["config"] == PLOTLY_CONFIG                       # live
    finally:
        live.close()
    run.plot().write_html(tmp_path / "run.html", include_plotlyjs=False)   # run.plot()
    html = (tmp_path / "run.html").read_text()
    assert '"showSendToCloud": false' in html and "sendChartToCloud" in html


def _luminance(colour: str) -> float:
    named = {"white": "#ffffff", "black": "#000000"}
    colour = named.get(colour, colour)
    if re.fullmatch(r"#[0-9a-fA-F]{3}", colour):
        colour = "#" + "".join(c * 2 for c in colour[1:])
    assert re.fullmatch(r"#[0-9a-fA-F]{6}", colour), colour
    chans = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in chans]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_static_svg_reads_on_light_and_dark_pages() -> None:
    """The SVG (GitHub, nbconvert, the saved mid-run picture; an <img> that cannot read the
    page's theme) brings its own opaque background: every text and the global loss line are
    read against it, never against the page."""
    svg = figure_svg(run_figure(_run(status="failed", error="Worker 1 died. Restart it.")))
    background = re.search(r'<svg [^>]*>\s*<rect width="[\d.]+" height="[\d.]+" fill="(\w+)"/>',
                           svg)
    assert background, svg[:300]
    page = background.group(1)
    assert contrast(page, "#111111") >= 4.5 and contrast(page, "#ffffff") < 1.5   # light
    texts = re.findall(r"<text ([^>]*)>", svg)
    assert len(texts) > 20
    for attrs in texts:
        fill = re.search(r'fill="([^"]+)"', attrs)
        colour = fill.group(1) if fill else "black"          # SVG's default
        assert contrast(colour, page) >= 4.5, attrs
    global_loss = re.search(r'<polyline fill="none" stroke="([^"]+)"[^>]*>'
                            r'<title>(mean of replicas|global loss)', svg)
    assert global_loss and contrast(global_loss.group(1), page) >= 3


def test_a_failed_runs_reason_is_a_line_of_its_own_under_the_title() -> None:
    """Not after the loss panel's title, where it ran under the linear/log buttons."""
    done = run_figure(_run())["layout"]
    fig = run_figure(_run(status="failed", error="Worker 1 died at step 30. Restart it."))
    layout = fig["layout"]
    notes = {a.get("name"): a["text"] for a in layout["annotations"]}
    assert notes["title:loss"] == "<b>loss</b>"
    assert "✗ failed at step 30</b>: Worker 1 died at step 30" in notes["notes"]
    # the figure grew by that line: the panels keep their height
    assert layout["height"] - done["height"] == layout["margin"]["t"] - done["margin"]["t"] > 0
    assert "✗ failed at step 30" in figure_svg(fig)


def test_the_mid_run_picture_draws_a_bounded_number_of_points(recorder: Recorder) -> None:
    """Drawn from the live figure's lines (up to 2000 points each) at most
    ``PICTURE_POINTS`` a line: it is redrawn every few seconds while the run goes on."""
    run = make_run(5000, replicas=2, total=10_000)
    live_dashboard(run)
    _, picture = recorder.displayed
    svg = picture["image/svg+xml"]
    lines = re.findall(r'<polyline [^>]*points="([^"]+)"', svg)
    assert lines and max(len(p.split()) for p in lines) == run_view.PICTURE_POINTS
    assert np.isclose(float(lines[0].split()[-1].split(",")[0]),
                      max(float(p.split()[-1].split(",")[0]) for p in lines), atol=1)


def test_the_live_figures_csv_button_gets_the_runs_rows(recorder: Recorder) -> None:
    """The mode bar's CSV button sends {"type": "csv"}; seen as it arrives (the cell is still
    running), the kernel answers with every row of ``run.metrics`` so far, as a CSV file."""
    import io

    import pandas as pd

    run = make_run(40, replicas=2, total=100)
    dash = live_dashboard(run)
    fig = dash.views[1].fig
    fig._seen({"method": "custom", "content": {"type": "csv"}})
    for thread in threading.enumerate():
        if thread.name == "nbdist-csv":
            thread.join(30)
    [(_, _, data, [body])] = [m for m in recorder.messages if m[0] == "comm_msg"
                              and m[2].get("content", {}).get("type") == "csv"]
    assert data["content"]["name"] == "nbdist-run-1.csv"
    rows = pd.read_csv(io.BytesIO(bytes(body)))
    pd.testing.assert_frame_equal(rows, run.metrics.reset_index(drop=True), check_dtype=False)
