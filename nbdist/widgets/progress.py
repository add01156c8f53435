"""A one-line progress display under the cell, and the run's summary when it ends."""

from __future__ import annotations

import html
import time
from typing import Any

from ..telemetry.run import Run, RunObserver
from .header import epoch_text, format_duration

_MIN_INTERVAL_S = 0.5


class ProgressLine(RunObserver):
    """Updates an HTML progress bar in a notebook; in a terminal, prints only the summary."""

    def __init__(self, shell: Any):
        self.live = has_frontend(shell)
        self.handle: Any = None
        self.last_update = 0.0
        self.runs: list[Run] = []

    def on_step(self, run: Run) -> None:
        if run not in self.runs:
            self.runs.append(run)
        now = time.monotonic()
        if not self.live or now - self.last_update < _MIN_INTERVAL_S:
            return
        self.last_update = now
        self._show(_progress_html(run))

    def should_stop(self) -> bool:
        return False

    def close(self) -> None:
        for run in self.runs:
            if self.live:
                self._show(f"<pre>{html.escape(run.summary())}</pre>")
                self.handle = None
            else:
                print(run.summary())

    def _show(self, markup: str) -> None:
        from IPython.display import HTML, display

        if self.handle is None:
            self.handle = display(HTML(markup), display_id=True)
        else:
            self.handle.update(HTML(markup))


def _progress_html(run: Run) -> str:
    done, total = run.steps_done, run.total_steps
    last = run.last
    frac = min(1.0, done / total) if total else None
    bar = (f'<progress value="{done}" max="{total}" style="width:12em"></progress> '
           if frac is not None else "")
    rate = done / run.duration if run.duration > 0 else 0.0
    left = (f" · {format_duration((total - done) / rate)} left"
            if total and rate > 0 and total > done else "")
    loss = last.get("global_loss", float("nan"))
    return (f"<div>{bar}step {done}{f'/{total}' if total else ''} · "
            f"{epoch_text(last.get('epoch', 0), run.epochs)} · loss {loss:.4g} · "
            f"{rate:.1f} steps/s{left}</div>")


def has_frontend(shell: Any) -> bool:
    """True in a Jupyter kernel (display updates reach a browser), False in a terminal."""
    return shell is not None and getattr(shell, "kernel", None) is not None


def draws_figures(shell: Any) -> bool:
    """Whether the dashboard's figures reach anyone: a Jupyter kernel's frontend, or a terminal
    shell with a renderer for SVG or plotly (``InteractiveShell.mime_renderers``)."""
    renderers = getattr(shell, "mime_renderers", None) or {}
    return has_frontend(shell) or bool(
        renderers.keys() & {"application/vnd.nbdist.figure.v1+json", "image/svg+xml"})
