"""Drawing a GraphView with plotly: the graph (one marker trace per device, collective ops as
red diamonds joined to their peers by a dashed line) above a table of op counts per device.
plotly and pandas are imported only when a figure or a table is asked for.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from ..words import count
from .layout import Node
from .walk import TRANSFER_OPS, UNPINNED, Op, is_collective

_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
            "#bcbd22", "#393b79", "#637939")
_COLLECTIVE_COLOR = "#d62728"


def op_counts(ops: list[Op], devices: list[str]) -> Any:
    """A DataFrame: per device, the number of ops, collective ops and the commonest types."""
    import pandas as pd

    rows = []
    for dev in devices:
        mine = [op for op in ops if op.label == dev]
        types = Counter(op.type for op in mine)
        rows.append({
            "device": dev, "ops": len(mine),
            "collective ops": sum(n for t, n in types.items() if is_collective(t)),
            "commonest op types": ", ".join(f"{t} {n}" for t, n in types.most_common(4)),
        })
    columns = ["device", "ops", "collective ops", "commonest op types"]
    return pd.DataFrame(rows, columns=columns).set_index("device")


def graph_figure(view: Any) -> Any:
    """Graph (edges with arrowheads, one marker trace per device, collectives on top) above
    a table of op counts per device. ``view``: the GraphView to draw."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    pos, devices = view.positions(), view.devices
    color = {d: "#9e9e9e" if d == UNPINNED else _PALETTE[i % len(_PALETTE)]
             for i, d in enumerate(devices)}
    by_id = {n.id: n for n in view.nodes}
    fig = make_subplots(rows=2, cols=1, row_heights=[0.8, 0.2], vertical_spacing=0.03,
                        specs=[[{"type": "xy"}], [{"type": "table"}]])
    kinds: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in
                                                  ("tensors", "control", "collective")}
    for (a, b), (n_data, _n_control) in view.node_edges.items():
        kind = ("collective" if by_id[a].collective or by_id[b].collective
                else "tensors" if n_data else "control")
        (x0, y0), (x1, y1) = pos[a], pos[b]
        xs, ys, sizes = kinds[kind]
        xs += [x0, x0 + 0.85 * (x1 - x0), x1, None]
        ys += [y0, y0 + 0.85 * (y1 - y0), y1, None]
        sizes += [0, 7, 0, 0]
    styles = {"tensors": ("#b0b0b0", "solid", "tensors (edges)"),
              "control": ("#d0d0d0", "dot", "control dependencies"),
              "collective": ("#f4a5a5", "solid", "tensors into/out of collectives")}
    for kind, (xs, ys, sizes) in kinds.items():
        if xs:
            line_color, dash, label = styles[kind]
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines+markers", name=label, hoverinfo="skip",
                line={"width": 1, "color": line_color, "dash": dash},
                marker={"symbol": "arrow", "angleref": "previous", "size": sizes,
                        "color": line_color}), row=1, col=1)
    peers = [(a, b) for a, b in view.peers() if a in pos and b in pos]
    if peers:
        xs, ys = [], []
        for a, b in peers:
            xs += [pos[a][0], pos[b][0], None]
            ys += [pos[a][1], pos[b][1], None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="talk to each other",
                                 hoverinfo="skip", line={"width": 2, "dash": "dash",
                                                         "color": _COLLECTIVE_COLOR}),
                      row=1, col=1)
    labels = len(view.nodes) <= 60
    for dev in devices:
        for collective in (False, True):
            nodes = [n for n in view.nodes if n.device == dev and n.collective == collective]
            if not nodes:
                continue
            fig.add_trace(go.Scatter(
                x=[pos[n.id][0] for n in nodes], y=[pos[n.id][1] for n in nodes],
                mode="markers+text" if labels or collective else "markers",
                text=[n.name for n in nodes], textposition="top center",
                textfont={"size": 9, "color": _COLLECTIVE_COLOR if collective else "#444"},
                hovertext=[_hover(n) for n in nodes], hoverinfo="text",
                name=f"{dev} communication" if collective else dev,
                legendgroup=dev, marker={
                    "color": color[dev], "size": [_size(n) + 6 * collective for n in nodes],
                    "symbol": ["diamond" if collective else "square" if len(n.ops) > 1
                               else "circle" for n in nodes],
                    "line": {"width": 3 if collective else 0.5,
                             "color": _COLLECTIVE_COLOR if collective else "white"}}),
                row=1, col=1)
    lanes = defaultdict(list)
    for n in view.nodes:
        lanes[n.device].append(pos[n.id][1])
    fig.update_yaxes(tickvals=[(min(lanes[d]) + max(lanes[d])) / 2 for d in devices],
                     ticktext=[f"<b>{d}</b>" for d in devices], showgrid=False,
                     zeroline=False, row=1, col=1)
    fig.update_xaxes(title_text="dataflow order (layer) →", showgrid=False, zeroline=False,
                     showticklabels=False, row=1, col=1)
    table = view.summary.reset_index()
    fig.add_trace(go.Table(
        header={"values": [f"<b>{c}</b>" for c in table.columns], "align": "left"},
        cells={"values": [table[c].tolist() for c in table.columns], "align": "left"},
        columnwidth=[1, 0.6, 0.8, 3]), row=2, col=1)
    rows = 1 - min(y for _, y in pos.values()) if pos else 1
    collapsed = (f"<br><sup>{len(view.ops)} ops collapsed by name scope (depth {view.depth}) "
                 f"into {len(view.nodes)} nodes; squares are scopes</sup>"
                 if view.collapsed else "")
    fig.update_layout(
        title={"text": f"<b>{view.name}</b>: {len(view.ops)} ops, {len(view.edges)} edges, "
                       f"{count(len(devices), 'device')}, "
                       f"{count(len(view.collectives), 'collective op')}"
                       f"{_transfers(view)}"
                       f"{collapsed}", "x": 0.01},
        height=int(min(1100, max(460, 260 + 22 * rows + 30 * len(devices)))),
        margin={"l": 10, "r": 10, "t": 70, "b": 10}, plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.02 + 0.2, "yanchor": "bottom"},
        hoverlabel={"align": "left"})
    return fig


def _transfers(view: Any) -> str:
    n = sum(op.type in TRANSFER_OPS for op in view.ops)
    return f", {count(n, 'send/recv op')}" if n else ""


def _size(node: Node) -> float:
    return 10 if len(node.ops) == 1 else 10 + 3 * math.log2(len(node.ops))


def _hover(node: Node) -> str:
    if len(node.ops) == 1:
        op = node.ops[0]
        where = op.device or "no device: TensorFlow's placer picks one at run time"
        inside = f"<br>inside function {op.function}" if op.function else ""
        return f"<b>{op.id}</b><br>{op.type}<br>{where}{inside}"
    types = Counter(op.type for op in node.ops).most_common(6)
    scope = node.id.split("@", 1)[0]
    return (f"<b>{scope}</b> on {node.device}<br>{len(node.ops)} ops: "
            + ", ".join(f"{t} {n}" for t, n in types))
