"""The live dashboard's widgets through a recording comm: traces, header, redraw pacing,
failures, Stop, and the static figure it leaves."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import dashboard_helpers
import numpy as np
import pytest
from dashboard_helpers import Clock, Recorder, by_panel, feed, live_dashboard, make_run, traces

from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.dashboard import Dashboard
from nbdist.widgets.figure import FigureModel, static_figure
from nbdist.widgets.stopper import StopSignal

recorder, clock = dashboard_helpers.recorder, dashboard_helpers.clock     # fixtures

# -- live widget -----------------------------------------------------------------------------
def test_one_trace_per_replica_and_global_line(recorder: Recorder) -> None:
    run = make_run(60)
    dash = live_dashboard(run)
    RunWriter(run).finish("done")
    dash.close()
    loss = by_panel(dash, "loss")
    assert sorted(loss) == ["mean of replicas", "replica 0", "replica 1", "replica 2",
                            "replica 3"]
    assert loss["mean of replicas"].line.width > loss["replica 0"].line.width
    expected = np.mean([[1.0 / (s + 1) + 0.1 * r for r in range(4)] for s in range(60)], axis=1)
    assert np.allclose(loss["mean of replicas"].y, expected)
    assert np.allclose(loss["replica 2"].y, [1.0 / (s + 1) + 0.2 for s in range(60)])
    grad = by_panel(dash, "grad_norm")
    assert sorted(grad) == [f"replica {r}" for r in range(4)]
    assert np.allclose(grad["replica 1"].y, 3.0)
    assert set(by_panel(dash, "time")) >= {"host step time (whole step)", "replica 0"}
    assert isinstance(loss["replica 0"].y, np.ndarray) and loss["replica 0"].y.dtype == np.float64
    menu = dash.views[1].fig.current["layout"]["updatemenus"][0]   # log-scale toggle for loss
    assert {b["args"][0]["yaxis.type"] for b in menu["buttons"]} == {"linear", "log"}
    assert recorder.displayed, "the dashboard was not displayed"


def test_aggregates_are_distinct_named_lines_over_thin_replica_lines(recorder: Recorder) -> None:
    run = make_run(60, other_ms=1.0)
    dash = live_dashboard(run)
    lines = [t for t in traces(dash) if t.mode == "lines"]
    replicas = [t for t in lines if t.name.startswith("replica ")]
    aggregates = [t for t in lines if not t.name.startswith("replica ")]
    assert sorted(t.name for t in aggregates) == [
        "host step time (whole step)", "mean of replicas", "other collectives, slowest replica",
        "slowest replica's all-reduce"]
    # one look per aggregate (dash pattern, shade), all thicker than every replica line
    assert len({(t.line.dash, t.line.color) for t in aggregates}) == len(aggregates)
    assert min(t.line.width for t in aggregates) > max(t.line.width for t in replicas)
    # a replica keeps its colour in every panel, and is in the legend once
    assert {t.line.color for t in replicas if t.name == "replica 2"} == {"#2ca02c"}
    assert sum(getattr(t, "showlegend", True) for t in replicas if t.name == "replica 2") == 1
    assert all(getattr(t, "showlegend", True) for t in aggregates)


def test_layout_shares_the_step_axis_and_keeps_labels_readable(recorder: Recorder) -> None:
    layout = live_dashboard(make_run(3)).views[1].fig.current["layout"]
    # every panel on one step axis: hover and spike show every panel at the hovered step
    assert layout["hovermode"] == "x unified" and layout["hoversubplots"] == "axis"
    assert layout["xaxis"]["showspikes"] and layout["xaxis"]["title"]["text"] == "step"
    assert "xaxis2" not in layout
    # the legend is right of the plots, clear of the step axis title under them
    assert layout["legend"]["x"] > 1 and layout["legend"]["xanchor"] == "left"
    # steps 0-10 at least on the axis: three steps do not get ticks at 0.5, 1.5
    assert layout["xaxis"]["autorangeoptions"]["include"] == [0, 10]
    # log axes label 1, 2, 5, 10 in full, with few ticks; times say their unit
    logs = [v for k, v in layout.items() if k.startswith("yaxis") and v["type"] == "log"]
    assert len(logs) == 2
    assert all(a["tickformat"] == "~g" and a["dtick"] == "D2" and a["title"]["text"] == "ms"
               for a in logs)
    titles = {a["name"]: a["text"] for a in layout["annotations"]}
    assert "(ms)" in titles["title:allreduce_ms"] and "(ms)" in titles["title:time"]
    # the loss linear/log toggle sits on the loss panel, below plotly's mode bar
    menu, expand, *others = layout["updatemenus"]
    assert menu["y"] == layout["yaxis"]["domain"][1] and menu["yanchor"] == "bottom"
    # every panel has its own linear/log buttons and an expand toggle beside them
    assert [m["name"] for m in others] == [f"{kind}:yaxis{i}" for i in range(2, 5)
                                           for kind in ("scale", "expand")]
    assert [b["args"][0]["yaxis4.type"] for b in others[4]["buttons"]] == ["linear", "log"]
    assert others[4]["active"] == 1                      # the time panel starts on log
    [toggle] = expand["buttons"]
    assert expand["active"] == -1                        # off: the first click expands
    grow, back = toggle["args"][0], toggle["args2"][0]
    assert grow["yaxis.domain"] == [0, 1] and grow["yaxis2.domain"] == [0, 0]
    assert grow["yaxis2.visible"] is False and grow["updatemenus[2].visible"] is False
    assert back["yaxis2.domain"] == layout["yaxis2"]["domain"] and back["yaxis2.visible"]


def test_global_loss_is_the_sum_of_replicas_when_they_add_up(recorder: Recorder) -> None:
    # each replica's loss divided by the global batch (compute_average_loss): the tutorial
    # reports their sum; the bold line, the summary and the progress line show it too
    run = Run(id=1, mode="step", strategy="mirrored", replicas=4, total_steps=20)
    run.loss_scale = 4   # as the traced step decides (telemetry.lossform)
    feed(run, 0, 20)
    dash = live_dashboard(run)
    RunWriter(run).finish("done")
    dash.close()
    loss = by_panel(dash, "loss")
    label = "global loss (sum of replicas)"
    assert sorted(loss) == [label, "replica 0", "replica 1", "replica 2", "replica 3"]
    expected = np.sum([[1.0 / (s + 1) + 0.1 * r for r in range(4)] for s in range(20)], axis=1)
    assert np.allclose(loss[label].y, expected)
    assert run.last["global_loss"] == pytest.approx(expected[-1])
    assert f"loss (sum of replicas) {expected[-1]:.4g}" in run.summary()
    assert "loss per replica: " in run.summary()   # the per-replica values beside it
    from nbdist.widgets.progress import _progress_html

    assert f"loss {expected[-1]:.4g}" in _progress_html(run)
    fig = static_figure(run)   # run.plot(): the same line, the same label
    [line] = [t for t in fig.data if t.name == label]
    assert np.allclose(line.y, expected)


def test_keras_fit_run_draws_the_reduced_series(recorder: Recorder) -> None:
    run = Run(id=1, mode="fit", strategy="mirrored", replicas=2)
    for s in range(30):
        RunWriter(run).record_step(s, 0, loss=[1.0 / (s + 1)], step_ms=5.0, replica=-1,
                                   extra={"accuracy": 0.5})
    dash = live_dashboard(run)
    RunWriter(run).finish("done")
    dash.close()
    lines = [t for t in traces(dash) if t.mode == "lines"]
    assert {t.name for t in lines} == {"loss (as fit reports it)", "host step time (whole step)",
                                       "accuracy (running mean over the epoch)"}
    loss = by_panel(dash, "loss")["loss (as fit reports it)"]
    assert np.allclose(loss.y, [1.0 / (s + 1) for s in range(30)])
    assert np.allclose(by_panel(dash, "metrics")["accuracy (running mean over the epoch)"].y,
                       0.5)
    # fit measures neither gradient norms nor all-reduce: no empty panels, a line says why
    layout = dash.views[1].fig.current["layout"]
    assert dash.views[1].model.panels == ["loss", "metrics", "time"] and "yaxis4" not in layout
    titles = {a["name"]: a["text"] for a in layout["annotations"]}
    assert "step time per worker" in titles["title:time"]
    assert "model.fit reports the loss and the step time" in titles["notes"]
    assert dash.views[1].progress.layout.visibility == "hidden"      # no total: no bar


def test_traces_stay_bounded_on_a_long_run(recorder: Recorder) -> None:
    run = make_run(30_000, replicas=2, total=30_000)
    dash = live_dashboard(run)
    dash.close()
    for trace in traces(dash):
        assert len(trace.x) <= 2000, trace.name
    loss = by_panel(dash, "loss")["replica 0"]
    assert loss.x[0] < 20 and loss.x[-1] > 29_900          # covers the whole run
    assert run.n_rows == 60_000                            # the Run keeps everything


def test_unmeasured_timings_are_skipped_not_zero(recorder: Recorder) -> None:
    run = make_run(100, every=10, ar_ms=2.5)
    dash = live_dashboard(run)
    dash.close()
    ar = by_panel(dash, "allreduce_ms")
    assert list(ar["replica 0"].x) == list(range(0, 100, 10))
    assert np.all(ar["replica 0"].y == 2.5)
    assert list(ar["slowest replica's all-reduce"].x) == list(range(0, 100, 10))
    compute = by_panel(dash, "time")["replica 1"]
    assert len(compute.y) == 10 and np.all(np.isfinite(compute.y)) and np.all(compute.y > 0)


def test_straggler_in_header_and_marked_on_plot(recorder: Recorder) -> None:
    run = make_run(100, slow=2)
    dash = live_dashboard(run)
    view = dash.views[1]
    assert dash.stragglers == ["replica 2"]
    assert "straggler: replica 2; the other replicas waited a median 2 ms" in view.notes.value
    marks = [t for t in traces(dash) if t.name == "stragglers"][0]
    assert list(marks.x) == [90.0] and list(marks.y) == [3.0]
    calm = live_dashboard(make_run(100, run_id=2))
    assert calm.stragglers == [] and calm.views[2].notes.value == ""


def test_bus_bandwidth_in_header(recorder: Recorder) -> None:
    run = make_run(50, ar_ms=2.0)
    run.allreduce_bytes = 1_000_000
    dash = live_dashboard(run)
    # 1e6 B x 2(4-1)/4 / 2 ms = 0.75 GB/s, in the unit that reads best
    assert "bus bw 750 MB/s" in dash.views[1].header.value
    assert "other collectives" not in dash.views[1].header.value
    # SyncBatchNormalization's collectives: beside the gradient all-reduce, not in its bandwidth
    run = make_run(50, ar_ms=2.0, other_ms=5.0, run_id=2)
    run.allreduce_bytes = 1_000_000
    header = live_dashboard(run).views[2].header.value
    assert "bus bw 750 MB/s" in header and "other collectives 20 ms" in header


def test_the_header_is_redrawn_with_the_plots_from_the_same_rows(
        recorder: Recorder, clock: Clock) -> None:
    """At every redraw the header's step is the plots' last step (it used to be redrawn at
    most every 0.5 s, and showed "step 1/96" beside plots of 13 steps)."""
    import re

    run = make_run(1, total=40)
    dash = live_dashboard(run, min_interval=0.1, cpu_budget=1.0)
    for step in range(1, 40):
        clock.advance(0.15)
        feed(run, step, step + 1, on_step=dash.on_step)
        header = re.sub(r"<[^>]+>", "", dash.views[1].header.value)
        plotted = by_panel(dash, "loss")["replica 0"].x[-1]
        assert f"step {int(plotted) + 1}/40 · epoch 1" in header, (step, header)
    assert dash.redraws == 40


def test_a_pause_is_said_in_the_header_until_the_next_step(recorder: Recorder) -> None:
    """No step for ``stall_after`` seconds: the header says so (the plots cannot); the next
    step's redraw takes the note away; the finished header has none."""
    run = make_run(5, total=100)
    dash = live_dashboard(run, stall_after=0.3)
    view = dash.views[1]
    deadline = time.monotonic() + 10
    while "no new step for" not in view.header.value and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "no new step for" in view.header.value
    assert "step 5/100" in view.header.value            # the rest is what the rows say
    feed(run, 5, 6, on_step=dash.on_step)
    assert "no new step" not in view.header.value and "step 6/100" in view.header.value
    RunWriter(run).finish("done")
    dash.close()
    assert view.stall is None and "no new step" not in view.header.value


def test_redraws_are_throttled_and_send_binary_buffers(recorder: Recorder, clock: Clock) -> None:
    run = make_run(5, total=1000)
    # An unlimited CPU budget: min_interval alone paces the redraws (a redraw's real cost, over
    # 0.12 s on a loaded CI machine, would otherwise push the next one past the clock's step).
    dash = live_dashboard(run, min_interval=0.1, cpu_budget=float("inf"))
    fig = dash.views[1].fig
    before = dash.redraws
    clock.advance(0.12)
    feed(run, 5, 205, on_step=dash.on_step)    # 200 steps within 0.1 s (the clock stands still)
    assert dash.redraws - before <= 2
    clock.advance(0.12)
    feed(run, 205, 206, on_step=dash.on_step)
    updates = [(d["content"], b) for kind, cid, d, b in recorder.messages
               if cid == fig.comm.comm_id and kind == "comm_msg"
               and (d or {}).get("method") == "custom" and d["content"]["type"] == "restyle"]
    assert updates, "no restyle was sent"
    message, buffers = updates[-1]
    assert buffers and all(memoryview(b).format in ("d", "B") for b in buffers)
    ys = message["props"]["y"]
    assert all(set(v) == {"buffer"} for v in ys)          # float64 buffers, not JSON lists
    assert len(buffers[ys[0]["buffer"]]) % 8 == 0
    # The figure's state is as first drawn (5 steps): later points travel in messages only.
    first = next(t for t in recorder.state(fig.comm.comm_id)["figure"]["data"]
                 if t["name"] == "replica 0" and t["yaxis"] == "y")
    assert len(first["y"]) == 5
    loss0 = next(t for t in traces(dash) if t.name == "replica 0" and t.yaxis == "y")
    assert loss0.x[-1] == 205 and len(loss0.y) == 206


def test_costly_redraws_are_spaced_to_the_cpu_budget(recorder: Recorder, clock: Clock) -> None:
    run = make_run(5, total=1000)
    dash = live_dashboard(run, cpu_budget=0.01, max_interval=0.5)
    clock.advance(0.12)
    feed(run, 5, 30, on_step=dash.on_step)                # a second (steady-state) redraw
    assert dash.redraws == 2 and dash._cost is not None
    interval = dash._next - clock.monotonic()
    assert min(0.5, max(0.1, dash._cost / 0.01)) - 0.05 <= interval <= 0.5


def test_drawing_failure_warns_once_and_training_continues(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    run = make_run(3)
    dash = live_dashboard(run, min_interval=0.0)

    def boom(self: Any) -> Any:
        raise RuntimeError("plotly exploded")

    monkeypatch.setattr(FigureModel, "changes", boom)
    with caplog.at_level(logging.DEBUG, logger="nbdist.widgets.dashboard"):
        feed(run, 3, 40, on_step=dash.on_step)
        assert dash.should_stop() is False
        RunWriter(run).finish("done")
        dash.close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert warned[0].getMessage().startswith(
        "nbdist: the dashboard stopped drawing (RuntimeError: plotly exploded). Training goes on")
    assert warned[0].exc_info[0] is RuntimeError             # with its traceback: a bug
    assert run.steps_done == 40
    summary = recorder.displayed[-1]                     # the summary still reaches the user
    assert summary["text/plain"].startswith("Run 1")
    assert recorder.replaced, "the failed dashboard's widgets were left in the output"


def test_a_worker_whose_lines_appear_mid_run_gets_them_drawn(recorder: Recorder) -> None:
    """Under parameter_server a worker's first rows can come after the figure is drawn: its
    lines are added to the live figure (a dashboard failure warns, which fails this test)."""
    run = Run(id=1, mode="step", strategy="parameter_server", replicas=1, workers=2)

    def step(s: int, worker: int) -> None:
        RunWriter(run).record_step(s, 0, loss=[1.0 / (s + 1)], step_ms=4.0, worker=worker,
                                   replica=0, grad_norm=[1.0])

    for s in range(5):
        step(s, 0)
    dash = live_dashboard(run, min_interval=0.0)
    for s in range(5, 20):
        step(s, s % 2)
        dash.on_step(run)
    RunWriter(run).finish("done")
    dash.close()
    assert not dash.failed
    assert {"w0/r0", "w1/r0"} <= set(by_panel(dash, "loss"))


def test_stop_button_requests_a_stop(recorder: Recorder) -> None:
    run = make_run(5)
    dash = live_dashboard(run)
    assert dash.should_stop() is False
    dash.views[1].button.click()
    assert dash.should_stop() is True
    dash.on_step(run)
    dash.close()
    assert dash.views[1].button.disabled


def test_stop_signal_route_hook_sees_click_on_another_thread() -> None:

    class FakeComm:
        calls: list = []

        def _reply_subshell_for(self, data: Any, default: Any) -> Any:
            self.calls.append(data)
            return default

    class FakeButton:
        comm = FakeComm()

        def on_click(self, fn: Any) -> None:
            self.fn = fn

    kernel = type("K", (), {"shell_channel_thread": object()})()
    signal = StopSignal(FakeButton(), kernel)
    assert signal.mode == "route"
    hook = FakeButton.comm._reply_subshell_for
    results: list = []
    t = threading.Thread(target=lambda: results.append(
        hook({"method": "update", "state": {"x": 1}}, "sub")))
    t.start()
    t.join()
    assert results == ["sub"] and not signal.requested()   # other messages pass through
    threading.Thread(target=hook, args=({"method": "custom", "content": {"event": "click"}},
                                        None)).start()
    deadline = time.monotonic() + 2
    while not signal.requested() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert signal.requested()
    signal.close()
    assert "_reply_subshell_for" not in vars(FakeButton.comm)     # hook removed
    assert StopSignal(FakeButton(), None).mode == "off"          # no kernel: no live stop


@pytest.mark.parametrize("arrives", ["after the cell", "while the cell runs"])
def test_the_final_figure_keeps_the_smoothing_set_on_the_live_slider(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, arrives: str) -> None:
    """The slider lives in the browser; the figure left in the notebook must look the same.
    Its message reaches the kernel's shell-channel thread while the cell still runs (seen
    there through ipykernel's comm routing), or is handled once the cell ends."""
    import base64

    import comm

    from nbdist.widgets.figure import ema
    from nbdist.widgets.static import FIGURE_MIME

    busy = arrives == "while the cell runs"
    if busy:      # ipykernel's Comm routes every message on the shell-channel thread
        made = comm.create_comm

        def routed(*args: Any, **kwargs: Any) -> Any:
            c = made(*args, **kwargs)
            c._reply_subshell_for = lambda data, default: default
            return c

        monkeypatch.setattr(comm, "create_comm", routed)
    run = make_run(60)
    dash = live_dashboard(run)
    fig = dash.views[1].fig
    update = {"method": "update", "state": {"smoothing": 0.6}, "buffer_paths": []}
    if busy:
        t = threading.Thread(target=fig.comm._reply_subshell_for, args=(update, None))
        t.start()
        t.join()
        assert fig.smoothing == 0.0          # the kernel has not handled the message yet
    else:
        fig.comm.handle_msg({"content": {"data": update}, "buffers": []})
    RunWriter(run).finish("done")
    dash.close()
    bundle = recorder.replaced[-1]

    def values(t: dict[str, Any]) -> np.ndarray:
        return np.frombuffer(base64.b64decode(t["y"]["bdata"]), dtype="<f4")

    loss = [t for t in bundle[FIGURE_MIME]["data"]
            if t["name"] == "replica 0" and t["yaxis"] == "y"]
    assert [t.get("opacity") for t in loss] == [0.8, 0.2]     # smoothed, then the faint raw
    np.testing.assert_allclose(values(loss[0]), ema(values(loss[1]), 0.6), rtol=1e-5)
    assert 'stroke-opacity="0.2"' in bundle["image/svg+xml"]


def test_a_finished_runs_widgets_are_freed(recorder: Recorder) -> None:
    """A session runs hundreds of cells: the live figure (its traces, its widget state) must
    go with its widgets when the run ends and the cell's output becomes the static figure."""
    import gc
    import weakref

    earlier = set(threading.enumerate())   # other tests' dashboards may keep theirs running
    run = make_run(60)
    dash = live_dashboard(run)
    figure = weakref.ref(dash.views[1].fig)
    RunWriter(run).finish("done")
    dash.close()
    del dash
    for thread in set(threading.enumerate()) - earlier:   # this stall watch ends on its thread
        if thread.name == "nbdist-stall-watch":
            thread.join(10)
    gc.collect()
    assert figure() is None, [type(r).__name__ for r in gc.get_referrers(figure())]


# -- without a frontend -----------------------------------------------------------------------
def test_a_terminal_run_ends_with_its_summary_and_no_figure_it_cannot_show(
        recorder: Recorder, capsys: Any) -> None:
    run = make_run(30)
    terminal = type("TerminalShell", (), {"kernel": None, "mime_renderers": {}})()
    dash = Dashboard(terminal)
    assert dash.live is False
    dash.on_step(run)
    RunWriter(run).finish("done")
    dash.close()
    [summary] = recorder.displayed      # IPython would keep a figure for the whole session
    assert list(summary) == ["text/plain"]
    assert summary["text/plain"].startswith("Run 1 (step, mirrored, 4 replicas): done")
    assert summary["text/plain"].endswith("its .plot() draws the dashboard's figure)")
    dash_none = Dashboard(None)
    dash_none.on_step(run)
    dash_none.close()
    assert "Run 1" in capsys.readouterr().out


def test_a_shell_that_renders_svg_gets_the_static_figure_and_summary(
        recorder: Recorder) -> None:
    run = make_run(30)
    shell = type("KittyShell", (), {"kernel": None,
                                    "mime_renderers": {"image/svg+xml": print}})()
    dash = Dashboard(shell)
    dash.on_step(run)
    RunWriter(run).finish("done")
    dash.close()
    bundle, summary = recorder.displayed
    assert summary["text/plain"].startswith("Run 1 (step, mirrored, 4 replicas): done")
    html = summary["text/html"]      # no number broken across lines
    assert html.startswith("<pre style='word-break:normal") and "nowrap'>step_ms 4.00<" in html
    assert bundle["image/svg+xml"].startswith("<svg") and "Run 1" in bundle["text/plain"]
    names = [t["name"] for t in bundle["application/vnd.nbdist.figure.v1+json"]["data"]]
    assert names.count("replica 3") == 4                   # one per panel


def test_run_plot_returns_a_static_figure() -> None:
    import plotly.graph_objects as go

    run = make_run(5000, replicas=3, slow=0)
    run.allreduce_bytes = 4096
    RunWriter(run).finish("done")
    fig = run.plot()
    assert isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)
    loss = [t for t in fig.data if t.yaxis == "y"]
    assert [t.name for t in loss] == ["replica 0", "replica 1", "replica 2", "mean of replicas"]
    assert all(len(t.x) <= 2000 for t in fig.data)
    assert "done" in fig.layout.title.text
    titles = {a.name: a.text for a in fig.layout.annotations}
    assert "bus bandwidth" in titles["title:allreduce_ms"]
    # in the header's unit: 4 KB every 2 ms is MB/s, not "0.00273 GB/s"
    from nbdist.widgets.figure import series_of
    from nbdist.widgets.header import header_html

    bandwidth = titles["title:allreduce_ms"].split("bus bandwidth ")[1]
    assert bandwidth.endswith(" MB/s")
    assert f"bus bw {bandwidth}" in header_html(run, series_of(run), True)
    marks = [t for t in fig.data if t.name == "stragglers"][0]
    assert marks.text == ("replica 0: the others waited 2 ms",)


def test_a_notebook_saved_mid_run_keeps_the_last_picture(
        recorder: Recorder, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saved while the run goes on, the notebook has no widget: the output under the live
    dashboard holds its picture, refreshed every ``picture_every`` s (not on every redraw),
    saying what it is; the final figure replaces it when the run ends."""
    from types import SimpleNamespace

    from nbdist.widgets import run_view
    from nbdist.widgets.static import FIGURE_MIME

    monkeypatch.setattr(run_view, "time", SimpleNamespace(
        monotonic=clock.monotonic, perf_counter=time.perf_counter))
    run = make_run(20, total=200)
    dash = live_dashboard(run, picture_every=10.0)
    widget, picture = recorder.displayed
    assert widget["text/plain"].startswith("nbdist live dashboard of Run 1 (mirrored): the run "
                                           "was going on when this notebook was saved")
    assert picture[run_view.LIVE_PICTURE_MIME] == {"run": 1, "step": 20}
    assert picture["text/plain"] == ("Run 1 (mirrored): the dashboard as of step 20; the run "
                                     "was live when this was saved.")
    assert "as of step 20, live when this was saved" in picture["image/svg+xml"]
    assert picture["image/svg+xml"].count("<polyline") >= 4
    # the first picture is of the first redraw: refreshed a second later
    clock.advance(run_view.FIRST_PICTURE_AFTER)
    feed(run, 20, 30, on_step=dash.on_step)
    [first] = recorder.replaced
    assert first[run_view.LIVE_PICTURE_MIME] == {"run": 1, "step": 21}
    clock.advance(5)
    feed(run, 30, 40, on_step=dash.on_step)
    assert len(recorder.replaced) == 1          # redrawn, but the picture is 5 s old only
    clock.advance(6)
    feed(run, 40, 41, on_step=dash.on_step)
    later = recorder.replaced[1]
    assert later[run_view.LIVE_PICTURE_MIME] == {"run": 1, "step": 41}
    RunWriter(run).finish("done")
    dash.close()
    emptied, final = recorder.replaced[2:]
    assert emptied == {"text/plain": ""}        # the final figure says it all
    assert FIGURE_MIME in final and "done" in final["text/plain"]
