"""Runs overlaid: one metric of several Runs on one step or wall-clock axis (``nbdist.compare``),
as TensorBoard's run selector overlays runs on its scalars page.

Each run is one line: per step, the metric's mean over the run's replicas and workers (the
global loss for ``loss``, as the dashboard's headline line has it), or one point per epoch for
what a ``model.fit`` logs at an epoch's end (``val_loss``...). A fit's ``loss`` is its
``batch_loss`` (each batch's own, as the dashboard draws it), not Keras' running mean. A run
that resumed from a ``--checkpoint`` goes on from the run it resumed (``Run.resumed_from``):
its line starts with that run's steps, or, when that run is drawn too, joins its last point.
The figure shows as the dashboard's finished figure does (``static.figure_bundle``: SVG for
saved notebooks and HTML, plotly.js where nbdist's extension is), and is a plotly ``Figure``
for ``.show()``, ``.write_html()``, ``.update_layout()``...
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CompareError
from ..telemetry.labels import run_labels, shared_facts
from ..telemetry.rows import MEASURED
from ..telemetry.rows import POSITION as COL
from ..telemetry.run import Run
from ..words import count
from .controls import scale_menu, smoothed, smoothing_slider, wall_ms, x_menu
from .decimator import Decimator
from .figure import earlier_parts
from .panels import PALETTE

__all__ = ["compare", "comparison_figure"]

#: compare's x axes: the words of ``x=`` and the axis title of each
X_AXES = {"step": "step", "time": "seconds since the run started", "wall": "wall time"}
_EPOCH_KEYS = ("epoch", "step")


def compare(runs: Run | Sequence[Run] | None = None, x: str = "step", metric: str = "loss",
            max_points: int = 1000, smoothing: float = 0.0) -> Any:
    """One line per Run of ``metric`` against ``x`` ("step"; "time": seconds since each run
    started; "wall": the clock time), a plotly Figure shown like the dashboard's final figure
    when it is a cell's value. ``runs``: Runs (``nbdist.runs[-3:]``,
    ``nbdist.Run.load(PATH)``), default every run of this kernel that recorded a step.
    ``metric``: ``loss``, a column of ``run.metrics`` (``step_ms``, ``grad_norm``...), a fit's
    compiled metric (``accuracy``) or a per-epoch one (``val_loss``, ``val_accuracy``).
    ``smoothing`` in [0, 1): the lines smoothed as TensorBoard smooths them, raw lines kept
    faint; the figure's own controls change it, the x axis and the y scale, and its legend
    shows and hides runs."""
    return _figure_class()(comparison_figure(runs, x, metric, max_points, smoothing))


def comparison_figure(runs: Run | Sequence[Run] | None = None, x: str = "step",
                      metric: str = "loss", max_points: int = 1000,
                      smoothing: float = 0.0) -> dict[str, Any]:
    """``compare``'s figure as a plotly dict (numpy arrays): checks everything first."""
    chosen = _checked_runs(runs)
    if x not in X_AXES:
        raise CompareError(
            f"nbdist.compare(x={x!r}): x is the axis the runs are drawn against, \"step\" (the "
            "global training step), \"time\" (seconds since each run started) or \"wall\" "
            "(the clock time).")
    if not isinstance(max_points, int) or max_points < 4:
        raise CompareError(f"nbdist.compare(max_points={max_points!r}): give a whole number "
                           "of points per line, at least 4 (1000 by default).")
    if not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
        raise CompareError(f"nbdist.compare(smoothing={smoothing!r}): give a weight from 0 "
                           "(no smoothing) up to but not 1; TensorBoard's default is 0.6.")
    have = {id(run): available(run) for run in chosen}
    if not isinstance(metric, str) or not any(metric in names for names in have.values()):
        known = sorted({name for names in have.values() for name in names})
        raise CompareError(
            f"nbdist.compare(metric={metric!r}): none of the {count(len(chosen), 'run')} recorded "
            f"that metric. They have: {', '.join(known)}. `loss` is the global loss per step; "
            "a fit's `val_*` metrics need validation data in its model.fit.")
    drawn = [run for run in chosen if metric in have[id(run)]]
    labels = dict(zip(map(id, chosen), run_labels(chosen), strict=True))
    notes = [f"not drawn (no {metric}): " + ", ".join(labels[id(r)] for r in chosen
                                                      if r not in drawn)] \
        if len(drawn) < len(chosen) else []
    traces = []
    lines: dict[str, dict[str, np.ndarray]] = {}
    names: dict[str, int] = {}
    for i, run in enumerate(drawn):
        joined = any(r is run.resumed_from for r in drawn)
        xs = {}
        for mode in X_AXES:
            px, py = run_line(run, metric, mode, joined=joined)
            order = np.argsort(px, kind="stable")
            dec = Decimator(max_points)
            dec.extend(px[order], py[order])
            xs[mode], ys = dec.points()
        name = labels[id(run)] + _resumed(run)
        names[name] = names.get(name, 0) + 1
        if names[name] > 1:
            name += f" ({names[name]})"
        per_epoch = metric in _epoch_names(run) and metric not in _row_names(run)
        color = PALETTE[i % len(PALETTE)]
        lines[name] = {"raw": ys, **{f"x:{m}": _x(v, m) for m, v in xs.items()}}
        traces.append({
            "type": "scatter", "mode": "lines+markers" if per_epoch else "lines",
            "name": name, "legendgroup": name, "x": lines[name][f"x:{x}"], "y": ys,
            "xaxis": "x", "yaxis": "y", "line": {"width": 1.8, "color": color},
            **({"marker": {"size": 6, "color": color}} if per_epoch else {}),
            "hovertemplate": f"%{{y:.4g}} <span style='color:#888'>{metric}</span>"})
    title = " · ".join(shared_facts(drawn)) if len(drawn) > 1 else ""
    fig = {"data": traces, "layout": _layout(metric, x, len(drawn), notes, title)}
    add_controls(fig, lines, x, smoothing)
    return fig


def _x(values: np.ndarray, mode: str) -> np.ndarray:
    """x values as plotly takes them on the ``mode`` axis."""
    return wall_ms(values) if mode == "wall" else values


def _resumed(run: Run) -> str:
    return f" · resumed run {run.resumed_from.id} at step {run.resumed_at}" \
        if run.resumed_from is not None else ""


def _checked_runs(runs: Run | Sequence[Run] | None) -> list[Run]:
    if runs is None:
        from ..telemetry.run import runs as everything

        chosen = [run for run in everything if run.n_rows]
        if not chosen:
            raise CompareError(
                "nbdist.compare(): no run of this kernel has recorded a step yet. Train one "
                "(a %%distribute cell), or pass Runs: nbdist.compare([nbdist.Run.load(PATH), "
                "...]).")
        return chosen
    chosen = [runs] if isinstance(runs, Run) else runs
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Sequence):
        raise CompareError(
            f"nbdist.compare(runs=...) takes a Run or a list of Runs (nbdist.runs[-2:], "
            f"nbdist.Run.load(PATH)), not a {type(runs).__name__}.")
    chosen = list(chosen)
    wrong = [type(r).__name__ for r in chosen if not isinstance(r, Run)]
    if wrong:
        raise CompareError(
            f"nbdist.compare(runs=...): every item must be a Run (from nbdist.runs or "
            f"nbdist.Run.load(PATH)); got {', '.join(sorted(set(wrong)))}.")
    if not chosen:
        raise CompareError("nbdist.compare(runs=[]): give at least one Run, or no runs= "
                           "for every run of this kernel.")
    empty = [r for r in chosen if not r.n_rows]
    if empty:
        labels = dict(zip(map(id, chosen), run_labels(chosen), strict=True))
        which = ", ".join(f"{labels[id(r)]} ({r.status})" for r in empty)
        raise CompareError(
            f"nbdist.compare: {which} recorded no step, so it has no curve to draw. Leave it "
            "out (a run that failed before its first step has nothing to compare).")
    return chosen


def _row_names(run: Run) -> set[str]:
    return {"loss", *MEASURED, *run.extras_since(0, 1)}


def _epoch_names(run: Run) -> set[str]:
    return {k for row in run.epoch_rows() for k in row if k not in _EPOCH_KEYS}


def available(run: Run) -> set[str]:
    """The metrics ``compare`` can draw for ``run``: measured columns with a value, extras,
    and what a fit logged per epoch."""
    block = run.block_since(0)
    names = {name for name in MEASURED if np.isfinite(block[:, getattr(COL, name)]).any()}
    names |= {k for k, v in run.extras_since(0).items() if np.isfinite(v).any()}
    return names | _epoch_names(run)


def run_line(run: Run, metric: str, x: str, joined: bool = False
             ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of ``run``'s line: the metric per step (mean over the rows of each step, the
    global loss for ``loss``), or per epoch; preceded by the steps of the runs it resumed
    (only their last point when ``joined``: that run is drawn itself)."""
    parts = earlier_parts(run)
    if joined and parts:
        parts = parts[-1:]
    parts.append((run.block_since(0), run.extras_since(0), run.epoch_rows()))
    origin = run.lineage()[0].started
    xs, ys = [], []
    for k, (block, extras, epochs) in enumerate(parts):
        px, py = _part(block, extras, epochs, metric, run.loss_scale)
        if joined and k == 0 and len(parts) > 1 and len(px):
            px, py = px[-1:], py[-1:]
        if x != "step" and len(px):
            px = _times(block, px) - (origin if x == "time" else 0.0)
        xs.append(px)
        ys.append(py)
    return np.concatenate(xs), np.concatenate(ys)


def _part(block: np.ndarray, extras: dict[str, np.ndarray], epochs: list[dict[str, float]],
          metric: str, loss_scale: int) -> tuple[np.ndarray, np.ndarray]:
    """Steps and values of ``metric`` in one run's rows (or epochs)."""
    if metric in _EPOCH_KEYS or not len(block):
        return np.empty(0), np.empty(0)
    if metric == "loss" and "batch_loss" in extras:    # a fit: each batch's own loss
        metric = "batch_loss"
    if metric in MEASURED or metric in extras:
        values = block[:, getattr(COL, metric)] if metric in MEASURED else extras[metric]
        steps, inverse = np.unique(block[:, COL.step], return_inverse=True)
        ok = np.isfinite(values)
        sums = np.bincount(inverse, np.where(ok, values, 0.0), len(steps))
        counts = np.bincount(inverse, ok.astype(np.float64), len(steps))
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums / counts
        scale = loss_scale if metric == "loss" else 1
        keep = counts > 0
        return steps[keep], mean[keep] * scale
    rows = [r for r in epochs if math.isfinite(r.get(metric, math.nan))]
    return (np.array([r["step"] for r in rows], dtype=np.float64),
            np.array([r[metric] for r in rows], dtype=np.float64))


def _times(block: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Wall time (s since the epoch) at which each of ``steps`` ended in ``block``'s rows."""
    order = np.argsort(block[:, COL.step], kind="stable")
    sorted_steps = block[order, COL.step]
    ends = np.maximum.reduceat(block[order, COL.wall_time],
                               np.flatnonzero(np.diff(sorted_steps, prepend=-np.inf)))
    unique = np.unique(sorted_steps)
    at = np.clip(np.searchsorted(unique, steps), 0, len(unique) - 1)
    return ends[at]


def add_controls(fig: dict[str, Any], lines: dict[str, dict[str, Any]], x: str,
                 smoothing: float) -> None:
    """The figure's controls (``controls``): the smoothing slider under the plot, with each
    run's raw line faint under its smoothed one; the x axis and y scale buttons above it."""
    n = len(fig["data"])
    fig["data"] = smoothed(fig["data"], smoothing, always=True)
    faint = {t["legendgroup"]: j for j, t in enumerate(fig["data"]) if j >= n}
    raw = {i: lines[t["name"]]["raw"] for i, t in enumerate(fig["data"][:n])
           if t["legendgroup"] in faint}
    xs = {mode: [lines[t["legendgroup"]][f"x:{mode}"] for t in fig["data"]]
          for mode in X_AXES}
    layout = fig["layout"]
    layout["updatemenus"] = [x_menu(xs, x), scale_menu("yaxis", "y: ", False)]
    layout["sliders"] = [smoothing_slider(raw, smoothing)] if raw else []
    if raw:
        layout["margin"]["b"] += _SLIDER
        layout["height"] += _SLIDER


_SLIDER = 64    # px under the x axis: the smoothing slider and its value
_MENUS = 26     # px above the plot: the x axis and y scale buttons (the notes above them)


def _layout(metric: str, x: str, n: int, notes: list[str], shared: str) -> dict[str, Any]:
    what = "global loss" if metric == "loss" else metric
    top = 58 + 15 * len(notes) + _MENUS
    return {
        "height": 420 + _MENUS, "autosize": True, "template": "plotly_white",
        "margin": {"l": 64, "r": 12, "t": top, "b": 48},
        "hovermode": "x unified", "uirevision": "nbdist",
        "hoverlabel": {"font": {"size": 11}, "namelength": -1},
        "legend": {"x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top", "font": {"size": 11}},
        "title": {"text": f"{what}: {count(n, 'run')}" + (
                      f" · {shared}" if shared else ""), "x": 0.005,
                  "xanchor": "left", "y": 0.995, "yanchor": "top", "yref": "container",
                  "font": {"size": 14}},
        "xaxis": {"title": {"text": X_AXES[x], "standoff": 6}, "zeroline": False,
                  "anchor": "y", "domain": [0, 1], **({"type": "date"} if x == "wall" else
                                                    {"tickformat": ",~g"})},
        "yaxis": {"title": {"text": what if metric == "loss" else
                            f"{metric} (mean over replicas)", "standoff": 4},
                  "tickformat": "~g", "zeroline": False, "anchor": "x", "domain": [0, 1]},
        "annotations": [{
            "name": "notes", "text": "<br>".join(notes), "x": 0, "xref": "paper",
            "xanchor": "left", "y": 1, "yref": "paper", "yanchor": "bottom",
            "yshift": 6 + _MENUS,
            "align": "left", "showarrow": False, "font": {"size": 11, "color": "#666"},
        }] if notes else [],
    }


@functools.cache
def _figure_class() -> type:
    import plotly.graph_objects as go

    class Comparison(go.Figure):
        """``nbdist.compare``'s figure: shown with one static picture, as the dashboard's."""

        def _repr_mimebundle_(self, include: Any = None, exclude: Any = None,
                              **kwargs: Any) -> dict[str, Any]:
            from .static import figure_bundle

            fig = self.to_dict()
            data = [{k: _plain(v) for k, v in t.items()} for t in fig["data"]]
            layout = fig["layout"]
            layout.setdefault("title", {}).setdefault("text", "")
            return figure_bundle({"data": data, "layout": layout},
                                 "nbdist.compare: runs overlaid")

        def _ipython_display_(self) -> None:     # plotly's own goes through its renderers
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)

    return Comparison


def _plain(value: Any) -> Any:
    """plotly's typed-array dicts (``to_dict``) back to numpy arrays."""
    import base64

    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return value
