"""Pictures of TensorFlow dataflow graphs: ops as nodes, tensors as edges, colored by device.

    view = nbdist.show_graph(train_step, batch)   # a tf.function and its arguments
    view.summary                                  # op counts per device (a DataFrame)

``graph_view`` traces a ``tf.function`` (or takes a ConcreteFunction or a ``tf.Graph``), walks
its GraphDef and the bodies of the functions it calls (``StatefulPartitionedCall``, the
``cond``/``body`` of ``While``, the branches of ``If``...) and lays the ops out left to right in
one horizontal lane per device, collective ops (``CollectiveReduceV2``, ``NcclAllReduce``...)
drawn as red diamonds with a dashed line between the peers of one collective. Graphs with
more than ``max_nodes`` ops are collapsed by name scope (a square stands for every op of one
scope on one device) until the picture fits; collective ops are never collapsed.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GraphView", "StepGraph", "device_label", "graph_view", "is_collective",
           "show_graph"]

#: Ops that move data between devices or workers as one group operation.
COLLECTIVE_OPS = frozenset({
    "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGather",
    "CollectiveGatherV2", "CollectiveBcastSend", "CollectiveBcastRecv", "CollectiveBcastSendV2",
    "CollectiveBcastRecvV2", "CollectiveAllToAllV2", "CollectiveAllToAllV3",
    "CollectiveReduceScatterV2", "NcclAllReduce", "NcclReduce", "NcclBroadcast",
    "_NcclReduceSend", "_NcclReduceRecv", "_NcclBroadcastSend", "_NcclBroadcastRecv",
    "CrossReplicaSum", "AllToAll", "CollectivePermute", "XlaAllReduce", "XlaReduceScatter",
})
#: Point-to-point transfers the runtime inserts where an edge crosses devices.
TRANSFER_OPS = frozenset({"_Send", "_Recv", "_HostSend", "_HostRecv"})
_CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
UNPINNED = "(no device)"   # ops the placer puts somewhere at run time
_DEVICE_RE = re.compile(r"/(job|replica|task|device|cpu|gpu|tpu):([^/]*)", re.IGNORECASE)
_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
            "#bcbd22", "#393b79", "#637939")
_COLLECTIVE_COLOR = "#d62728"


def is_collective(op_type: str) -> bool:
    """True for ops that exchange data between replicas (all-reduce, gather, broadcast...)."""
    return op_type in COLLECTIVE_OPS


def device_label(device: str) -> str:
    """A short name for a device string: ``CPU:1``, ``worker:0/GPU:1``, or ``(no device)``.

    ``/job:localhost/replica:0/task:0/device:CPU:1`` -> ``CPU:1``; legacy ``/cpu:0`` too.
    """
    if not device:
        return UNPINNED
    parts: dict[str, str] = {}
    for key, value in _DEVICE_RE.findall(device):
        key = key.lower()
        if key in ("cpu", "gpu", "tpu"):
            key, value = "device", f"{key.upper()}:{value}"
        parts[key] = value
    dev = parts.get("device", "")
    if dev.count(":") == 1:
        kind, index = dev.split(":")
        dev = f"{kind.upper()}:{index}"
    job = parts.get("job")
    if job and job != "localhost":
        where = f"{job}:{parts.get('task', '0')}"
        return f"{where}/{dev}" if dev else where
    return dev or device


@dataclass
class Op:
    """One op of the (flattened) graph. ``id`` is its name with the calls it sits in."""

    id: str
    type: str
    device: str            # the raw device string ('' when not pinned)
    function: str = ""     # the nested function it belongs to ('' for the top graph)
    tensor: str = ""       # _Send/_Recv: the tensor they move (pairs a send with its recv)

    @property
    def label(self) -> str:
        return device_label(self.device)


@dataclass
class Node:
    """One drawn node: an op, or (collapsed) all ops of a name scope on one device."""

    id: str
    name: str
    device: str            # device label
    ops: list[Op] = field(default_factory=list)

    @property
    def collective(self) -> bool:
        """A collective or a send/recv: drawn highlighted, never collapsed."""
        return any(_communicates(op.type) for op in self.ops)

    @property
    def type(self) -> str:
        return self.ops[0].type if len(self.ops) == 1 else "group"


# -- walking the graph ----------------------------------------------------------------------

class _Walker:
    """Flattens a GraphDef and the function bodies it calls into ops and tensor edges."""

    def __init__(self, library: Any, expand: bool):
        self.functions = {f.signature.name: f for f in library.function}
        self.expand = expand
        self.ops: dict[str, Op] = {}
        self.edges: list[tuple[str, str, bool]] = []   # (producer, consumer, control?)

    def walk(self, nodes: Any, prefix: str, device: str, args: dict[str, list[str]],
             function: str, depth: int = 0) -> Callable[[str], list[str]]:
        """Add ``nodes`` (NodeDefs of one graph or function body); return a resolver of
        ``name:output`` references to the ids of the ops that produce them."""
        by_name = {n.name: n for n in nodes}
        outputs: dict[str, dict[int, list[str]]] = {}   # inlined call -> output index -> ids

        def resolve(ref: str) -> list[str]:
            parts = ref.lstrip("^").split(":")
            name = parts[0]
            if name in outputs:                    # an inlined call: who produced output k
                k = _output_index(parts, by_name[name], self.functions)
                return outputs[name].get(k, [])
            if name in by_name:
                return [prefix + name]
            return list(args.get(name, []))

        for node in _topological(nodes):
            dev = node.device or device
            inputs = [(resolve(ref), ref.startswith("^")) for ref in node.input]
            body = self._called(node)
            if self.expand and body is not None and depth < 20:
                fdef = self.functions[body]
                data = [src for src, control in inputs if not control]
                sub_args = {a.name: src for a, src in
                            zip(fdef.signature.input_arg, data, strict=False)}
                inner = self.walk(fdef.node_def, f"{prefix}{node.name}/", dev, sub_args,
                                  body, depth + 1)
                outputs[node.name] = {k: inner(fdef.ret[o.name])
                                      for k, o in enumerate(fdef.signature.output_arg)}
                continue
            op_id = prefix + node.name
            tensor = node.attr["tensor_name"].s.decode() if node.op in TRANSFER_OPS else ""
            self.ops[op_id] = Op(op_id, node.op, dev, function, tensor)
            for sources, control in inputs:
                self.edges += [(s, op_id, control) for s in sources]
            if self.expand and depth < 20:
                self._expand_bodies(node, op_id, dev, inputs, depth)
        return resolve

    def _called(self, node: Any) -> str | None:
        """The function a call op runs (inlined in the picture), else None."""
        if node.op in self.functions:
            return node.op
        if node.op in _CALL_OPS and node.attr["f"].func.name in self.functions:
            return node.attr["f"].func.name
        return None

    def _expand_bodies(self, node: Any, op_id: str, device: str, inputs: list, depth: int):
        """Draw the bodies of While/If/Case (and any op with function attributes) next to
        the op: its inputs feed the bodies' arguments, the bodies' results feed the op."""
        data = [src for src, control in inputs if not control]
        skip = 1 if node.op in ("If", "StatelessIf", "Case", "StatelessCase") else 0
        for attr_name in sorted(node.attr):
            value = node.attr[attr_name]
            names = [value.func.name] if value.HasField("func") else \
                [f.name for f in value.list.func]
            for i, fname in enumerate(n for n in names if n in self.functions):
                fdef = self.functions[fname]
                known = node.op.removeprefix("Stateless") in ("While", "If", "Case")
                sub_args = {a.name: (data[skip + j] if known and skip + j < len(data)
                                     else [op_id])
                            for j, a in enumerate(fdef.signature.input_arg)}
                tag = attr_name if len(names) == 1 else f"{attr_name}_{i}"
                inner = self.walk(fdef.node_def, f"{op_id}/{tag}/", device, sub_args, fname,
                                  depth + 1)
                body_prefix = f"{op_id}/{tag}/"
                for out in fdef.signature.output_arg:   # (arguments passed through: skipped)
                    self.edges += [(s, op_id, False) for s in inner(fdef.ret[out.name])
                                   if s.startswith(body_prefix)]


def _output_index(parts: list[str], node: Any, functions: dict[str, Any]) -> int:
    """Flat output index of ``name:k`` (GraphDef) or ``name:out_arg:k`` (FunctionDef)."""
    if len(parts) == 1:
        return 0
    if len(parts) == 2:
        return int(parts[1])
    fdef = functions.get(node.op)   # a direct call op: its outputs are the function's
    if fdef is not None:
        names = [o.name for o in fdef.signature.output_arg]
        return names.index(parts[1]) if parts[1] in names else 0
    return int(parts[2])


def _topological(nodes: Any) -> list[Any]:
    """NodeDefs producers-first (graph order for whatever is left in a cycle)."""
    nodes = list(nodes)
    names = {n.name for n in nodes}
    deps = {n.name: {r.lstrip("^").split(":")[0] for r in n.input} & names for n in nodes}
    users: dict[str, list[str]] = defaultdict(list)
    for name, ds in deps.items():
        for d in ds:
            users[d].append(name)
    count = {name: len(ds) for name, ds in deps.items()}
    by_name = {n.name: n for n in nodes}
    ready = [n.name for n in nodes if not count[n.name]]
    order: list[Any] = []
    while ready:
        name = ready.pop()
        order.append(by_name[name])
        for user in users[name]:
            count[user] -= 1
            if count[user] == 0:
                ready.append(user)
    seen = {n.name for n in order}
    return order + [n for n in nodes if n.name not in seen]


# -- the view -------------------------------------------------------------------------------

class GraphView:
    """A traced graph, flattened (``ops``, ``edges``) and ready to draw (``nodes``,
    ``node_edges``, ``figure``). Build it with ``graph_view`` or ``show_graph``."""

    def __init__(self, graph_def: Any, *, name: str = "graph", max_nodes: int = 80,
                 expand_functions: bool = True, hide_types: tuple[str, ...] = ()):
        walker = _Walker(graph_def.library, expand_functions)
        walker.walk(graph_def.node, "", "", {}, "")
        hidden = {i for i, op in walker.ops.items() if op.type in hide_types}
        self.name = name
        self.ops: list[Op] = [op for i, op in walker.ops.items() if i not in hidden]
        self.edges: list[tuple[str, str, bool]] = [
            e for e in walker.edges if e[0] not in hidden and e[1] not in hidden
            and e[0] in walker.ops]
        self.max_nodes = max_nodes
        self.depth, self.nodes = _collapse(self.ops, self.edges, max_nodes)
        self.node_edges = _node_edges(self.nodes, self.edges)
        self._positions: dict[str, tuple[float, float]] | None = None

    # -- facts --------------------------------------------------------------------------
    @property
    def devices(self) -> list[str]:
        """Device labels of the graph's ops, in lane order."""
        return _device_order({op.label for op in self.ops})

    @property
    def collectives(self) -> list[Op]:
        return [op for op in self.ops if is_collective(op.type)]

    @property
    def collapsed(self) -> bool:
        return len(self.nodes) < len(self.ops)

    @property
    def summary(self) -> Any:
        """A DataFrame: per device, the number of ops, collective ops and the commonest types."""
        import pandas as pd

        rows = []
        for dev in self.devices:
            mine = [op for op in self.ops if op.label == dev]
            types = Counter(op.type for op in mine)
            rows.append({
                "device": dev, "ops": len(mine),
                "collective ops": sum(n for t, n in types.items() if is_collective(t)),
                "commonest op types": ", ".join(f"{t} {n}" for t, n in types.most_common(4)),
            })
        columns = ["device", "ops", "collective ops", "commonest op types"]
        return pd.DataFrame(rows, columns=columns).set_index("device")

    def peers(self) -> list[tuple[str, str]]:
        """Pairs of ops that talk to each other across devices: the k-th collective of each
        type on one device with the k-th on the next one; a _Send with its _Recv."""
        ordinal: dict[tuple[str, int], list[Op]] = defaultdict(list)
        seen: Counter = Counter()
        for op in self.collectives:
            key = (op.type, op.label)
            ordinal[(op.type, seen[key])].append(op)
            seen[key] += 1
        pairs = []
        devices = self.devices
        for ops in ordinal.values():
            ops = sorted(ops, key=lambda o: devices.index(o.label))
            pairs += [(a.id, b.id) for a, b in zip(ops, ops[1:], strict=False)
                      if a.label != b.label]
        sends = {op.tensor: op for op in self.ops if op.type in ("_Send", "_HostSend")}
        pairs += [(sends[op.tensor].id, op.id) for op in self.ops
                  if op.type in ("_Recv", "_HostRecv") and op.tensor in sends]
        return pairs

    def __repr__(self) -> str:
        shown = f", drawn as {len(self.nodes)} nodes" if self.collapsed else ""
        return (f"<GraphView {self.name!r}: {len(self.ops)} ops, {len(self.edges)} edges on "
                f"{len(self.devices)} device(s), {len(self.collectives)} collective op(s)"
                f"{shown}>")

    # -- drawing ------------------------------------------------------------------------
    def positions(self) -> dict[str, tuple[float, float]]:
        """Node id -> (x, y): x is the dataflow layer, one horizontal lane per device."""
        if self._positions is None:
            owner = {op.id: node.id for node in self.nodes for op in node.ops}
            groups: dict[str, list[str]] = {}
            for a, b in self.peers():
                group = groups.get(owner[a]) or groups.setdefault(owner[a], [owner[a]])
                group.append(owner[b])
                groups[owner[b]] = group
            align = list({id(g): g for g in groups.values()}.values())
            self._positions = _layout(self.nodes, self.node_edges, self.devices, align)
        return self._positions

    @property
    def figure(self) -> Any:
        """The plotly Figure: the graph on top, op counts per device below."""
        return _figure(self)

    def show(self) -> GraphView:
        """Display the figure (plotly's mimetype, HTML with plotly.js from its CDN as the
        fallback) under the cell; outside IPython, print the summary."""
        import json

        try:
            from IPython import get_ipython
            from IPython.display import display
        except ImportError:   # plain Python
            get_ipython = None   # noqa: N806
        if get_ipython is None or get_ipython() is None:
            print(repr(self), self.summary, sep="\n")
            return self
        fig = self.figure
        display({"application/vnd.plotly.v1+json": json.loads(fig.to_json()),
                 "text/html": fig.to_html(include_plotlyjs="cdn", full_html=False),
                 "text/plain": repr(self)}, raw=True)
        return self


def _collapse(ops: list[Op], edges: list[tuple[str, str, bool]],
              max_nodes: int) -> tuple[int | None, list[Node]]:
    """One node per op if they fit, else group by (name scope, device) at the deepest scope
    depth that fits: a constant joins the group of its first user, ``replica_N/`` prefixes
    are ignored (the device already tells replicas apart), collective ops stay alone."""
    if len(ops) <= max_nodes:
        return None, [Node(op.id, _op_name(op), op.label, [op]) for op in ops]
    by_id = {op.id: op for op in ops}
    user: dict[str, str] = {}
    for src, dst, control in edges:
        if not control and src in by_id and dst in by_id:
            user.setdefault(src, dst)
    deepest = max(op.id.count("/") for op in ops)
    for depth in range(deepest, -1, -1):
        groups: dict[str, list[Op]] = {}
        for op in ops:
            owner = by_id.get(user.get(op.id, "")) if op.type == "Const" else None
            if owner is None or _communicates(owner.type) or owner.label != op.label:
                owner = op
            groups.setdefault(_group_key(owner, depth), []).append(op)
        if len(groups) <= max_nodes or depth == 0:
            break
    nodes = []
    for key, members in groups.items():
        name = key.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1] or key
        if len(members) > 1:
            name = f"{name} ({len(members)} ops)"
        elif key == members[0].id:
            name = _op_name(members[0])
        nodes.append(Node(key, name, members[0].label, members))
    return depth, nodes


_REPLICA_SCOPE = re.compile(r"^replica_\d+$")


def _op_name(op: Op) -> str:
    return op.type if op.type in TRANSFER_OPS else op.id.rsplit("/", 1)[-1]


def _communicates(op_type: str) -> bool:
    return op_type in COLLECTIVE_OPS or op_type in TRANSFER_OPS


def _group_key(op: Op, depth: int) -> str:
    if _communicates(op.type):
        return op.id
    scope = [p for p in op.id.split("/")[:-1] if not _REPLICA_SCOPE.match(p)]
    if not scope:
        return f"{op.type}@{op.label}"          # unscoped ops: one node per type and device
    if depth == 0 or len(scope) >= depth:
        return "/".join(scope[:max(depth, 1)]) + f"/@{op.label}"
    return op.id


def _node_edges(nodes: list[Node], edges: list[tuple[str, str, bool]]) -> dict:
    """(from node, to node) -> [tensor edges, control edges], self-loops dropped."""
    owner = {op.id: node.id for node in nodes for op in node.ops}
    out: dict[tuple[str, str], list[int]] = {}
    for src, dst, control in edges:
        a, b = owner.get(src), owner.get(dst)
        if a is None or b is None or a == b:
            continue
        out.setdefault((a, b), [0, 0])[int(control)] += 1
    return out


def _device_order(labels: set[str]) -> list[str]:
    def key(label: str) -> tuple:
        return (label == UNPINNED, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)",
                                                                                   label)])
    return sorted(labels, key=key)


def _layout(nodes: list[Node], edges: dict, devices: list[str],
            align: list[list[str]]) -> dict[str, tuple[float, float]]:
    """Layered layout: x = longest path from the inputs (cycles broken; nodes of one ``align``
    group share a layer), y = device lane, then barycentre order in each lane and layer."""
    ids = [n.id for n in nodes]
    succ: dict[str, list[str]] = defaultdict(list)
    pred: dict[str, list[str]] = defaultdict(list)
    for a, b in _acyclic(ids, list(edges)):
        succ[a].append(b)
        pred[b].append(a)
    order = _kahn(ids, succ, pred)
    layer = dict.fromkeys(ids, 0)
    for _ in range(3):         # longest path; the peers of one collective share a layer
        for n in order:
            layer[n] = max([layer[n], *(layer[p] + 1 for p in pred[n])])
        for group in align:
            top = max(layer[n] for n in group)
            for n in group:
                layer[n] = top
    for n in ids:                             # inputs and constants next to their first user
        if not pred[n] and succ[n]:
            layer[n] = max(0, min(layer[s] for s in succ[n]) - 1)
    lane = {n.id: devices.index(n.device) for n in nodes}
    cells: dict[tuple[int, int], list[str]] = defaultdict(list)
    for n in ids:
        cells[(lane[n], layer[n])].append(n)
    slot = {n: float(i) for members in cells.values() for i, n in enumerate(members)}
    for _ in range(4):                        # barycentre sweeps
        for (ln, _), members in sorted(cells.items(), key=lambda kv: kv[0][1]):
            members.sort(key=lambda n, ln=ln: _barycentre(n, ln, slot, lane, pred, succ))
            for i, n in enumerate(members):
                slot[n] = float(i)
    height = [max((len(m) for (ln, _), m in cells.items() if ln == i), default=1)
              for i in range(len(devices))]
    top = [sum(height[:i]) + 1.5 * i for i in range(len(devices))]
    return {n: (float(layer[n]), -(top[lane[n]] + slot[n]
                                   + (height[lane[n]] - len(cells[(lane[n], layer[n])])) / 2))
            for n in ids}


def _barycentre(n: str, ln: int, slot: dict, lane: dict, pred: dict, succ: dict) -> float:
    near = [slot[m] for m in pred[n] + succ[n] if lane[m] == ln]
    return sum(near) / len(near) if near else slot[n]


def _acyclic(ids: list[str], edges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The edges minus the back edges of an iterative depth-first search."""
    succ: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    state: dict[str, int] = {}   # 1 on the stack, 2 done
    back: set[tuple[str, str]] = set()
    for root in ids:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(succ[root]))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                back.add((node, nxt))
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(succ[nxt])))
    return [e for e in edges if e not in back]


def _kahn(ids: list[str], succ: dict, pred: dict) -> list[str]:
    count = {n: len(pred[n]) for n in ids}
    ready = [n for n in ids if not count[n]]
    order = []
    while ready:
        n = ready.pop()
        order.append(n)
        for s in succ[n]:
            count[s] -= 1
            if count[s] == 0:
                ready.append(s)
    return order


def _figure(view: GraphView) -> Any:
    """Graph (edges with arrowheads, one marker trace per device, collectives on top) above
    a table of op counts per device."""
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
                       f"{len(devices)} device(s), {len(view.collectives)} collective op(s)"
                       f"{_transfers(view)}"
                       f"{collapsed}", "x": 0.01},
        height=int(min(1100, max(460, 260 + 22 * rows + 30 * len(devices)))),
        margin={"l": 10, "r": 10, "t": 70, "b": 10}, plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.02 + 0.2, "yanchor": "bottom"},
        hoverlabel={"align": "left"})
    return fig


def _transfers(view: GraphView) -> str:
    count = sum(op.type in TRANSFER_OPS for op in view.ops)
    return f", {count} send/recv op(s)" if count else ""


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


# -- entry points ---------------------------------------------------------------------------

def _graph_def(fn: Any, args: tuple, kwargs: dict) -> tuple[Any, str]:
    """The GraphDef (with its function library) of ``fn`` traced on ``args``."""
    import tensorflow as tf

    if isinstance(fn, tf.Graph):
        return fn.as_graph_def(), "graph"
    if isinstance(fn, tf.compat.v1.GraphDef):
        return fn, "graph"
    if isinstance(fn, (list, tuple)) and fn and all(
            isinstance(g, tf.compat.v1.GraphDef) for g in fn):   # e.g. partition graphs
        merged = tf.compat.v1.GraphDef()
        for part in fn:
            merged.node.extend(part.node)
            merged.library.function.extend(part.library.function)
        return merged, f"{len(fn)} partitions"
    graph = getattr(fn, "graph", None)
    if isinstance(graph, tf.Graph):                 # a ConcreteFunction
        return graph.as_graph_def(), getattr(fn, "name", "graph")
    inner = getattr(fn, "tf_function", None)       # e.g. nbdist's timed step wrapper
    if inner is not None:
        fn = inner
    if not hasattr(fn, "get_concrete_function"):
        if not callable(fn):
            raise TypeError(
                f"show_graph needs a tf.function, a ConcreteFunction or a tf.Graph, got "
                f"{type(fn).__name__}. Decorate the function with @tf.function and pass it "
                "with example arguments: `nbdist.show_graph(step, batch)`.")
        fn = tf.function(fn)
    concrete = fn.get_concrete_function(*args, **kwargs)
    return concrete.graph.as_graph_def(), getattr(fn, "__name__", None) or concrete.name


def graph_view(fn: Any, *args: Any, max_nodes: int = 80, expand_functions: bool = True,
               hide_types: tuple[str, ...] = (), **kwargs: Any) -> GraphView:
    """Trace ``fn(*args, **kwargs)`` (a tf.function, or a plain function, which is wrapped in
    one; a ConcreteFunction or tf.Graph is taken as is) and return its GraphView.

    ``max_nodes``: collapse by name scope above this many ops. ``expand_functions``: draw
    the bodies of called functions and control flow (default) or only the top graph.
    ``hide_types``: op types to leave out (e.g. ``("Const", "NoOp")``).
    """
    if max_nodes < 1:
        raise ValueError(f"max_nodes={max_nodes}: give at least 1 (default 80).")
    graph_def, name = _graph_def(fn, args, kwargs)
    return GraphView(graph_def, name=name, max_nodes=max_nodes,
                     expand_functions=expand_functions, hide_types=tuple(hide_types))


def show_graph(fn: Any, *args: Any, max_nodes: int = 80, expand_functions: bool = True,
               hide_types: tuple[str, ...] = (), **kwargs: Any) -> GraphView:
    """Draw the dataflow graph of ``fn`` traced on ``args`` and return its GraphView.

    Ops are nodes and tensors are edges; each device has a lane and a color, collective ops
    are red diamonds joined to their peers by a dashed line, and the table below counts the
    ops per device. See ``graph_view`` for the options.
    """
    return graph_view(fn, *args, max_nodes=max_nodes, expand_functions=expand_functions,
                      hide_types=hide_types, **kwargs).show()




class StepGraph:
    """Run observer of ``%%distribute --step --graph``: keeps the concrete function of the
    compiled step (the untimed variant when there is one) and draws it when the cell ends."""

    def __init__(self, **options: Any):
        self.options = options
        self.concrete: dict[bool, Any] = {}    # timed? -> ConcreteFunction

    def on_step(self, run: Any) -> None:
        pass

    def should_stop(self) -> bool:
        return False

    def on_traced(self, tf_function: Any, batch: Any, timed: bool) -> None:
        # Already traced for this batch's signature: a cache lookup, no retrace.
        self.concrete[timed] = tf_function.get_concrete_function(batch)

    def view(self) -> GraphView | None:
        concrete = self.concrete.get(False) or self.concrete.get(True)
        if concrete is None:
            return None
        view = graph_view(concrete, **self.options)
        view.name = "compiled step" + (" (timed variant)" if False not in self.concrete
                                       else "")
        return view

    def show(self) -> GraphView | None:
        view = self.view()
        if view is None:
            print("nbdist: --graph: the step was never compiled, so there is no graph to draw.")
            return None
        return view.show()
