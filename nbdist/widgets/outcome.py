"""How a run ended, drawn on its curves: a marker where it failed, was interrupted or stopped.

A run that ends early (a worker died, an exception, a non-finite loss, Kernel > Interrupt, the
Stop button) gets a marker on the loss panel at its last step, in the header's words and
colours (``header.OUTCOMES``), named in the legend, with the reason in a line of its own under
the figure's title (``Run.error``'s first sentence; the loss panel's title would run under the
loss toggle) and in the marker's hover text. Legend and title are drawn
by every renderer (plotly.js and the SVG of ``svgplot``), so a saved notebook says it too.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np

from ..telemetry.run import Run
from .header import OUTCOMES
from .panels import add_note

__all__ = ["mark_outcome", "reason"]

_MARKED = ("failed", "interrupted", "stopped")
_SYMBOL = {"failed": "x", "interrupted": "square", "stopped": "square"}
_REASON_CHARS = 90


def reason(run: Run) -> str:
    """The first sentence of the run's error, at most ``_REASON_CHARS`` long ("" if none)."""
    text = " ".join((run.error or "").split())
    first = text.split(". ", 1)[0].rstrip(".")
    return first if len(first) <= _REASON_CHARS else first[:_REASON_CHARS - 1] + "…"


def mark_outcome(fig: dict[str, Any], run: Run) -> None:
    """Add the marker of ``run``'s end to ``fig`` (a figure dict of ``figure.run_figure``)."""
    if run.status not in _MARKED:
        return
    end = _last_point(fig)
    if end is None:
        return
    text, colour = OUTCOMES[run.status]
    step = int(round(end[0])) + 1          # steps counted from 1 where users read them
    name = f"{text} at step {step}"
    why = reason(run)
    fig["data"].append({
        "type": "scatter", "mode": "markers", "name": name, "xaxis": "x", "yaxis": "y",
        "x": np.array([end[0]]), "y": np.array([end[1]]),
        "marker": {"symbol": _SYMBOL[run.status], "size": 14, "color": colour,
                   "line": {"width": 3, "color": colour}},
        "text": [f"{name}: {why}" if why else name], "hoverinfo": "text", "legendrank": 1,
    })
    add_note(fig["layout"], f"<span style='color:{colour}'><b>{html.escape(name)}</b>"
                            + (f": {html.escape(why)}" if why else "") + "</span>")


def _last_point(fig: dict[str, Any]) -> tuple[float, float] | None:
    """The last finite point of the loss panel's thickest line (the global loss)."""
    best: tuple[float, int, float, float] | None = None
    for t in fig["data"]:
        if t.get("yaxis", "y") != "y" or t.get("mode") != "lines" or t.get("opacity", 1) < 0.5:
            continue
        x = np.asarray(t.get("x", ()), dtype=np.float64)
        y = np.asarray(t.get("y", ()), dtype=np.float64)
        n = min(len(x), len(y))
        ok = np.flatnonzero(np.isfinite(x[:n]) & np.isfinite(y[:n]))
        if not len(ok):
            continue
        width = float((t.get("line") or {}).get("width", 1))
        key = (width, int(x[ok[-1]]), float(x[ok[-1]]), float(y[ok[-1]]))
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else (best[2], best[3])
