"""The figures' own controls, as TensorBoard's scalars page has them: smoothing, the x axis
(step, relative time, wall time) and a log or linear y axis.

They are plotly's layout controls (``layout.sliders``, ``layout.updatemenus``) carrying what
they change, so they work wherever plotly.js draws the figure, with no kernel: nbdist's
JupyterLab renderer, the live figure, ``Figure.show()``, ``.write_html()``. A slider step
restyles the lines' y values with the smoothed values it carries (float32, base64: plotly.js
decodes typed arrays given to ``restyle``); an x axis button restyles every trace's x and
relayouts the axis. Carrying values costs their size, so ``nbdist.compare`` (a few lines) has
the slider and x buttons, and a dashboard's many lines get them from nbdist's renderer instead
(``labextension/src/figurecontrols.ts``); every figure has the linear / log buttons. The
static SVG shows the figure as drawn, without controls.
"""

from __future__ import annotations

import base64
import math
import time
from typing import Any

import numpy as np

__all__ = ["SMOOTHING_LEVELS", "X_MODES", "ema", "scale_menu", "smoothed", "smoothing_slider",
           "wall_ms", "x_menu"]

#: The smoothing slider's stops (TensorBoard's default weight is 0.6).
SMOOTHING_LEVELS = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)
#: x axis modes: their button label and the axis they need.
X_MODES = {"step": ("step", "linear"), "time": ("relative time", "linear"),
           "wall": ("wall time", "date")}
FAINT = 0.2   # the raw line's opacity under its smoothed line, as TensorBoard draws it


def ema(y: np.ndarray, weight: float) -> np.ndarray:
    """TensorBoard's smoothing: a debiased exponential moving average (NaN points skipped)."""
    out = np.full(len(y), math.nan)
    last, n = 0.0, 0
    for i, v in enumerate(np.asarray(y, dtype=np.float64).tolist()):
        if math.isfinite(v):
            n += 1
            last = last * weight + (1 - weight) * v
            out[i] = float(f"{last / (1 - weight ** n):.12g}")   # a flat line stays flat
    return out


def is_line(trace: dict[str, Any]) -> bool:
    return trace.get("mode") == "lines" and trace.get("type", "scatter") == "scatter"


def smoothed(traces: list[dict[str, Any]], weight: float, always: bool = False
             ) -> list[dict[str, Any]]:
    """``traces`` with each line's values smoothed, and its raw values drawn faint after all
    of them (no legend entry, no hover; in its legend group, so it hides with its line), as
    the live figure's smoothing slider does. ``always``: the faint copies also at weight 0
    (a slider may smooth later)."""
    if not weight and not always:
        return traces
    out, faint = [], []
    for t in traces:
        if not is_line(t):
            out.append(t)
            continue
        y = np.asarray(t.get("y", np.empty(0)), dtype=np.float64)
        out.append({**t, "y": ema(y, weight) if weight else y})
        faint.append({**t, "opacity": FAINT, "hoverinfo": "skip", "showlegend": False})
    return out + faint


def _typed(values: np.ndarray) -> dict[str, str]:
    """A float32 typed-array spec, which plotly.js decodes wherever it takes data."""
    return {"dtype": "f4", "bdata": base64.b64encode(
        np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")}


def smoothing_slider(raw: dict[int, np.ndarray], weight: float, y: float = 0.0
                     ) -> dict[str, Any]:
    """A slider over ``SMOOTHING_LEVELS`` (and ``weight``, the one drawn) restyling the lines
    ``raw`` maps (trace index -> raw values) to their smoothed values."""
    levels = sorted({*SMOOTHING_LEVELS, float(weight)})
    indices = list(raw)
    steps = [{"label": f"{w:g}", "method": "restyle",
              "args": [{"y": [_typed(ema(raw[i], w) if w else raw[i]) for i in indices]},
                       indices]} for w in levels]
    return {"name": "smoothing", "active": levels.index(float(weight)), "steps": steps,
            "x": 0.55, "xanchor": "left", "len": 0.45, "y": y, "yanchor": "top",
            "pad": {"t": 34, "b": 0}, "ticklen": 3, "font": {"size": 10},
            "currentvalue": {"prefix": "smoothing ", "font": {"size": 11},
                             "xanchor": "left"}}


def wall_ms(seconds: np.ndarray) -> np.ndarray:
    """Wall times (seconds since the epoch) as the milliseconds a plotly date axis reads,
    shifted so that it shows the local clock (plotly's dates have no time zone)."""
    if not len(seconds):
        return seconds
    return (seconds + time.localtime(float(seconds[0])).tm_gmtoff) * 1000.0


def x_menu(xs: dict[str, list[Any]], active: str, x: float = 0.0, y: float = 1.0
           ) -> dict[str, Any]:
    """Buttons that draw every trace against another x: ``xs`` maps each mode of
    ``X_MODES`` to the x values of every trace, in trace order."""
    modes = [m for m in X_MODES if m in xs]
    buttons = []
    for mode in modes:
        label, kind = X_MODES[mode]
        title = {"step": "step", "time": "seconds since the run started",
                 "wall": "wall time"}[mode]
        buttons.append({
            "label": label, "method": "update",
            "args": [{"x": [_typed(np.asarray(v, dtype=np.float64)) for v in xs[mode]]},
                     {"xaxis.type": kind, "xaxis.title.text": title,
                      "xaxis.autorange": True, "xaxis.tickformat": "" if kind == "date"
                      else ",~g", "xaxis.hoverformat": "" if mode != "step" else ",.0f"}]})
    return {"name": "x axis", "type": "buttons", "direction": "right", "showactive": True,
            "active": modes.index(active), "buttons": buttons, "x": x, "xanchor": "left",
            "y": y, "yanchor": "bottom", "pad": {"b": 2}, "font": {"size": 10}}


def scale_menu(axis: str, label: str, log: bool, x: float = 1.0, y: float = 1.0
               ) -> dict[str, Any]:
    """linear / log buttons for the y axis ``axis`` ("yaxis", "yaxis2"...), ``label`` on the
    first."""
    return {"name": f"scale:{axis}", "type": "buttons", "direction": "right",
            "showactive": True, "active": 1 if log else 0, "x": x, "xanchor": "right",
            "y": y, "yanchor": "bottom", "pad": {"b": 2}, "font": {"size": 10},
            "buttons": [
                {"label": f"{label}linear", "method": "relayout",
                 "args": [{f"{axis}.type": "linear", f"{axis}.dtick": None}]},
                {"label": "log", "method": "relayout",
                 "args": [{f"{axis}.type": "log", f"{axis}.dtick": "D2"}]}]}
