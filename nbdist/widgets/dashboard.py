"""The live training dashboard: a view of a Run, drawn under the ``%%distribute`` cell.

``Dashboard`` is a run observer (``on_step(run)``, ``should_stop()``, ``close()``) called by the
runner on the kernel's main thread between steps. It redraws at most every ``min_interval``
seconds (and less often if a redraw costs more than ``cpu_budget`` of the wall time), sends
only the traces that changed in one ``plotly_update`` message of float64 arrays (binary
buffers), and keeps every trace to ``max_points`` points; the Run keeps the full data.

With a widget frontend each Run gets a ``RunView`` (``run_view``: header, progress bar, Stop
button and ``LiveFigure``); the Dashboard decides when they redraw, and when the run ends they
give way to a static figure (plotly JSON + SVG, see ``static``) and the text summary. Without
a widget frontend (terminal IPython): the summary when the run ends, and the static figure only
where the shell has a renderer for it (``InteractiveShell.mime_renderers``).
A failure while drawing never stops training: it is reported once and drawing stops.

A page that connects while the run goes on (a reload, a second tab) gets widgets of its own:
nbdist's JupyterLab extension asks over the lab channel (``request_view``, called on the
kernel's shell-channel thread: the main thread is running the cell), the next redraw builds
them (``RunView.add_view``; widgets are made on the main thread only) and answers with their
bundle and the running cell, where the extension shows them. Such a page never sees the
kernel's own outputs of this cell (they belong to the page that ran it), so when the run ends
it also gets the final figure and the summary over the channel (``final_message``).
"""

from __future__ import annotations

import collections
import html
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ..displayguard import DisplayGuard
from ..telemetry.run import Run, RunObserver
from .progress import draws_figures, has_frontend
from .run_view import RunView
from .static import static_bundle

__all__ = ["Dashboard", "observer_for"]

class Dashboard(RunObserver):
    """Draws every Run of one cell. Settings are class attributes (change them to configure
    all dashboards) or keyword arguments."""

    max_points: int = 2000          # per trace
    max_total_points: int = 40_000  # all traces together (many replicas: fewer points each)
    min_interval: float = 0.1       # seconds between redraws (at most ~10/s)
    cpu_budget: float = 0.01        # redraws may use at most this fraction of the wall time
    remote_cpu_budget: float = 0.10  # ... when the steps run in worker processes, not here
    max_interval: float = 2.0       # ... but the view is never older than this (seconds)
    stop_mode: str = "auto"         # see nbdist.widgets.stopper
    stall_after: float = 5.0        # the header says "no new step for N s" after this (s)
    picture_every: float = 5.0      # s between refreshes of the picture a mid-run save keeps

    def __init__(self, shell: Any = None, *, live: bool | None = None, **settings: Any):
        for name, value in settings.items():
            if not hasattr(Dashboard, name) or name.startswith("_"):
                raise TypeError(f"Dashboard got an unknown setting {name!r}")
            setattr(self, name, value)
        self.shell = shell
        self.live = has_frontend(shell) if live is None else live
        self.kernel = getattr(shell, "kernel", None)
        self.runs: list[Run] = []
        self.views: dict[int, RunView] = {}
        self.redraws = 0
        self.redraw_seconds = 0.0     # total, including building the widgets
        self.build_seconds = 0.0
        self.failed: str | None = None
        self._display = DisplayGuard(logging.getLogger(__name__))
        self._next = 0.0
        self._cost: float | None = None     # moving average of a redraw's cost (s)
        # (token, reply) of the views pages asked for, appended on the shell-channel thread
        self._requests: collections.deque[tuple[str, Reply]] = collections.deque()
        self._replies: dict[int, list[Reply]] = {}   # run id -> who got a view of it
        self._cell = _running_cell(self.kernel)
        if self.live:
            _prewarm()

    def request_view(self, token: str, reply: Reply) -> None:
        """A page asks for a view of the live run: answered by ``reply(message)`` after the
        next redraw (``view_message``), or when the cell ends without a live view
        (``{"type": "dashboard", "token": token, "run": None}``). Safe from any thread."""
        self._requests.append((token, reply))

    # -- observer interface ----------------------------------------------------------------
    def on_step(self, run: Run) -> None:
        if not self.runs or self.runs[-1] is not run:
            if all(r is not run for r in self.runs):
                self.runs.append(run)
        elif time.monotonic() < self._next and not self._requests:
            return
        if self.live:       # headless: everything is drawn from the Run when it ends
            self._guard(self._redraw, run)
            if self._requests:
                self._guard(self._serve_views, run)

    def _serve_views(self, run: Run) -> None:
        view = self.views.get(run.id)
        if view is None or view.fig is None:
            return                  # nothing drawn yet: served by a later redraw
        while self._requests:
            token, reply = self._requests.popleft()
            reply(view_message(token, run, view.add_view(), self._cell))
            replies = self._replies.setdefault(run.id, [])
            if reply not in replies:
                replies.append(reply)

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
        """The cell ended: last redraw, final header, then the widgets give way to a static
        figure (``static.static_bundle``) and the text summary."""
        while self._requests:      # no live run left to show
            token, reply = self._requests.popleft()
            self._tell(reply, {"type": "dashboard", "token": token, "run": None})
        for run in self.runs:
            view = self.views.get(run.id)
            if view is not None:
                if view.stop is not None:
                    self._guard(view.stop.close)
                self._guard(self._finish, view)
            if self.live:
                self._leave_static(run, view)
                _display_summary(run)
            elif self.shell is None:
                print(run.summary())
            else:
                try:
                    _display_static(run, self.shell)
                except Exception as err:
                    self._fail(err)
                    print(run.summary())

    def _leave_static(self, run: Run, view: RunView | None) -> None:
        """Replace the live widgets by the final figure, even after a drawing failure (a
        widget left in a saved notebook shows "model not found" without its kernel)."""
        if view is None or view.box is None:
            return
        try:
            bundle = static_bundle(run, smoothing=view.smoothing())
        except Exception as err:
            self._fail(err)
            bundle = {"text/plain": run.summary()}
        if view.extra:      # before their widgets close: the pages swap them for the figure
            # their page shows none of the cell's own outputs: the summary keeps the error
            message = final_message(run, view.extra_ids(), bundle,
                                    _summary_bundle(run.summary()))
            for reply in self._replies.get(run.id, []):
                self._tell(reply, message)
        view.leave_static(bundle)

    # -- drawing ---------------------------------------------------------------------------
    def _current(self) -> RunView | None:
        return self.views.get(self.runs[-1].id) if self.runs else None

    def _redraw(self, run: Run) -> None:
        start = time.perf_counter()
        view = self.views.get(run.id)
        first = view is None or view.fig is None
        if view is None:
            view = self.views[run.id] = RunView(run, self)
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

    def _finish(self, view: RunView) -> None:
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

    def _tell(self, reply: Reply, message: dict[str, Any]) -> None:
        """Send a page its message, even after a drawing failure (it waits for it)."""
        try:
            reply(message)
        except Exception as err:
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        if self.failed:
            return
        self.failed = f"{type(err).__name__}: {err}"
        self._display.report("drawing", err, (
            "nbdist: the dashboard stopped drawing ({error}). Training goes on; every number is "
            "still recorded in nbdist.runs[-1]."))

    @property
    def stragglers(self) -> list[str]:
        """Labels of the current run's stragglers (``Run.stragglers``)."""
        view = self._current()
        return [s.label for s in view.run.stragglers()] if view else []


def observer_for(shell: Any, **settings: Any) -> Any:
    """The run observer for a ``%%distribute`` cell: a Dashboard, or the plain progress line
    when plotly's widget cannot be used (ipywidgets/anywidget missing)."""
    if has_frontend(shell):
        try:
            import anywidget  # noqa: F401
            import ipywidgets  # noqa: F401
        except ImportError as err:
            from .progress import ProgressLine

            warnings.warn(f"nbdist: no live dashboard ({err}); `pip install anywidget "
                          "ipywidgets` to get it.", RuntimeWarning, stacklevel=2)
            return ProgressLine(shell)
    return Dashboard(shell, **settings)


def _summary(run: Run) -> str:
    """The run's summary. The error of a failed or interrupted run is the cell's own error,
    shown right below it: the summary points at it instead of repeating it."""
    text = run.summary()
    if run.error and run.status in ("failed", "interrupted"):
        text = text.replace(f"  error: {run.error}", "  error: the cell's error, below", 1)
    return text


def _summary_bundle(text: str) -> dict[str, Any]:
    """The summary as text and HTML. JupyterLab breaks output text anywhere (``word-break:
    break-all``): the HTML breaks at spaces only, and never between a name and its number
    ("step_ms 1.20" stays whole)."""
    glued = re.sub(r"(\S+ -?\d\S*)", r"<span style='white-space:nowrap'>\1</span>",
                   html.escape(text))
    return {"text/plain": text, "text/html": "<pre style='word-break:normal;"
                                             f"overflow-wrap:normal'>{glued}</pre>"}


def _display_summary(run: Run) -> None:
    from IPython.display import display

    display(_summary_bundle(_summary(run)), raw=True)


#: How a view of the live run is sent to the page that asked (``request_view``).
Reply = Callable[[dict[str, Any]], None]


def view_message(token: str, run: Run, bundle: dict[str, Any],
                 cell: dict[str, Any]) -> dict[str, Any]:
    """The answer to a page's request for a view: the bundle to show, and the cell that runs
    (its id as the page that ran it knows it, and its code, for a page whose cell ids differ;
    labextension/src/recover.ts)."""
    return {"type": "dashboard", "token": token, "run": run.id, "bundle": bundle, "cell": cell}


def final_message(run: Run, views: list[str], figure: dict[str, Any],
                  summary: dict[str, Any]) -> dict[str, Any]:
    """What replaces the views ``views`` (widget model ids) when the run ends: the final
    figure's bundle, then the summary's."""
    return {"type": "final", "run": run.id, "views": views, "figure": figure,
            "summary": summary}


def _running_cell(kernel: Any) -> dict[str, Any]:
    """The cell being run, from the request that runs it: JupyterLab puts the cell's id in
    the request's metadata; the code is the cell's text."""
    try:
        parent = kernel.get_parent() if kernel is not None else {}
    except Exception:   # not an ipykernel kernel: the page falls back to nothing
        parent = {}
    cell_id = (parent.get("metadata") or {}).get("cellId")
    code = (parent.get("content") or {}).get("code")
    return {"id": cell_id if isinstance(cell_id, str) else None,
            "code": code if isinstance(code, str) else None}


def _display_static(run: Run, shell: Any) -> None:
    """No widget frontend (terminal IPython): the summary, after the static figure if the
    shell can show one. A terminal prints only text/plain, and IPython (9.x) keeps every
    displayed bundle in ``history_manager.outputs`` for the session: a figure nobody sees
    would keep ~45 kB per run (and cost the time to draw it)."""
    from IPython.display import display

    if draws_figures(shell):
        display(static_bundle(run), raw=True)
        _display_summary(run)
        return
    display({"text/plain": f"{_summary(run)}\n  (the Run in nbdist.runs keeps every number; "
                           "its .plot() draws the dashboard's figure)"}, raw=True)


_prewarmed = threading.Event()


def _prewarm() -> None:
    """Import the widget machinery and plotly (~3 s cold) while the first step is traced."""
    if _prewarmed.is_set():
        return
    _prewarmed.set()

    def work() -> None:
        try:
            import anywidget  # noqa: F401
            import ipywidgets  # noqa: F401
            import plotly.io  # noqa: F401
            from plotly.subplots import make_subplots  # noqa: F401
        except Exception:  # noqa: S110 - the real import reports problems
            pass

    threading.Thread(target=work, name="nbdist-prewarm", daemon=True).start()
