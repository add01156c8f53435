"""The widgets of one Run in the live dashboard: header, progress bar, Stop button, figure.

With a widget frontend the header (``header``) shows strategy, replicas, workers, step/epoch,
steps/s, time left, bus bandwidth, other collectives (if any), then the outcome; stragglers
are named below it. It is redrawn with the plots, from the same rows. ``RunView.draw`` sends
only the traces that changed, in one restyle message of the ``LiveFigure`` (float64 binary buffers);
``Dashboard`` decides when to call it. When the run ends, ``leave_static`` replaces the widgets
in the cell's output with a static bundle (``static.static_bundle``) and closes them: the saved
notebook then shows the final figure without a kernel or a widget model.
"""

from __future__ import annotations

import html
import threading
from typing import Any, Protocol

from ..telemetry.run import Run
from .aggregate import AGGREGATE_ABOVE
from .figure import TOP_STRAGGLERS, FigureModel, figure_dict, run_title
from .header import header_html
from .series import RunSeries
from .stall import StallWatch, stall_note
from .stopper import StopSignal

_DONE_STYLE = {"done": "success", "stopped": "warning", "interrupted": "warning",
               "failed": "danger", "running": "info"}


class ViewSettings(Protocol):
    """What a RunView reads from its owner (a ``Dashboard``; see its class attributes)."""

    max_points: int
    max_total_points: int
    straggler_factor: float
    straggler_min_ms: float
    stop_mode: str
    stall_after: float
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
            straggler_factor=owner.straggler_factor, straggler_min_ms=owner.straggler_min_ms,
            loss_scale=run.loss_scale,
        )
        self.model = FigureModel(self.series, strategy=run.strategy)
        self.n_rows = 0
        self.fig: Any = None
        self.box: Any = None
        self.handle: Any = None           # the cell output the widgets are displayed in
        self.stop: StopSignal | None = None
        self._header = ""                 # what the rows say
        self._shown = ""                  # what the header shows (+ a pause, see ``stall``)
        self._lock = threading.Lock()     # the header is also written by the stall watch
        self.stall: StallWatch | None = None

    def ingest(self) -> None:
        rows = self.run.block_since(self.n_rows)
        self.n_rows += len(rows)
        self.series.ingest(rows)

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

    def smoothing(self) -> float:
        """The smoothing set on the live figure's slider (0 before it is drawn)."""
        return self.fig.chosen_smoothing() if self.fig is not None else 0.0

    def leave_static(self, bundle: dict[str, Any]) -> None:
        """Replace the widgets in the cell's output with ``bundle`` and close them."""
        self._stop_watching()
        if self.handle is not None:
            self.handle.update(bundle, raw=True)
        if self.box is not None:
            _close_tree(self.box)
            self.box = None

    def _build(self) -> None:
        import ipywidgets as w
        from IPython.display import display

        from .livefigure import LiveFigure

        self.model.title = run_title(self.run, self.series, final=False)
        self.fig = LiveFigure(figure_dict(self.model))
        self.header = w.HTML(layout=w.Layout(flex="1 1 auto"))
        self.progress = w.IntProgress(min=0, max=max(1, self.run.total_steps or 1),
                                      bar_style="info", layout=w.Layout(width="14em"))
        if not self.run.total_steps:
            self.progress.layout.visibility = "hidden"
        self.button = w.Button(description="Stop", icon="stop", button_style="danger",
                               tooltip="End training at the next step boundary; the partial "
                                       "Run is kept in nbdist.runs",
                               layout=w.Layout(width="9em"))   # fits "Stopping…"
        self.notes = w.HTML()
        self.box = w.VBox([w.HBox([self.header, self.progress, self.button],
                                  layout=w.Layout(align_items="center")),
                           self.notes, self.fig])
        self.box.add_class("nbdist-dashboard")
        self.header.add_class("nbdist-header")
        self.notes.add_class("nbdist-notes")
        self.stop = StopSignal(self.button, self.owner.kernel, self.owner.stop_mode)
        if self.stop.mode == "off":
            self.button.disabled = True
            self.button.tooltip = ("This kernel cannot receive a click while the cell runs: "
                                   "use Kernel > Interrupt (the partial Run is kept).")
        bundle = self.box._repr_mimebundle_()
        # labextension/src/staleoutputs.ts reads the run id from this text when a notebook
        # saved during the run is opened after its kernel lost the widgets.
        bundle["text/plain"] = (
            f"nbdist live dashboard of Run {self.run.id} ({self.run.strategy}): it needs a "
            "Jupyter widget front end (JupyterLab 4, Notebook 7, VS Code). When the run ends "
            "the final figure replaces it here.")
        self.handle = display(bundle, raw=True, display_id=True)
        self.stall = StallWatch(self.owner.stall_after, self._show_stall)

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
        flagged = s.stragglers()
        waited_for = dict(run.waited_for)
        # for the lab's status bar
        run.stragglers = [*waited_for, *(s.label(x.key) for x in flagged
                                         if s.label(x.key) not in waited_for)]
        notes = [f"⚠ straggler: {html.escape(label)} (the other workers waited {ms:.3g} ms a "
                 "step for it)" for label, ms in waited_for.items()]
        notes += [f"⚠ straggler: {html.escape(s.label(x.key))} ({x.value_ms:.3g} ms, "
                  f"{x.ratio:.1f}× the others' median)" for x in flagged[:TOP_STRAGGLERS]
                  if s.label(x.key) not in waited_for]
        if len(flagged) > TOP_STRAGGLERS:
            notes.append(f"{len(flagged) - TOP_STRAGGLERS} more")
        note_html = ("<span style='color:#b00'>" + "; ".join(notes) + "</span>") if notes else ""
        if note_html != self.notes.value:
            self.notes.value = note_html
        if final:       # the outcome is in the header; a finished run has nothing to stop
            self.progress.bar_style = _DONE_STYLE.get(run.status, "")
            self.button.layout.display = "none"
        elif self.stop is not None and self.stop.event.is_set():
            self.button.description = "Stopping…"
            self.button.disabled = True

    def _show(self, text: str) -> None:
        if text != self._shown:
            self._shown = text
            self.header.value = text

    def _show_stall(self, idle: float) -> None:
        with self._lock:
            stall = self.stall
            if stall is not None and stall.idle() >= stall.after_s:
                self._show(f"{self._header} · {stall_note(idle)}")

    def _stop_watching(self) -> None:
        if self.stall is not None:
            self.stall.close()
            self.stall = None


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

