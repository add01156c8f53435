"""The dashboard figure's look: which panels a run can fill, their layout, the line styles.

One visual language for the live figure, ``run.plot()`` and the static SVG: the panels are
stacked on one shared step axis (hover shows every panel at the hovered step), each replica
or worker is a thin coloured line, and each aggregate is a dark line with its own dash and its
own name in the legend. Panels a run cannot fill are left out, and a line under the title
says why. plotly dicts only (no plotly import).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..families import find_family
from .controls import scale_menu
from .series import RunSeries


@dataclass(frozen=True)
class Panel:
    metric: str          # RunSeries per-key metric drawn in it
    title: str
    unit: str            # the y axis title
    log: bool            # first steps include tracing: a log axis keeps the rest readable
    height: int          # px; a step run's four panels, header and Stop fit a 900 px window
    short: str           # in the shared hover, after each value


PANELS = {p.metric: p for p in (
    Panel("loss", "loss", "", False, 150, "loss"),
    # model.fit: Keras' compiled metrics per batch, and per epoch with validation
    Panel("metrics", "metrics", "", False, 110, ""),
    Panel("grad_norm", "gradient norm", "", False, 110, "grad norm"),
    # mixed precision: the scale a loss scale optimizer multiplied each step's loss by
    Panel("loss_scale_factor", "loss scale", "", True, 80, "loss scale"),
    Panel("allreduce_ms", "gradient all-reduce time", "ms", True, 110, "all-reduce"),
    Panel("time", "compute time per replica", "ms", True, 110, "time"),
    # aggregated runs (many replicas): each worker's slowest replica, a row per worker
    Panel("heatmap", "compute time per worker (its slowest replica)", "worker", False, 170,
          "ms"),
)}
#: Panels of one line per step (no line per replica).
STEP_ONLY = frozenset(("loss_scale_factor",))
BANDS = (("min", "max", "min-max", "rgba(31,119,180,0.15)"),
         ("q10", "q90", "10-90%", "rgba(31,119,180,0.35)"))


@dataclass(frozen=True)
class Aggregate:
    panel: str
    label: str
    dash: str
    color: str


#: Per-step lines (RunSeries global series): one dark line each, told apart by dash and name.
AGGREGATES = {
    "loss": Aggregate("loss", "mean of replicas", "solid", "#111111"),
    "allreduce_ms": Aggregate("allreduce_ms", "slowest replica's all-reduce", "dash", "#111111"),
    "step_ms": Aggregate("time", "host step time (whole step)", "solid", "#777777"),
    "loss_scale_factor": Aggregate("loss_scale_factor", "loss scale", "solid", "#111111"),
    # drawn once a step has some (SyncBatchNormalization...): not a line in every run
    "other_collective_ms": Aggregate("allreduce_ms", "other collectives, slowest replica",
                                     "dashdot", "#555555"),
}
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
REPLICA_WIDTH, AGGREGATE_WIDTH = 1.3, 2.6

#: plotly.js' config of every dashboard figure (live, finished, ``run.plot()``): the mode bar
#: keeps zoom, pan, reset and the PNG download, and has no control that sends the figure off
#: the machine (plotly.js 4 offers "Share chart..." to Plotly Cloud unless told not to). The
#: front ends enforce the "no upload" part for figures saved without it
#: (``livefigure.js``'s ``plotConfig``, ``labextension/src/figure.ts``).
PLOTLY_CONFIG = {
    "displaylogo": False, "showSendToCloud": False, "plotlyServerURL": "",
    "modeBarButtonsToRemove": ["sendChartToCloud", "sendDataToCloud", "editInChartStudio",
                               "lasso2d", "select2d"],
    "toImageButtonOptions": {"format": "png", "filename": "nbdist-dashboard", "scale": 2},
}
_TOP, _NOTE, _BOTTOM, _GAP = 58, 15, 42, 36   # px: title, a note line, step title, panel title
_TOGGLE = 36         # px: the loss toggle's height above the panels (the notes go above it)


def log_dtick(lo: float, hi: float) -> Any:
    """plotly's dtick for a log axis over [lo, hi] (values): decades when it spans more than
    2.5 of them, else 1-2-5 in each decade ("D2"; labelled in full with tickformat "~g").
    livefigure.js applies the same rule while a run grows."""
    if not (lo > 0 and hi > lo):
        return "D2"
    return 1 if math.log10(hi / lo) > 2.5 else "D2"


def has_data(series: RunSeries, metric: str) -> bool:
    return any(dec.raw for (m, key), dec in series.series.items() if m == metric and key) or (
        series.aggregated and series.aggregates.waiting_with(metric))


def choose_panels(series: RunSeries, strategy: str, final: bool) -> tuple[list[str], list[str]]:
    """(panels to draw, one line per panel left out saying why). Live (``final`` False) a
    panel stays while its data may still come (all-reduce times come on timed steps only)."""
    if not series.per_replica:
        metrics = series.metric_names() or [n for n in series.epoch_names() if n != "val_loss"
                                            and n.startswith("val_")]
        return ["loss", *(["metrics"] if metrics else []), "time"], [
            "model.fit reports the loss and the step time: gradient norms and all-reduce "
            "times are measured in --step cells"]
    shown, notes = ["loss"], []
    if series.aggregated:
        notes.append(f"{series.workers} workers x {series.replicas} replicas: showing median, "
                     "10-90% and min-max bands; run.plot(per_replica=True) draws every line")
    if has_data(series, "grad_norm"):
        shown.append("grad_norm")
    else:
        notes.append("no gradient norm: the step cell has no `grads` (or name them with "
                     "--grads NAME)")
    scale = series.series.get(("loss_scale_factor", None))
    if scale is not None and scale.raw:
        shown.append("loss_scale_factor")
    ranks = series.replicas * series.workers
    fam = find_family(strategy)   # None: a Run loaded from a job's file may name any
    no_allreduce = fam.no_allreduce if fam is not None else None
    if has_data(series, "allreduce_ms") or (not final and ranks > 1 and no_allreduce is None):
        shown.append("allreduce_ms")
    elif ranks == 1:
        notes.append("no all-reduce: one replica has nothing to reduce")
    elif no_allreduce is not None:
        notes.append(f"no all-reduce: {no_allreduce}")
    else:
        notes.append("no all-reduce time was measured in this step")
    return [*shown, "time", *(["heatmap"] if series.aggregated else [])], notes


def axis_names(panels: list[str]) -> dict[str, str]:
    """panel -> its y axis id ("y", "y2"...); every panel shares the x axis "x"."""
    return {p: "y" if i == 0 else f"y{i + 1}" for i, p in enumerate(panels)}


def layout(panels: list[str], title: str, notes: list[str], per_replica: bool) -> dict:
    """The plotly layout: ``panels`` stacked top to bottom on one step axis, legend right."""
    heights = [PANELS[p].height for p in panels]
    plot_h = sum(heights) + _GAP * (len(panels) - 1)
    top = _TOP + _NOTE * len(notes)
    out: dict[str, Any] = {
        "height": top + plot_h + _BOTTOM, "autosize": True, "template": "plotly_white",
        "margin": {"l": 64, "r": 12, "t": top, "b": _BOTTOM}, "uirevision": "nbdist",
        "hovermode": "x unified", "hoversubplots": "axis",
        "hoverlabel": {"font": {"size": 11}, "namelength": -1},
        "legend": {"x": 1.01, "xanchor": "left", "y": 1, "yanchor": "top",
                   "font": {"size": 11}, "tracegroupgap": 3},
        "title": {"text": title, "x": 0.005, "xanchor": "left", "y": 0.995,
                  "yanchor": "top", "yref": "container", "font": {"size": 14}},
        "xaxis": {"anchor": f"y{len(panels)}" if len(panels) > 1 else "y", "domain": [0, 1],
                  "title": {"text": "step", "standoff": 6}, "rangemode": "nonnegative",
                  # at least steps 0-10 on the axis: early ticks are whole steps, never 0.5
                  "autorangeoptions": {"include": [0, 10]}, "hoverformat": ",.0f",
                  "tickformat": ",~g",
                  "showspikes": True, "spikemode": "across", "spikesnap": "cursor",
                  "spikethickness": 1, "spikedash": "dot", "spikecolor": "#888",
                  "zeroline": False},
        "annotations": [],
    }
    for note in notes:      # why a panel is not drawn: one line each, under the title
        add_note(out, note, grow=False)
    top = plot_h
    for panel, axis, h in zip(panels, axis_names(panels).values(), heights, strict=True):
        spec = PANELS[panel]
        lo, hi = (top - h) / plot_h, top / plot_h
        top -= h + _GAP
        name = "yaxis" + axis[1:]
        out[name] = {"domain": [max(0.0, lo), min(1.0, hi)], "anchor": "x",
                     "type": "log" if spec.log else "linear", "zeroline": False,
                     **({"autorange": "reversed"} if panel == "heatmap" else {}),
                     # log axes: 1, 2, 5, 10... labelled in full, never a lone "4" above "10"
                     "tickformat": "~g", "nticks": 6,
                     **({"dtick": "D2"} if spec.log else {}),
                     "title": {"text": spec.unit, "standoff": 4}}
        text = spec.title if panel != "time" or per_replica else "step time per worker"
        out["annotations"].append({
            "name": f"title:{panel}", "text": f"<b>{text}</b>" + (
                f" ({spec.unit})" if spec.unit else ""),
            "x": 0, "xref": "paper", "xanchor": "left", "y": min(1.0, hi), "yref": "paper",
            "yanchor": "bottom", "showarrow": False, "font": {"size": 12}})
    out["updatemenus"] = panel_menus(out, panels)   # client-side: work while the cell runs
    return out


def panel_menus(layout: dict[str, Any], panels: list[str]) -> list[dict[str, Any]]:
    """Above each panel, on its right: linear / log buttons for its y axis, and (with more
    than one panel) a toggle that gives the panel the whole figure, the others folded away,
    and back. The loss panel's sit below plotly's mode bar."""
    axes = axis_names(panels)
    drawn = [p for p in panels if p != "heatmap"]
    scales = []
    for panel in drawn:
        name = "yaxis" + axes[panel][1:]
        scales.append(scale_menu(name, "loss: " if panel == "loss" else "", PANELS[panel].log,
                                 y=layout[name]["domain"][1]))
    if len(panels) == 1:
        return scales
    for menu in scales:
        menu["pad"]["r"] = _EXPAND_W
    out = []
    for k, panel in enumerate(drawn):
        out += [scales[k], _expand_toggle(layout, panel, "yaxis" + axes[panel][1:], k, scales)]
    return out


_EXPAND_W = 62   # px: the expand toggle, right of a panel's linear / log buttons


def _expand_toggle(layout: dict[str, Any], panel: str, axis: str, k: int,
                   scales: list[dict[str, Any]]) -> dict[str, Any]:
    """Panel ``panel``'s toggle (the ``k``-th panel with buttons; menus are in pairs, its
    scale buttons then this toggle): its args give the panel the plot's whole height and
    hide the other panels' axes, titles and buttons; its args2 put back ``layout``'s."""
    mine, back = {}, {}
    for name, value in layout.items():
        if name.startswith("yaxis"):
            mine[f"{name}.domain"] = [0, 1] if name == axis else [0, 0]
            mine[f"{name}.visible"] = name == axis
            back[f"{name}.domain"] = list(value["domain"])
            back[f"{name}.visible"] = True
    for i, note in enumerate(layout["annotations"]):
        if note.get("name", "").startswith("title:"):
            own = note["name"] == f"title:{panel}"
            mine[f"annotations[{i}].visible"] = own
            if own:   # the hidden ones keep their place: args2 shows them there again
                mine[f"annotations[{i}].y"] = 1
            back[f"annotations[{i}].visible"] = True
            back[f"annotations[{i}].y"] = note["y"]
    for j, menu in enumerate(scales):
        for index in (2 * j, 2 * j + 1):
            mine[f"updatemenus[{index}].visible"] = j == k
            if j == k:
                mine[f"updatemenus[{index}].y"] = 1
            back[f"updatemenus[{index}].visible"] = True
            back[f"updatemenus[{index}].y"] = menu["y"]
    return {"name": f"expand:{axis}", "type": "buttons", "showactive": True, "active": -1,
            "x": 1.0, "xanchor": "right", "y": scales[k]["y"], "yanchor": "bottom",
            "pad": {"b": 2}, "font": {"size": 10},
            "buttons": [{"label": "⤢ expand", "method": "relayout", "args": [mine],
                         "args2": [back]}]}


def add_note(layout: dict[str, Any], text: str, grow: bool = True) -> None:
    """One more line under the figure's title, full width (clear of the panel titles and the
    loss toggle); ``grow``: the figure grows by that line (``layout`` made room already)."""
    notes = next((a for a in layout["annotations"] if a.get("name") == "notes"), None)
    if notes is None:
        notes = {"name": "notes", "text": "", "x": 0, "xref": "paper", "xanchor": "left",
                 "y": 1, "yref": "paper", "yanchor": "bottom", "yshift": _TOGGLE,
                 "align": "left",
                 "showarrow": False, "font": {"size": 11, "color": "#666"}}
        layout["annotations"].insert(0, notes)
    notes["text"] = f"{notes['text']}<br>{text}" if notes["text"] else text
    if grow:
        layout["margin"]["t"] += _NOTE
        layout["height"] += _NOTE


def _hover(panel: str) -> str:
    spec = PANELS[panel]
    unit = f" {spec.unit}" if spec.unit else ""
    return f"%{{y:.4g}}{unit} <span style='color:#888'>{spec.short}</span>"


def replica_line(label: str, index: int, panel: str, yaxis: str, legend: bool
                 ) -> dict[str, Any]:
    return {"type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
            "showlegend": legend, "xaxis": "x", "yaxis": yaxis,
            "line": {"width": REPLICA_WIDTH, "color": PALETTE[index % len(PALETTE)]},
            "opacity": 0.8, "hovertemplate": _hover(panel)}


def aggregate_line(name: str, yaxis: str, label: str | None = None) -> dict[str, Any]:
    agg = AGGREGATES[name]
    label = label or agg.label
    return {"type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
            "xaxis": "x", "yaxis": yaxis, "hovertemplate": _hover(agg.panel),
            "line": {"width": AGGREGATE_WIDTH, "color": agg.color, "dash": agg.dash}}


def metric_line(label: str, index: int, yaxis: str) -> dict[str, Any]:
    """A compiled metric of a fit, per batch (Keras' running mean over the epoch)."""
    return {"type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
            "xaxis": "x", "yaxis": yaxis,
            "line": {"width": REPLICA_WIDTH + 0.4, "color": PALETTE[index % len(PALETTE)]},
            "hovertemplate": f"%{{y:.4g}} <span style='color:#888'>{label}</span>"}


def running_loss_line(yaxis: str) -> dict[str, Any]:
    """Keras' own per-batch loss log (the running mean over the epoch), faint under the
    per-batch loss: the number its progress bar shows."""
    label = "loss, Keras' running mean over the epoch"
    return {"type": "scatter", "mode": "lines", "name": label, "legendgroup": label,
            "xaxis": "x", "yaxis": yaxis, "opacity": 0.7,
            "line": {"width": 1.2, "color": "#999999", "dash": "dot"},
            "hovertemplate": "%{y:.4g} <span style='color:#888'>running mean</span>"}


def epoch_points(label: str, color: str, yaxis: str) -> dict[str, Any]:
    """One number per epoch (validation...), at each epoch's last step: markers joined by a
    dashed line."""
    return {"type": "scatter", "mode": "lines+markers", "name": label, "legendgroup": label,
            "xaxis": "x", "yaxis": yaxis,
            "line": {"width": 1.5, "color": color, "dash": "dash"},
            "marker": {"size": 7, "color": color, "symbol": "diamond"},
            "hovertemplate": f"%{{y:.4g}} <span style='color:#888'>{label}</span>"}


def straggler_marks(yaxis: str) -> dict[str, Any]:
    return {"type": "scatter", "mode": "markers", "name": "stragglers", "legendrank": 2000,
            "marker": {"symbol": "x", "size": 11, "color": "#d62728", "line": {"width": 2}},
            "xaxis": "x", "yaxis": yaxis, "hovertemplate": "%{text}", "text": []}


def band_traces(panel: str, yaxis: str, legend: bool) -> list[tuple[str, dict[str, Any]]]:
    """(stat, trace) of an aggregated panel: each band as a lower edge then an upper edge
    filled down to it, then the median line."""
    out = []
    for lo, hi, label, color in BANDS:
        edge = {"type": "scatter", "mode": "lines", "xaxis": "x", "yaxis": yaxis,
                "legendgroup": label, "line": {"width": 0, "color": color}}
        out.append((lo, {**edge, "name": f"{label} low", "showlegend": False,
                         "hoverinfo": "skip"}))
        out.append((hi, {**edge, "name": f"{label} of replicas", "showlegend": legend,
                         "fill": "tonexty", "fillcolor": color, "hoverinfo": "skip"}))
    out.append(("median", {"type": "scatter", "mode": "lines", "name": "median of replicas",
                           "legendgroup": "median", "showlegend": legend, "xaxis": "x",
                           "yaxis": yaxis, "hovertemplate": _hover(panel),
                           "line": {"width": 2, "color": "#1f77b4"}}))
    return out


def heatmap(yaxis: str, y0: float, y1: float) -> dict[str, Any]:
    return {"type": "heatmap", "name": "compute time per worker", "xaxis": "x", "yaxis": yaxis,
            "colorscale": "Viridis", "z": [], "x": [],
            "colorbar": {"title": {"text": "ms"}, "thickness": 10, "len": y1 - y0,
                         "y": (y0 + y1) / 2, "yanchor": "middle", "x": 1.0},
            "hovertemplate": "worker %{y}: %{z:.3g} ms<extra></extra>"}
