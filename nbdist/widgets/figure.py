"""The dashboard's plotly figure: four panels drawn from a ``RunSeries``.

``FigureModel`` owns the mapping from series to trace indices, so the live dashboard can send
only the traces that changed in one ``plotly_update`` message, and ``static_figure`` draws a
finished Run with the same code.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..telemetry.labels import facts
from ..telemetry.rows import LOSS_SCALE_FACTOR, POSITION
from ..words import count
from .controls import ema, is_line, smoothed  # noqa: F401 - figure.ema, as before
from .header import format_bandwidth
from .outcome import mark_outcome
from .panels import (
    AGGREGATES,
    PALETTE,
    STEP_ONLY,
    aggregate_line,
    axis_names,
    band_traces,
    choose_panels,
    epoch_points,
    heatmap,
    log_dtick,
    metric_line,
    replica_line,
    running_loss_line,
    straggler_marks,
)
from .panels import layout as panel_layout
from .series import Key, RunSeries

COL_STEP = POSITION.step

if TYPE_CHECKING:
    from ..telemetry.run import Run
    from ..telemetry.stragglers import Straggler

STRAGGLER_TRACE = "stragglers"
_CHUNK = 1 << 15        # rows a finished Run is read in


class FigureModel:
    """Builds the figure's traces and the incremental updates for a RunSeries. The panels are
    chosen once, at the first ``layout()`` (``panels.choose_panels``)."""

    def __init__(self, series: RunSeries, title: str = "", strategy: str = "",
                 final: bool = False, run: Run | None = None):
        self.series = series
        self.run = run                          # whose stragglers are marked (None: none)
        self.title = title
        self.loss_label: str | None = None      # ``Run.loss_label``: what the loss line is
        self.strategy, self.final = strategy, final
        self.panels: list[str] = []
        self.notes: list[str] = []
        self.axes: dict[str, str] = {}                 # panel -> y axis
        self.index: dict[tuple[str, Any], int] = {}    # (metric, key or None) -> trace index
        self.sent: dict[tuple[str, Any], int] = {}     # decimator version last sent
        self._straggler_marks: tuple = ()

    # -- building --------------------------------------------------------------------------
    def _choose(self) -> None:
        if not self.panels:
            self.panels, self.notes = choose_panels(self.series, self.strategy, self.final)
            self.axes = axis_names(self.panels)

    def layout(self) -> dict[str, Any]:
        self._choose()
        return panel_layout(self.panels, self.title, self.notes, self.series.per_replica)

    def new_traces(self) -> list[dict[str, Any]]:
        """Trace dicts for series that have no trace yet (appended after the existing ones)."""
        self._choose()
        out = []
        if not self.index and self.series.keys:
            out.append(self._add(("marks", None), straggler_marks(self.axes["time"])))
        keys = self.series.plotted_keys()
        for metric in self.panels:     # panel by panel: the shared hover lists them so
            if metric == "heatmap" and ("heatmap", None) not in self.index:
                dom = self.layout()["yaxis" + self.axes[metric][1:]]["domain"]
                out.append(self._add(("heatmap", None), heatmap(self.axes[metric], *dom)))
            if self.series.aggregated and metric != "heatmap" and metric not in STEP_ONLY \
                    and (metric, "median") not in self.index:
                for stat, trace in band_traces(metric, self.axes[metric],
                                               legend=metric == self.panels[0]):
                    out.append(self._add((metric, stat), trace))
            for i, key in enumerate(keys if metric not in STEP_ONLY else ()):
                if (metric, key) not in self.index:
                    out.append(self._add((metric, key), replica_line(
                        self.series.label(key), i, metric, self.axes[metric],
                        legend=metric == self.panels[0])))
            for name, agg in AGGREGATES.items():
                if agg.panel == metric and (name, None) not in self.index and self._drawn(name):
                    out.append(self._add((name, None), aggregate_line(
                        name, self.axes[metric], self._label(name))))
            out += self._fit_traces(metric)
        return out

    def _fit_traces(self, panel: str) -> list[dict[str, Any]]:
        """A fit's other lines: Keras' running-mean loss and ``val_loss`` per epoch on the loss
        panel; each compiled metric per batch and its ``val_`` twin per epoch on the metrics
        panel (one colour per metric)."""
        out = []
        axis = self.axes[panel]
        if panel == "loss":
            wanted = [(("running_loss", None), lambda: running_loss_line(axis)),
                      (("epoch", "val_loss"), lambda: epoch_points(
                          "val_loss (per epoch)", "#d62728", axis))]
        elif panel == "metrics":
            wanted = []
            names = self.series.metric_names()
            extra = [n[4:] for n in self.series.epoch_names()
                     if n.startswith("val_") and n != "val_loss" and n[4:] not in names]
            for i, name in enumerate([*names, *extra]):
                color = PALETTE[i % len(PALETTE)]
                wanted.append((("metric", name), lambda name=name, i=i: metric_line(
                    f"{name} (running mean over the epoch)", i, axis)))
                wanted.append((("epoch", f"val_{name}"), lambda name=name, color=color:
                               epoch_points(f"val_{name} (per epoch)", color, axis)))
        else:
            return out
        for ident, make in wanted:
            if ident not in self.index and ident in self.series.series:
                out.append(self._add(ident, make()))
        return out

    def _drawn(self, name: str) -> bool:
        return bool(self.series.keys) and (
            name != "other_collective_ms" or self.series.other_collectives)

    def _label(self, name: str) -> str | None:
        if name == "loss" and self.series.loss_scale > 1:
            return "global loss (sum of replicas)"
        if name == "loss" and not self.series.per_replica:
            return self.loss_label or "loss (as fit reports it)"
        return None

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

    def heat_change(self) -> tuple[dict[str, list[Any]], list[int]] | None:
        """The worker x step heatmap's restyle (z as JSON rows), or None when unchanged."""
        agg = self.series.aggregates
        if ("heatmap", None) not in self.index or agg is None or \
                self.sent.get(("heatmap", None)) == agg.heat.version:
            return None
        self.sent[("heatmap", None)] = agg.heat.version
        x, values = agg.heat.points()
        z = np.where(np.isfinite(values.T), np.round(values.T, 4), None).tolist()
        return {"x": [x], "z": [z]}, [self.index[("heatmap", None)]]

    def straggler_marks(self) -> tuple[tuple[float, float, str], ...]:
        """A mark at the latest time of each of the run's stragglers (``Run.stragglers``)."""
        marks = []
        for s in self.run.stragglers() if self.run is not None else ():
            last = self._latest_time(s)
            if last is not None:
                marks.append((last[0], last[1],
                               f"{s.label}: the others waited {s.waited_ms:.3g} ms"))
        return tuple(marks)

    def _latest_time(self, s: Straggler) -> tuple[float, float] | None:
        """Where ``s``'s time line ends (a worker's: its slowest replica's); without a line per
        replica, its recent time at the last step."""
        def mine(key: Key) -> bool:
            return key[0] == s.index if s.label.startswith("worker") else key[1] == s.index

        ends = [dec.last for (metric, key), dec in self.series.series.items()
                if metric == "time" and isinstance(key, tuple) and mine(key)
                and dec.last is not None]
        if ends:
            return max(ends, key=lambda point: point[1])
        agg = self.series.aggregates
        recent = [ms for key, ms in (agg.recent_times() if agg else {}).items() if mine(key)]
        return (float(self.series.last_step), max(recent)) if recent else None


def figure_dict(model: FigureModel) -> dict[str, Any]:
    """The whole figure as a plotly dict, with the current data."""
    traces = model.new_traces()
    for ident, i in model.index.items():
        dec = model.series.series.get(ident)
        if dec is not None:
            traces[i]["x"], traces[i]["y"] = dec.points()
            model.sent[ident] = dec.version
    heat = model.heat_change()
    if heat is not None:
        t = traces[heat[1][0]]
        t["x"], t["z"] = heat[0]["x"][0].tolist(), heat[0]["z"][0]
    marks = model.straggler_marks()
    if ("marks", None) in model.index:
        t = traces[model.index[("marks", None)]]
        t["x"] = np.array([m[0] for m in marks], dtype=np.float64)
        t["y"] = np.array([m[1] for m in marks], dtype=np.float64)
        t["text"] = [m[2] for m in marks]
        model._straggler_marks = marks
    return {"data": traces, "layout": model.layout()}


def run_title(run: Run, series: RunSeries, final: bool = True) -> str:
    parts = [f"Run {run.id}", *([run.title] if run.title else []),
             *facts(run).values()]    # --name, strategy, size, lr and batch where known
    if final:
        parts.append(f"{count(series.last_step + 1, 'step')} · {run.status}")
    return " · ".join(parts)


def earlier_parts(run: Run) -> list[tuple[np.ndarray, dict[str, np.ndarray],
                                           list[dict[str, float]]]]:
    """What the runs ``run`` resumed recorded before it (``Run.lineage``): for each, its rows,
    their extras and its epochs below the step its successor resumed at, earliest first.
    Empty when ``run`` did not resume."""
    chain = run.lineage()
    out = []
    for earlier, later in zip(chain, chain[1:], strict=False):
        block = earlier.block_since(0)
        if not len(block):
            continue
        keep = block[:, COL_STEP] < later.resumed_at
        extras = {k: v[keep] for k, v in earlier.extras_since(0).items()}
        epochs = [r for r in earlier.epoch_rows() if r["step"] < later.resumed_at]
        out.append((block[keep], extras, epochs))
    return out


def feed(series: RunSeries, run: Run, start: int = 0, stop: int | None = None) -> int:
    """Rows ``start`` to ``stop`` of ``run`` into ``series``, a fit's compiled metrics with
    them (its ``batch_loss`` as the loss, Keras' running mean as ``running_loss``); with its
    first rows, first the steps of the runs it resumed (``earlier_parts``: its curves go on
    from theirs). Returns the rows read."""
    block = run.block_since(start, stop)
    parts = earlier_parts(run) if start == 0 and len(block) else []
    extras = run.extras_since(start, stop)
    parts.append((block, extras if run.mode == "fit" else {k: v for k, v in extras.items()
                                                         if k == LOSS_SCALE_FACTOR}, []))
    for rows, extras, epochs in parts:
        extras = dict(extras)
        if "batch_loss" in extras:     # a fit: draw each batch's loss, Keras' mean beside it
            rows = rows.copy()
            extras["running_loss"] = rows[:, POSITION.loss].copy()
            rows[:, POSITION.loss] = extras.pop("batch_loss")
        series.ingest(rows)
        scale = extras.pop(LOSS_SCALE_FACTOR, None)
        if len(rows) and scale is not None:
            series.ingest_loss_scale(rows[:, COL_STEP], scale)
        if len(rows) and extras:
            series.ingest_metrics(rows[:, COL_STEP], extras)
        series.ingest_epochs(epochs)
    return len(block)


def series_of(run: Run, **options: Any) -> RunSeries:
    options.setdefault("loss_scale", run.loss_scale)
    series = RunSeries(replicas=run.replicas, workers=run.workers, **options)
    n = run.n_rows
    for start in range(0, n, _CHUNK):     # cache-sized blocks
        feed(series, run, start, min(n, start + _CHUNK))
    series.ingest_epochs(run.epoch_rows())
    series.finish()
    return series


def run_figure(run: Run, smoothing: float = 0.0, per_replica: bool = False,
               **options: Any) -> dict[str, Any]:
    """``run`` drawn as a plotly figure dict (numpy arrays; options go to ``RunSeries``).
    ``smoothing`` in [0, 1): each line's exponential moving average drawn over the faint raw
    line, as TensorBoard's smoothing slider does (0: raw lines only). Above 16 replicas x
    workers the panels show median and bands over the replicas; ``per_replica`` draws every
    replica's line instead. ``layout.meta["nbdist"]`` tells nbdist's renderers what their
    smoothing slider and x axis menu need: the smoothing drawn, the lines it smooths, which
    trace is each one's raw copy, and when each step ended (``clock_points``)."""
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing must be in [0, 1) (0: off, 0.6: TensorBoard's default), "
                         f"got {smoothing!r}")
    series = series_of(run, aggregate=False if per_replica else None, **options)
    model = FigureModel(series, run_title(run, series), strategy=run.strategy, final=True,
                        run=run)
    model.loss_label = run.loss_label
    fig = figure_dict(model)
    note_sampling(fig, series)
    bw = series.bus_bandwidth(run.allreduce_bytes)
    for note in fig["layout"]["annotations"]:
        if note.get("name") == "title:allreduce_ms" and math.isfinite(bw):
            note["text"] += f" · bus bandwidth {format_bandwidth(bw)}"   # as the header
    _readable_log_ticks(fig)
    n = len(fig["data"])
    fig["data"] = smoothed(fig["data"], smoothing)
    lines = [i for i, t in enumerate(fig["data"][:n]) if is_line(t)]
    mark_resume(fig, run)
    mark_restarts(fig, run)     # --elastic: where a worker died and the run went on
    mark_outcome(fig, run)      # where it failed, was interrupted or stopped, and why
    steps, ends = step_clock(run)
    fig["layout"]["meta"] = {"nbdist": {
        "smoothing": smoothing, "lines": lines,
        "raw": [[i, n + k] for k, i in enumerate(lines)] if smoothing else [],
        "clock": clock_points(steps, ends, run.lineage()[0].started)}}
    return fig


CLOCK_POINTS = 400   # (step, time) pairs the renderers interpolate between


def clock_points(steps: np.ndarray, ends: np.ndarray, started: float) -> dict[str, Any]:
    """When each step ended, for the renderers' x axis modes (relative and wall time;
    ``labextension/src/figurecontrols.ts``): at most ``CLOCK_POINTS`` steps, the first and
    last among them, read by linear interpolation."""
    if len(steps) > CLOCK_POINTS:
        pick = np.unique(np.linspace(0, len(steps) - 1, CLOCK_POINTS).round().astype(int))
        steps, ends = steps[pick], ends[pick]
    return {"steps": steps.tolist(), "seconds": np.round(ends - started, 3).tolist(),
            "started": started}


def step_clock(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(steps, the wall time each ended at) of ``run`` and the runs it resumed (``feed``)."""
    blocks = [rows for rows, _, _ in earlier_parts(run)] + [run.block_since(0)]
    block = np.concatenate(blocks)
    block = block[np.isfinite(block[:, POSITION.wall_time])]
    steps, inverse = np.unique(block[:, COL_STEP], return_inverse=True)
    ends = np.full(len(steps), -np.inf)
    np.maximum.at(ends, inverse, block[:, POSITION.wall_time])
    return steps, ends


def sampling_note(series: RunSeries, panel: str) -> str:
    """" · sampled every K steps" when ``panel``'s times were measured on some steps only
    (step mode times the all-reduce and the replicas' compute on sampled steps, see
    ``step.pacing``), else ""."""
    if panel == "allreduce_ms":
        decs = [series.series.get(("allreduce_ms", None))]
    elif panel == "time" and series.per_replica:
        decs = [dec for (m, key), dec in series.series.items() if m == "time" and key]
    else:
        return ""
    measured = max((dec.raw for dec in decs if dec is not None), default=0)
    steps = series.last_step + 1
    if not 0 < measured < steps:
        return ""
    every = round(steps / measured)
    return (f" · sampled every {every} steps" if every > 1 else
            f" · sampled on {measured} of {steps} steps")


def note_sampling(fig: dict[str, Any], series: RunSeries) -> None:
    """Say in each timing panel's title when its lines are sampled (``sampling_note``)."""
    for note in fig["layout"]["annotations"]:
        name = note.get("name", "")
        if name.startswith("title:"):
            note["text"] += sampling_note(series, name[6:])


def mark_resume(fig: dict[str, Any], run: Run) -> None:
    """Where ``run`` resumed from a checkpoint (the steps before it are the earlier run's,
    ``Run.resumed_from``): said in the title, and a dotted vertical line across the loss
    panel, named in the legend (a trace: every renderer, the SVG one too, draws it)."""
    if run.resumed_from is None or run.resumed_at is None:
        return
    text = f"resumed from run {run.resumed_from.id} at step {run.resumed_at}"
    fig["layout"]["title"]["text"] += f" · {text}"
    _vertical_line(fig, run.resumed_at - 0.5, text, "#888888", "dot", "skip")


def mark_restarts(fig: dict[str, Any], run: Run) -> None:
    """Each ``--elastic`` restart of ``run`` (``Run.restarts``): a dashed vertical line across
    the loss panel after the step the worker died at, named in the legend with what died, the
    step the run resumed at and the seconds lost (the curves go on across it)."""
    for number, restart in enumerate(run.restarts, 1):
        at = restart.step if restart.step is not None else restart.resumed_at
        if at is None:
            continue
        resumed = f", resumed at step {restart.resumed_at}" if restart.resumed_at is not None \
            else ""
        text = (f"restart {number}: {restart.died} died after step {at}{resumed}, "
                f"{restart.seconds:.0f} s lost")
        _vertical_line(fig, at - 0.5, text, "#d62728", "dash", "name")


def _vertical_line(fig: dict[str, Any], at: float, name: str, colour: str, dash: str,
                   hover: str) -> None:
    """A vertical line at step ``at`` over the loss panel's values, named in the legend."""
    ys = [np.asarray(t["y"], dtype=np.float64) for t in fig["data"]
          if t.get("yaxis") == "y" and t.get("type") == "scatter" and len(t.get("y", ()))]
    ys = [y[np.isfinite(y)] for y in ys]
    ys = [y for y in ys if len(y)]
    if not ys:
        return
    fig["data"].append({
        "type": "scatter", "mode": "lines", "name": name, "xaxis": "x", "yaxis": "y",
        "x": np.array([at, at]), "y": np.array([min(float(y.min()) for y in ys),
                                                max(float(y.max()) for y in ys)]),
        "line": {"color": colour, "width": 1.2, "dash": dash}, "hoverinfo": hover,
        "legendrank": 1500})


def _readable_log_ticks(fig: dict[str, Any]) -> None:
    """Each log axis ticked by ``panels.log_dtick`` over the values drawn on it."""
    for name, axis in fig["layout"].items():
        if name.startswith("yaxis") and axis.get("type") == "log":
            ys = [np.asarray(t["y"], dtype=np.float64) for t in fig["data"]
                  if t.get("yaxis") == "y" + name[5:] and len(t.get("y", ()))]
            ys = [y[np.isfinite(y) & (y > 0)] for y in ys]
            ys = [y for y in ys if len(y)]
            if ys:
                axis["dtick"] = log_dtick(min(float(y.min()) for y in ys),
                                          max(float(y.max()) for y in ys))


def static_figure(run: Run, **options: Any) -> Any:
    """A plotly ``Figure`` of ``run`` (each trace at most ``max_points`` points)."""
    import plotly.graph_objects as go

    return go.Figure(run_figure(run, **options))


def plotly_json(obj: Any) -> Any:
    """``obj`` (a figure dict, or a list of traces) as JSON data, encoded as plotly encodes
    figures (numpy arrays, dates...). ``plotly.io.to_json`` takes figures only: a list of
    traces, which the live figure sends when a run's lines appear mid-run, must go through
    the encoder itself."""
    import json

    from plotly.io.json import to_json_plotly

    return json.loads(to_json_plotly(obj))
