"""The live training dashboard: a view of a Run, drawn under the ``%%distribute`` cell.

``Dashboard`` is a run observer (``on_step(run)``, ``should_stop()``, ``close()``) called by the
runner on the kernel's main thread between steps. It redraws at most every ``min_interval``
seconds (and less often if a redraw costs more than ``cpu_budget`` of the wall time), sends
only the traces that changed in one ``plotly_update`` message of float64 arrays (binary
buffers), and keeps every trace to ``max_points`` points; the Run keeps the full data.

With a widget frontend: a header (strategy, replicas, workers, step/epoch, steps/s, ETA, bus
bandwidth, stragglers), a progress bar, a Stop button and a plotly ``FigureWidget``. Without
one (terminal IPython, plain Python): a static figure and the text summary when the run ends.
A failure while drawing never stops training: it is reported once and drawing stops.
"""

from __future__ import annotations

import html
import math
import threading
import time
import warnings
from typing import Any

from ..hooks.plotly import can_send_restyle, keep_in_saved_state, send_restyle
from ..telemetry.run import Run
from .figure import FigureModel, figure_dict, run_title, static_figure
from .progress import _has_frontend
from .series import RunSeries
from .stopper import StopSignal

__all__ = ["Dashboard", "observer_for"]

_DONE_STYLE = {"done": "success", "stopped": "warning", "interrupted": "warning",
               "failed": "danger", "running": "info"}


class Dashboard:
    """Draws every Run of one cell. Settings are class attributes (change them to configure
    all dashboards) or keyword arguments."""

    straggler_factor: float = 1.5   # flag a replica/worker slower than this x the others' median
    straggler_min_ms: float = 0.5   # ... and slower by at least this (ignore sub-ms jitter)
    max_points: int = 2000          # per trace
    max_total_points: int = 40_000  # all traces together (many replicas: fewer points each)
    min_interval: float = 0.1       # seconds between redraws (at most ~10/s)
    cpu_budget: float = 0.01        # redraws may use at most this fraction of the wall time
    remote_cpu_budget: float = 0.10  # ... when the steps run in worker processes, not here
    max_interval: float = 2.0       # ... but the view is never older than this (seconds)
    header_interval: float = 0.5    # the header and progress bar: at most 2 updates/s
    stop_mode: str = "auto"         # see nbdist.widgets.stopper

    def __init__(self, shell: Any = None, *, live: bool | None = None, **settings: Any):
        for name, value in settings.items():
            if not hasattr(Dashboard, name) or name.startswith("_"):
                raise TypeError(f"Dashboard got an unknown setting {name!r}")
            setattr(self, name, value)
        self.shell = shell
        self.live = _has_frontend(shell) if live is None else live
        self.kernel = getattr(shell, "kernel", None)
        self.runs: list[Run] = []
        self.views: dict[int, _RunView] = {}
        self.redraws = 0
        self.redraw_seconds = 0.0     # total, including building the widgets
        self.build_seconds = 0.0
        self.failed: str | None = None
        self._next = 0.0
        self._cost: float | None = None     # moving average of a redraw's cost (s)
        if self.live:
            _prewarm()

    # -- observer interface ----------------------------------------------------------------
    def on_step(self, run: Run) -> None:
        if not self.runs or self.runs[-1] is not run:
            if all(r is not run for r in self.runs):
                self.runs.append(run)
        elif time.monotonic() < self._next:
            return
        if self.live:       # headless: everything is drawn from the Run when it ends
            self._guard(self._redraw, run)

    def should_stop(self) -> bool:
        view = self._current()
        if view is None or view.stop is None:
            return False
        try:
            return view.stop.requested()
        except Exception as err:  # a broken poll must not stop training either
            self._fail(err)
            view.stop = None
            return False

    def close(self) -> None:
        """The cell ended: last redraw, final header, text summary (or the static figure)."""
        for run in self.runs:
            view = self.views.get(run.id)
            if view is not None:
                if view.stop is not None:
                    self._guard(view.stop.close)
                self._guard(self._finish, view)
            if self.live and not self.failed:
                _display_summary(run)
            elif self.live or self.shell is None:
                print(run.summary())
            else:
                try:
                    _display_static(run)
                except Exception as err:
                    self._fail(err)
                    print(run.summary())

    # -- drawing ---------------------------------------------------------------------------
    def _current(self) -> _RunView | None:
        return self.views.get(self.runs[-1].id) if self.runs else None

    def _redraw(self, run: Run) -> None:
        start = time.perf_counter()
        view = self.views.get(run.id)
        first = view is None or view.fig is None
        if view is None:
            view = self.views[run.id] = _RunView(run, self)
        view.ingest()
        if self.live:
            view.draw()
        cost = time.perf_counter() - start
        self.redraws += 1
        self.redraw_seconds += cost
        if first:       # building the widget (and importing plotly) is a one-off
            self.build_seconds += cost
        else:
            self._cost = cost if self._cost is None else 0.8 * self._cost + 0.2 * cost
        interval = self.min_interval
        if self._cost is not None:
            budget = self.remote_cpu_budget if run.workers > 1 else self.cpu_budget
            interval = min(self.max_interval, max(interval, self._cost / budget))
        self._next = time.monotonic() + interval

    def _finish(self, view: _RunView) -> None:
        view.ingest()
        view.series.finish()
        if self.live:
            view.draw(final=True)

    def _guard(self, fn: Any, *args: Any) -> Any:
        if self.failed:
            return None
        try:
            return fn(*args)
        except Exception as err:
            self._fail(err)
            return None

    def _fail(self, err: BaseException) -> None:
        if self.failed:
            return
        self.failed = f"{type(err).__name__}: {err}"
        warnings.warn(
            f"nbdist: the dashboard stopped drawing ({self.failed}). Training goes on; every "
            "number is still recorded in nbdist.runs[-1].",
            RuntimeWarning, stacklevel=3,
        )

    @property
    def stragglers(self) -> list[str]:
        """Labels of the replicas/workers flagged as stragglers in the current run."""
        view = self._current()
        return [view.series.label(s.key) for s in view.series.stragglers()] if view else []


class _RunView:
    """The widgets of one Run: header, progress bar, Stop button, figure."""

    def __init__(self, run: Run, owner: Dashboard):
        self.run, self.owner = run, owner
        traces = 4 * run.replicas * run.workers + 4
        per_trace = min(owner.max_points, max(250, owner.max_total_points // traces))
        self.series = RunSeries(
            replicas=run.replicas, workers=run.workers, max_points=per_trace,
            straggler_factor=owner.straggler_factor, straggler_min_ms=owner.straggler_min_ms,
        )
        self.model = FigureModel(self.series)
        self.n_rows = 0
        self.fig: Any = None
        self.box: Any = None
        self.stop: StopSignal | None = None
        self._header = ""
        self._header_due = 0.0

    def ingest(self) -> None:
        rows = self.run.rows_since(self.n_rows)
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
                _send_restyle(self.fig, restyle, idx)
            marks = self.model.marks_change()
            if marks is not None:
                _send_restyle(self.fig, *marks)
        now = time.monotonic()
        if final or now >= self._header_due:
            self._header_due = now + self.owner.header_interval
            self._update_header(final)
        if final:
            # Saved widget state (nbclient, "Save widget state") holds the final figure.
            keep_in_saved_state(self.fig)

    def _build(self) -> None:
        import ipywidgets as w
        import plotly.graph_objects as go
        from IPython.display import display

        self.model.title = run_title(self.run, self.series, final=False)
        self.fig = go.FigureWidget(figure_dict(self.model))
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
        self.stop = StopSignal(self.button, self.owner.kernel, self.owner.stop_mode)
        if self.stop.mode == "off":
            self.button.disabled = True
            self.button.tooltip = ("This kernel cannot receive a click while the cell runs: "
                                   "use Kernel > Interrupt (the partial Run is kept).")
        display(self.box)

    def _update_header(self, final: bool) -> None:
        run, s = self.run, self.series
        done, total = s.last_step + 1, run.total_steps
        rate = s.steps_per_second()
        parts = [f"step {done}{f'/{total}' if total else ''}", f"epoch {s.last_epoch + 1}"]
        if final:
            avg = done / run.duration if run.duration > 0 else math.nan
            parts.append(f"{run.status}")
            if math.isfinite(avg):
                parts.append(f"{avg:.1f} steps/s overall")
        elif math.isfinite(rate):
            parts.append(f"{rate:.1f} steps/s")
            if total and rate > 0:
                parts.append(f"ETA {_duration((total - done) / rate)}")
        bw = s.bus_bandwidth(run.allreduce_bytes)
        if math.isfinite(bw):
            parts.append(f"bus bw {bw / 1e9:.3g} GB/s")
        who = (f"<b>Run {run.id}</b> · {html.escape(run.strategy)} · {run.replicas} "
               f"replica{'s' if run.replicas != 1 else ''} · {run.workers} "
               f"worker{'s' if run.workers != 1 else ''}")
        text = f"{who} — {' · '.join(parts)}"
        if text != self._header:
            self._header = text
            self.header.value = text
        self.progress.value = min(done, self.progress.max)
        notes = [f"⚠ straggler: {html.escape(s.label(x.key))} ({x.value_ms:.3g} ms, "
                 f"{x.ratio:.1f}× the others' median)" for x in s.stragglers()]
        note_html = ("<span style='color:#b00'>" + "; ".join(notes) + "</span>") if notes else ""
        if note_html != self.notes.value:
            self.notes.value = note_html
        if final:
            self.progress.bar_style = _DONE_STYLE.get(run.status, "")
            self.button.disabled = True
            self.button.description = run.status.capitalize()
        elif self.stop is not None and self.stop.event.is_set():
            self.button.description = "Stopping…"
            self.button.disabled = True


def _send_restyle(fig: Any, restyle: dict[str, list[Any]], indices: list[int]) -> None:
    """Set trace properties and send them to the frontend in one ``Plotly.update``.

    ``hooks.plotly.send_restyle`` sends what ``fig.plotly_update`` would, without its
    per-trace validation and comparison (~0.25 ms per trace: with 32 replicas x 4 panels, 30
    ms a redraw) and in 2 comm messages instead of 4. The values are float64 arrays and label
    lists built here, so there is nothing to validate. Falls back to ``plotly_update`` if
    plotly's internals differ.
    """
    if can_send_restyle(fig):
        send_restyle(fig, restyle, indices)
    else:
        fig.plotly_update(restyle_data=restyle, trace_indexes=indices)


def observer_for(shell: Any, **settings: Any) -> Any:
    """The run observer for a ``%%distribute`` cell: a Dashboard, or the plain progress line
    when plotly's widget cannot be used (ipywidgets/anywidget missing)."""
    if _has_frontend(shell):
        try:
            import anywidget  # noqa: F401
            import ipywidgets  # noqa: F401
        except ImportError as err:
            from .progress import ProgressLine

            warnings.warn(f"nbdist: no live dashboard ({err}); `pip install anywidget "
                          "ipywidgets` to get it.", RuntimeWarning, stacklevel=2)
            return ProgressLine(shell)
    return Dashboard(shell, **settings)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


def _display_summary(run: Run) -> None:
    from IPython.display import display

    text = run.summary()
    display({"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}, raw=True)


def _display_static(run: Run) -> None:
    """No widget frontend: a static plotly figure (HTML, plotly.js from its CDN) + summary."""
    import json

    from IPython.display import display

    text = run.summary()
    bundle = {"text/plain": text, "text/html": f"<pre>{html.escape(text)}</pre>"}
    if run.n_rows:
        fig = static_figure(run)
        bundle["text/html"] = (fig.to_html(include_plotlyjs="cdn", full_html=False)
                               + bundle["text/html"])
        bundle["application/vnd.plotly.v1+json"] = json.loads(fig.to_json())
    display(bundle, raw=True)


_prewarmed = threading.Event()


def _prewarm() -> None:
    """Import plotly's widget machinery (~3 s cold) while the first step is being traced."""
    if _prewarmed.is_set():
        return
    _prewarmed.set()

    def work() -> None:
        try:
            import ipywidgets  # noqa: F401
            import plotly.graph_objects as go
            from plotly.subplots import make_subplots  # noqa: F401

            go.FigureWidget  # noqa: B018 - triggers the lazy import
        except Exception:  # noqa: S110 - the real import reports problems
            pass

    threading.Thread(target=work, name="nbdist-prewarm", daemon=True).start()
