"""The finished dashboard as a static output: readable without a kernel or widget JavaScript.

``static_bundle(run)`` is one display bundle: plotly's JSON mimetype (interactive where
plotly's renderer is installed: JupyterLab, Notebook 7, VS Code), the same figure as plain
SVG (GitHub, nbviewer, nbconvert: no script runs there) and a text line. The figure keeps at
most ``max_points`` points per trace (``max_total_points`` over all traces, float32): ten
dashboards in a notebook stay well under 2 MB. ``nbdist.runs[i].plot()`` redraws a Run at
full resolution.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import numpy as np

from ..telemetry.run import Run
from .aggregate import AGGREGATE_ABOVE
from .figure import plotly_json, run_figure, run_title, series_of
from .svgplot import figure_svg

__all__ = ["static_bundle"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def static_bundle(run: Run, max_points: int = 250, max_total_points: int = 4000,
                  smoothing: float = 0.0) -> dict[str, Any]:
    """``{plotly JSON, image/svg+xml, text/plain}`` for the finished ``run``; ``smoothing``
    as the live figure's slider had it (``figure.run_figure``)."""
    if not run.n_rows:
        return {"text/plain": run_title(run, series_of(run))}
    keys = run.replicas * run.workers
    traces = (4 * keys + 4 if keys <= AGGREGATE_ABOVE else 30) * (2 if smoothing else 1)
    per_trace = min(max_points, max(50, max_total_points // traces))
    fig = run_figure(run, max_points=per_trace, smoothing=smoothing)
    title = fig["layout"]["title"]["text"]
    return {
        PLOTLY_MIME: _typed_json(fig),
        "image/svg+xml": figure_svg(fig),
        "text/plain": f"{title} (the dashboard's final figure; the Run in nbdist.runs "
                      "keeps every number, its .plot() redraws it)",
    }


def _typed_json(fig: dict[str, Any]) -> dict[str, Any]:
    """The figure as JSON data for plotly's mimetype: arrays as float32 base64 typed arrays
    (``bdata``, read by plotly.js as they are), the template's name resolved to its
    definition (plotly.js knows no names): one dict shared by every bundle, as IPython keeps
    each displayed bundle in its history. No validation pass through ``go.Figure``: it took
    seconds on a big run's figure, whose dicts the live figure already sends as they are."""
    data = [{k: _bdata(v) if isinstance(v, np.ndarray) else v for k, v in t.items()}
            for t in fig["data"]]
    template = fig["layout"].get("template")
    layout = {k: v for k, v in fig["layout"].items() if k != "template"}
    out = plotly_json({"data": data, "layout": layout})
    if isinstance(template, str):
        out["layout"]["template"] = _template(template)
    return out


def _bdata(values: np.ndarray) -> dict[str, str]:
    return {"dtype": "f4", "bdata": base64.b64encode(
        np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")}


@functools.cache
def _template(name: str) -> dict[str, Any]:
    import json

    import plotly.io as pio

    return json.loads(pio.json.to_json_plotly(pio.templates[name]))
