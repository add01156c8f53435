"""The dashboard's plotly figure: four panels drawn from a ``RunSeries``.

``FigureModel`` owns the mapping from series to trace indices, so the live dashboard can send
only the traces that changed in one ``plotly_update`` message, and ``static_figure`` draws a
finished Run with the same code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .series import RunSeries

if TYPE_CHECKING:
    from ..telemetry.run import Run

# (metric, row, col, panel title)
PANELS = (
    ("loss", 1, 1, "loss"),
    ("grad_norm", 1, 2, "gradient norm"),
    ("allreduce_ms", 2, 1, "allreduce (ms)"),
    ("time", 2, 2, "compute time per replica (ms)"),
)
_AXIS = {"loss": ("x", "y"), "grad_norm": ("x2", "y2"), "allreduce_ms": ("x3", "y3"),
         "time": ("x4", "y4")}
_GLOBAL = {"loss": ("loss", "mean of replicas"),              # series -> (panel, label)
           "allreduce_ms": ("allreduce_ms", "slowest replica"),
           "step_ms": ("time", "host step time"),
           # drawn once a step has some (SyncBatchNormalization...): not a line in every run
           "other_collective_ms": ("allreduce_ms", "other collectives, slowest replica")}
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf")
STRAGGLER_TRACE = "stragglers"


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


class FigureModel:
    """Builds the figure's traces and the incremental updates for a RunSeries."""

    def __init__(self, series: RunSeries, title: str = ""):
        self.series = series
        self.title = title
        self.index: dict[tuple[str, Any], int] = {}    # (metric, key or None) -> trace index
        self.sent: dict[tuple[str, Any], int] = {}     # decimator version last sent
        self._traces: list[dict[str, Any]] = []
        self._straggler_marks: tuple = ()

    # -- building --------------------------------------------------------------------------
    def layout(self) -> dict[str, Any]:
        from plotly.subplots import make_subplots

        time_title = ("compute time per replica (ms)" if self.series.per_replica
                      else "step time per worker (ms)")
        titles = [p[3] if p[0] != "time" else time_title for p in PANELS]
        base = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.08,
                             vertical_spacing=0.14)
        layout = base.layout.to_plotly_json()
        layout.update(
            height=560, margin={"l": 50, "r": 20, "t": 60, "b": 40}, template="plotly_white",
            legend={"orientation": "h", "y": -0.08}, uirevision="nbdist",
            title={"text": self.title, "x": 0.01, "font": {"size": 13}},
        )
        for axis in ("yaxis3", "yaxis4"):              # first steps include tracing: log scale
            layout[axis]["type"] = "log"
        for axis in ("xaxis3", "xaxis4"):
            layout[axis]["title"] = {"text": "step"}
        layout["updatemenus"] = [{                      # client-side: works while the cell runs
            "type": "buttons", "direction": "right", "showactive": True, "active": 0,
            "x": 1.0, "y": 1.13, "xanchor": "right", "yanchor": "bottom",  # clear of the title
            "font": {"size": 10},
            "buttons": [
                {"label": "loss: linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]},
            ],
        }]
        return layout

    def new_traces(self) -> list[dict[str, Any]]:
        """Trace dicts for series that have no trace yet (appended after the existing ones)."""
        out = []
        if not self.index and self.series.keys:
            out.append(self._add(("marks", None), {
                "type": "scatter", "mode": "markers", "name": STRAGGLER_TRACE,
                "marker": {"symbol": "x", "size": 11, "color": "#d62728", "line": {"width": 2}},
                "xaxis": "x4", "yaxis": "y4", "x": np.empty(0), "y": np.empty(0),
                "hovertemplate": "%{text}<extra>straggler</extra>", "text": [],
            }))
        for i, key in enumerate(self.series.plotted_keys()):
            label = self.series.label(key)
            for metric, *_ in PANELS:
                if (metric, key) in self.index:
                    continue
                xa, ya = _AXIS[metric]
                out.append(self._add((metric, key), {
                    "type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
                    "showlegend": metric == "loss", "xaxis": xa, "yaxis": ya,
                    "line": {"width": 1, "color": _color(i)}, "opacity": 0.75,
                    "x": np.empty(0), "y": np.empty(0),
                }))
        if self.series.keys:
            for name, (panel, label) in _GLOBAL.items():
                if (name, None) in self.index or (
                        name == "other_collective_ms" and not self.series.other_collectives):
                    continue
                xa, ya = _AXIS[panel]
                if name == "loss" and self.series.loss_scale > 1:
                    label = "global loss (sum of replicas)"
                dash = "dot" if name == "other_collective_ms" else "solid"
                out.append(self._add((name, None), {
                    "type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
                    "xaxis": xa, "yaxis": ya,
                    "line": {"width": 3, "color": "#222222", "dash": dash},
                    "x": np.empty(0), "y": np.empty(0),
                }))
        return out

    def _add(self, ident: tuple[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
        self.index[ident] = len(self.index)
        return trace

    # -- updating --------------------------------------------------------------------------
    def changes(self) -> tuple[dict[str, list[Any]], list[int]]:
        """(restyle data, trace indices) for every data series changed since the last call."""
        xs, ys, idx = [], [], []
        for ident, trace in self.index.items():
            if ident[0] == "marks":
                continue
            dec = self.series.series.get(ident)
            if dec is None or self.sent.get(ident) == dec.version:
                continue
            self.sent[ident] = dec.version
            x, y = dec.points()
            xs.append(x)
            ys.append(y)
            idx.append(trace)
        return {"x": xs, "y": ys}, idx

    def marks_change(self) -> tuple[dict[str, list[Any]], list[int]] | None:
        """The straggler markers' restyle, or None when they did not change."""
        marks = self.straggler_marks()
        if ("marks", None) not in self.index or marks == self._straggler_marks:
            return None
        self._straggler_marks = marks
        return ({"x": [np.array([m[0] for m in marks], dtype=np.float64)],
                 "y": [np.array([m[1] for m in marks], dtype=np.float64)],
                 "text": [[m[2] for m in marks]]}, [self.index[("marks", None)]])

    def straggler_marks(self) -> tuple[tuple[float, float, str], ...]:
        marks = []
        for s in self.series.stragglers():
            dec = self.series.series.get(("time", s.key))
            last = dec.last if dec is not None else None
            if last is not None:
                marks.append((last[0], last[1],
                              f"{self.series.label(s.key)}: {s.ratio:.1f}x the median"))
        return tuple(marks)


def figure_dict(model: FigureModel) -> dict[str, Any]:
    """The whole figure as a plotly dict, with the current data."""
    traces = model.new_traces()
    for ident, i in model.index.items():
        dec = model.series.series.get(ident)
        if dec is not None:
            traces[i]["x"], traces[i]["y"] = dec.points()
            model.sent[ident] = dec.version
    marks = model.straggler_marks()
    if ("marks", None) in model.index:
        t = traces[model.index[("marks", None)]]
        t["x"] = np.array([m[0] for m in marks], dtype=np.float64)
        t["y"] = np.array([m[1] for m in marks], dtype=np.float64)
        t["text"] = [m[2] for m in marks]
        model._straggler_marks = marks
    return {"data": traces, "layout": model.layout()}


def run_title(run: Run, series: RunSeries, final: bool = True) -> str:
    parts = [f"Run {run.id} · {run.strategy} · {run.replicas} replica(s)"]
    if run.workers > 1:
        parts.append(f"{run.workers} workers")
    if final:
        parts.append(f"{series.last_step + 1} step(s) · {run.status}")
    return " · ".join(parts)


def series_of(run: Run, **options: Any) -> RunSeries:
    options.setdefault("loss_scale", run.loss_scale)
    series = RunSeries(replicas=run.replicas, workers=run.workers, **options)
    series.ingest(run.block_since(0))
    series.finish()
    return series


def run_figure(run: Run, **options: Any) -> dict[str, Any]:
    """``run`` drawn as a plotly figure dict (numpy arrays; options go to ``RunSeries``)."""
    series = series_of(run, **options)
    fig = figure_dict(FigureModel(series, run_title(run, series)))
    bw = series.bus_bandwidth(run.allreduce_bytes)
    if math.isfinite(bw):
        fig["layout"]["annotations"][2]["text"] += f" · bus bw {bw / 1e9:.3g} GB/s"
    return fig


def static_figure(run: Run, **options: Any) -> Any:
    """A plotly ``Figure`` of ``run`` (each trace at most ``max_points`` points)."""
    import plotly.graph_objects as go

    return go.Figure(run_figure(run, **options))


def plotly_json(obj: Any) -> Any:
    """``obj`` (a figure dict, traces) as JSON data; numpy arrays become plotly's typed arrays
    (``{"dtype": "f8", "bdata": ...}``), which plotly.js reads as they are."""
    import json

    import plotly.io as pio

    return json.loads(pio.to_json(obj, validate=False))
