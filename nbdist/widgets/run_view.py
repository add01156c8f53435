"""The widgets of one Run in the live dashboard: header, progress bar, Stop button, figure.

With a widget frontend the header (``header``) shows strategy, replicas, workers, step/epoch,
steps/s, time left, bus bandwidth, other collectives (if any), then the outcome; stragglers
are named below it. It is redrawn with the plots, from the same rows. ``RunView.draw`` sends
only the traces that changed, in one restyle message of the ``LiveFigure`` (float64 binary buffers);
``Dashboard`` decides when to call it. When the run ends, ``leave_static`` replaces the widgets
in the cell's output with a static bundle (``static.static_bundle``) and closes them: the saved
notebook then shows the final figure without a kernel or a widget model.

A notebook saved while the run goes on keeps no widget (its model lives in the kernel), so a
second output under the widgets holds the dashboard's picture as of its last refresh (SVG,
``live_picture``), hidden by nbdist's JupyterLab extension while the live dashboard is there.
It is refreshed ``FIRST_PICTURE_AFTER`` s after the widgets are built (the first picture, of the
first step, has nothing on its axes), then every ``picture_every`` seconds (and less often if
drawing it costs more than 1% of the time): a save at any moment (Ctrl+S, autosave) keeps
curves a few seconds old at most. The picture is drawn from what the live figure shows
already, so steps pay nothing for it. It is not in the widget's own
output: updating that output makes the front end build a new widget view, which would lose
the figure's data (sent in messages, not in the widget's state).

A page that connects while the run goes on (a reload, a second tab) cannot load these widgets
from the kernel until the cell ends, so ``add_view`` makes it a set of its own, which every
redraw keeps in step with the first (the figure's messages are encoded once and sent to each).
The kernel cannot tell when such a page is gone, so at most ``MAX_EXTRA_VIEWS`` are kept: a
page reloaded again and again does not multiply the messages of every redraw.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any, Protocol

import numpy as np

from ..telemetry.run import Run
from .aggregate import AGGREGATE_ABOVE
from .figure import FigureModel, feed, figure_dict, run_title
from .header import header_html
from .series import RunSeries
from .stall import StallWatch, stall_note
from .stopper import StopSignal
from .svgplot import figure_svg

#: The live dashboard's last picture (rendered by labextension/src/figure.ts).
LIVE_PICTURE_MIME = "application/vnd.nbdist.live-picture.v1+json"

#: Seconds from the first picture (the widgets' first step) to its first refresh.
FIRST_PICTURE_AFTER = 1.0

#: Points per line in that picture: the page's width, not the live figure's 2000 (its cost
#: spaces the refreshes, see the module docstring).
PICTURE_POINTS = 400

#: Views made by ``add_view`` kept at once; the oldest is closed to make room for another.
MAX_EXTRA_VIEWS = 3

_DONE_STYLE = {"done": "success", "stopped": "warning", "interrupted": "warning",
               "failed": "danger", "running": "info"}


class ViewSettings(Protocol):
    """What a RunView reads from its owner (a ``Dashboard``; see its class attributes)."""

    max_points: int
    max_total_points: int
    stop_mode: str
    stall_after: float
    picture_every: float
    kernel: Any


class RunView:
    """The widgets of one Run: header, progress bar, Stop button, figure."""

    def __init__(self, run: Run, owner: ViewSettings):
        self.run, self.owner = run, owner
        keys = run.replicas * run.workers
        traces = 4 * keys + 5 if keys <= AGGREGATE_ABOVE else 30
        per_trace = min(owner.max_points, max(250, owner.max_total_points // traces))
        self.series = RunSeries(
            replicas=run.replicas, workers=run.workers, max_points=per_trace,
            loss_scale=run.loss_scale,
        )
        self.model = FigureModel(self.series, strategy=run.strategy, run=run)
        self.model.loss_label = run.loss_label
        self.n_epochs = 0                 # rows of ``run.epoch_metrics`` read
        self.n_rows = 0
        self.fig: Any = None
        self.box: Any = None
        self.handle: Any = None           # the cell output the widgets are displayed in
        self.stop: StopSignal | None = None
        self._header = ""                 # what the rows say
        self._shown = ""                  # what the header shows (+ a pause, see ``stall``)
        self._lock = threading.Lock()     # the header is also written by the stall watch
        self.stall: StallWatch | None = None
        self.picture: Any = None          # the output holding the last picture (see module)
        self.extra: list[_Widgets] = []   # views for pages that connected mid-run (add_view)
        self._picture_due = 0.0           # time.monotonic() of its next refresh

    def ingest(self) -> None:
        """The rows (and a fit's metrics and finished epochs) recorded since the last call;
        the first call also reads the steps of the run this one resumed (``figure.feed``)."""
        self.series.loss_scale = self.run.loss_scale   # decided when the step was traced
        self.n_rows += feed(self.series, self.run, self.n_rows)
        epochs = self.run.epoch_rows(self.n_epochs)
        self.n_epochs += len(epochs)
        self.series.ingest_epochs(epochs)

    def draw(self, final: bool = False) -> None:
        if self.fig is None:
            if not self.series.keys:
                return                          # nothing recorded yet (or ever)
            self._build()
        else:
            new = self.model.new_traces()
            if new:
                self.fig.add_traces(new)
            restyle, idx = self.model.changes()
            if idx:
                self.fig.restyle(restyle, idx)
            marks = self.model.marks_change()
            if marks is not None:
                self.fig.restyle(*marks)
            heat = self.model.heat_change()
            if heat is not None:
                self.fig.restyle(*heat)
        self._update_header(final)     # from the same rows as the plots, at the same time
        if not final and time.monotonic() >= self._picture_due:
            self._refresh_picture()

    def smoothing(self) -> float:
        """The smoothing set on the live figure's slider (0 before it is drawn)."""
        return self.fig.chosen_smoothing() if self.fig is not None else 0.0

    def leave_static(self, bundle: dict[str, Any]) -> None:
        """Replace the widgets in the cell's output with ``bundle`` and close them."""
        self._stop_watching()
        if self.picture is not None:       # the final figure says it all
            self.picture.update({"text/plain": ""}, raw=True)
        if self.handle is not None:
            self.handle.update(bundle, raw=True)
        if self.box is not None:
            _close_tree(self.box)
            self.box = None
        for parts in self.extra:
            _close_tree(parts.box)
        self.extra = []

    def _build(self) -> None:
        from IPython.display import display

        from .livefigure import LiveFigure

        self.model.title = run_title(self.run, self.series, final=False)
        if self.run.resumed_from is not None:    # the steps before it are the earlier run's
            self.model.title += (f" · resumed from run {self.run.resumed_from.id} at step "
                                 f"{self.run.resumed_at}")
        self.fig = LiveFigure(figure_dict(self.model))
        self.fig.csv = self.csv
        parts = _Widgets(self.fig, self.run)
        self.header, self.progress, self.button = parts.header, parts.progress, parts.button
        self.notes, self.box = parts.notes, parts.box
        self.stop = StopSignal(self.button, self.owner.kernel, self.owner.stop_mode)
        if self.stop.mode == "off":
            parts.no_live_stop()
        self.handle = display(parts.bundle(), raw=True, display_id=True)
        self.picture = display(self.live_picture(), raw=True, display_id=True)
        self._picture_due = time.monotonic() + min(FIRST_PICTURE_AFTER,
                                                   self.owner.picture_every)
        self.stall = StallWatch(self.owner.stall_after, self._show_stall)

    def add_view(self) -> dict[str, Any]:
        """Another set of widgets of this run, for a page that connected while it goes on (a
        reload, another tab: it cannot get the first set's figure data, sent in messages).
        Built from what the first set shows now, kept in step with it by every later redraw,
        its Stop button stops the run, and it is closed with the first. Returns the bundle
        that displays it. Call after the first ``draw`` that built the widgets. The oldest
        of ``MAX_EXTRA_VIEWS`` such views is closed to make room."""
        if len(self.extra) >= MAX_EXTRA_VIEWS:
            _close_tree(self.extra.pop(0).box)
        parts = _Widgets(self.fig.follow(), self.run)
        self.extra.append(parts)
        if self.stop is not None:
            self.stop.watch(parts.button)
            if self.stop.mode == "off":
                parts.no_live_stop()
        with self._lock:
            self._mirror()
        return parts.bundle()

    def csv(self) -> tuple[str, bytes]:
        """The run's rows so far (``run.metrics``) as a CSV file: (name, bytes)."""
        return (f"nbdist-run-{self.run.id}.csv",
                self.run.metrics.to_csv(index=False).encode("utf-8"))

    def extra_ids(self) -> list[str]:
        """The widget model ids of the views ``add_view`` made."""
        return [parts.box.model_id for parts in self.extra]

    def live_picture(self) -> dict[str, Any]:
        """The bundle of the live dashboard's picture as the live figure shows it now."""
        run, step = self.run, self.series.last_step + 1
        current = self.fig.current
        title = (f"{current['layout']['title']['text']} · as of step {step}, "
                 "live when this was saved")
        layout = {**current["layout"], "title": {**current["layout"]["title"], "text": title}}
        return {
            LIVE_PICTURE_MIME: {"run": run.id, "step": step},
            "image/svg+xml": figure_svg({"data": [_thinned(t, PICTURE_POINTS)
                                                  for t in current["data"]],
                                         "layout": layout}),
            "text/plain": f"Run {run.id} ({run.strategy}): the dashboard as of step {step}; "
                          "the run was live when this was saved.",
        }

    def _refresh_picture(self) -> None:
        start = time.perf_counter()
        self.picture.update(self.live_picture(), raw=True)
        cost = time.perf_counter() - start
        self._picture_due = time.monotonic() + max(self.owner.picture_every, cost / 0.01)

    def _update_header(self, final: bool) -> None:
        run, s = self.run, self.series
        if final:
            self._stop_watching()
        elif self.stall is not None:
            self.stall.seen()
        with self._lock:
            self._header = header_html(run, s, final)
            self._show(self._header)
        total = run.total_steps
        if total and self.progress.max != total:     # a fit's length comes with its first step
            self.progress.max = total
            self.progress.layout.visibility = "visible"
        self.progress.value = min(s.last_step + 1, self.progress.max)
        notes = [f"⚠ {html.escape(x.note())}" for x in run.stragglers()]
        note_html = ("<span style='color:#b00'>" + "; ".join(notes) + "</span>") if notes else ""
        if note_html != self.notes.value:
            self.notes.value = note_html
        if final:       # the outcome is in the header; a finished run has nothing to stop
            self.progress.bar_style = _DONE_STYLE.get(run.status, "")
            self.button.layout.display = "none"
        elif self.stop is not None and self.stop.event.is_set():
            self.button.description = "Stopping…"
            self.button.disabled = True
        if self.extra:
            with self._lock:
                self._mirror()

    def _show(self, text: str) -> None:
        if text != self._shown:
            self._shown = text
            self.header.value = text
            for parts in self.extra:
                parts.header.value = text

    def _mirror(self) -> None:
        """The views of ``add_view`` show what the first shows (a trait sends only a change,
        so this costs a message per change and view; nothing without such views)."""
        for parts in self.extra:
            parts.header.value = self._shown
            parts.notes.value = self.notes.value
            for name in ("max", "value", "bar_style"):
                setattr(parts.progress, name, getattr(self.progress, name))
            parts.progress.layout.visibility = self.progress.layout.visibility
            for name in ("description", "disabled", "tooltip"):
                setattr(parts.button, name, getattr(self.button, name))
            parts.button.layout.display = self.button.layout.display

    def _show_stall(self, idle: float) -> None:
        with self._lock:
            stall = self.stall
            if stall is not None and stall.idle() >= stall.after_s:
                self._show(f"{self._header} · {stall_note(idle)}")

    def _stop_watching(self) -> None:
        if self.stall is not None:
            self.stall.close()
            self.stall = None


class _Widgets:
    """One view's widgets of a Run: header, progress bar, Stop button, notes, figure."""

    def __init__(self, fig: Any, run: Run):
        import ipywidgets as w

        self.run = run
        self.header = w.HTML(layout=w.Layout(flex="1 1 auto"))
        self.progress = w.IntProgress(min=0, max=max(1, run.total_steps or 1),
                                      bar_style="info", layout=w.Layout(width="14em"))
        if not run.total_steps:
            self.progress.layout.visibility = "hidden"
        self.button = w.Button(description="Stop", icon="stop", button_style="danger",
                               tooltip="End training at the next step boundary; the partial "
                                       "Run is kept in nbdist.runs",
                               layout=w.Layout(width="9em"))   # fits "Stopping…"
        self.notes = w.HTML()
        self.box = w.VBox([w.HBox([self.header, self.progress, self.button],
                                  layout=w.Layout(align_items="center")),
                           self.notes, fig])
        self.box.add_class("nbdist-dashboard")
        self.header.add_class("nbdist-header")
        self.notes.add_class("nbdist-notes")

    def no_live_stop(self) -> None:
        self.button.disabled = True
        self.button.tooltip = ("This kernel cannot receive a click while the cell runs: "
                               "use Kernel > Interrupt (the partial Run is kept).")

    def bundle(self) -> dict[str, Any]:
        """The output that displays this view."""
        bundle = self.box._repr_mimebundle_()
        # labextension/src/staleoutputs.ts reads the run id from this text when a notebook
        # saved during the run is opened after its kernel lost the widgets.
        bundle["text/plain"] = (
            f"nbdist live dashboard of Run {self.run.id} ({self.run.strategy}): the run was "
            "going on when this notebook was saved; below is its picture as of then. A Jupyter "
            "widget front end (JupyterLab 4, Notebook 7, VS Code) draws it live.")
        return bundle


def _thinned(trace: dict[str, Any], points: int) -> dict[str, Any]:
    """``trace`` with at most ``points`` of its x/y points, evenly spaced, the last kept."""
    x, y = trace.get("x"), trace.get("y")
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray) or \
            len(x) != len(y) or len(x) <= points:
        return trace
    keep = np.linspace(0, len(x) - 1, points).round().astype(np.int64)
    return {**trace, "x": x[keep], "y": y[keep]}


def _close_tree(widget: Any) -> None:
    """Close a widget, its children and their layout/style models (front end and kernel)."""
    from ipywidgets import Widget

    for child in getattr(widget, "children", ()):
        _close_tree(child)
    for name in ("layout", "style"):
        part = getattr(widget, name, None)
        if isinstance(part, Widget):
            part.close()
    widget.close()

