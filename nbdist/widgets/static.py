"""The finished dashboard as a static output: readable without a kernel or widget JavaScript.

``static_bundle(run)`` is one display bundle with one picture: the figure as SVG (GitHub,
nbviewer, nbconvert's HTML, VS Code: no script runs there), drawn at the page's width, the
same figure as plotly JSON under nbdist's own MIME type (``FIGURE_MIME``), which nbdist's
JupyterLab extension draws with plotly.js (hover, zoom) in JupyterLab and Notebook 7, and a
text line. Not plotly's MIME type: plotly's JupyterLab renderer stores a PNG of every figure it
draws into the notebook (a third copy, ~200 kB a dashboard). The figure keeps at most
``max_points`` points per trace (``max_total_points`` over all traces, float32): a finished
dashboard stays under 100 kB. ``nbdist.runs[i].plot()`` redraws a Run at full resolution.
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import numpy as np

from ..telemetry.run import Run
from .aggregate import AGGREGATE_ABOVE
from .figure import plotly_json, run_figure, run_title, series_of
from .panels import PLOTLY_CONFIG
from .svgplot import figure_svg

__all__ = ["FIGURE_MIME", "PLOTLY_MIME", "figure_bundle", "plot_figure", "static_bundle"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
#: plotly's figure JSON, drawn by nbdist's JupyterLab extension (``labextension/src/figure.ts``)
FIGURE_MIME = "application/vnd.nbdist.figure.v1+json"


def static_bundle(run: Run, max_points: int = 250, max_total_points: int = 4000,
                  smoothing: float = 0.0) -> dict[str, Any]:
    """``{FIGURE_MIME: plotly JSON, image/svg+xml, text/plain}`` for the finished ``run``;
    ``smoothing`` as the live figure's slider had it (``figure.run_figure``)."""
    if not run.n_rows:
        return {"text/plain": run_title(run, series_of(run))}
    keys = run.replicas * run.workers
    traces = (4 * keys + 4 if keys <= AGGREGATE_ABOVE else 30) * (2 if smoothing else 1)
    per_trace = min(max_points, max(50, max_total_points // traces))
    fig = run_figure(run, max_points=per_trace, smoothing=smoothing)
    return figure_bundle(fig, "the dashboard's final figure; the Run in nbdist.runs keeps "
                              "every number, its .plot() redraws it")


def figure_bundle(fig: dict[str, Any], what: str) -> dict[str, Any]:
    """A figure dict (numpy arrays) as a display bundle with one picture: SVG, the plotly JSON
    for nbdist's renderer, and the title with ``what`` it is as text."""
    title = fig["layout"]["title"]["text"]
    return {
        FIGURE_MIME: {**_typed_json(fig), "config": PLOTLY_CONFIG},
        "image/svg+xml": figure_svg(fig),
        "text/plain": f"{title} ({what})",
    }


def plot_figure(run: Run, **options: Any) -> Any:
    """``run.plot()``: a plotly ``Figure`` of ``run`` (``figure.run_figure``'s options), shown
    in a notebook as ``figure_bundle`` shows it (SVG, and plotly.js where nbdist's extension
    is), so no PNG copy of it is saved; ``.show()`` and ``.write_html()`` work as usual."""
    return _run_figure_class()(run_figure(run, **options))


@functools.cache
def _run_figure_class() -> type:
    import plotly.graph_objects as go

    class Figure(go.Figure):   # plotly's name: what users see of it is plotly's Figure
        """A plotly Figure of a Run, displayed with one static picture (see ``plot_figure``)."""

        def _repr_mimebundle_(self, include: Any = None, exclude: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
            fig = self.to_dict()       # arrays come back as plotly's typed-array dicts
            data = [{k: _unbdata(v) for k, v in t.items()} for t in fig["data"]]
            layout = fig["layout"]
            layout.setdefault("title", {}).setdefault("text", "")
            return figure_bundle({"data": data, "layout": layout},
                                 "a plotly Figure: nbdist.runs[i].plot()")

        def show(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("config", PLOTLY_CONFIG)   # no "Share chart" upload button
            return super().show(*args, **kwargs)

        def write_html(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("config", PLOTLY_CONFIG)
            return super().write_html(*args, **kwargs)

        def _ipython_display_(self) -> None:     # plotly's own goes through its renderers
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)

    return Figure


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


def _unbdata(value: Any) -> Any:
    """plotly's typed-array dict (``Figure.to_dict``) as a numpy array; other values as is."""
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        if shape:              # a heatmap's z: "rows, columns"
            out = out.reshape([int(n) for n in str(shape).split(",")])
        return out
    return value


@functools.cache
def _template(name: str) -> dict[str, Any]:
    import json

    import plotly.io as pio

    return json.loads(pio.json.to_json_plotly(pio.templates[name]))
