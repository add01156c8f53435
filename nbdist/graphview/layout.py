"""Where the ops go in the picture: collapsing them by name scope into drawn nodes when there
are too many, and a layered layout, left to right in dataflow order, one horizontal lane per
device (the peers of one collective share a layer).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

from .walk import TRANSFER_OPS, UNPINNED, Op, communicates


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
        return any(communicates(op.type) for op in self.ops)

    @property
    def type(self) -> str:
        return self.ops[0].type if len(self.ops) == 1 else "group"


# -- collapsing by name scope ---------------------------------------------------------------

def collapse_scopes(ops: list[Op], edges: list[tuple[str, str, bool]],
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
            if owner is None or communicates(owner.type) or owner.label != op.label:
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


def _group_key(op: Op, depth: int) -> str:
    if communicates(op.type):
        return op.id
    scope = [p for p in op.id.split("/")[:-1] if not _REPLICA_SCOPE.match(p)]
    if not scope:
        return f"{op.type}@{op.label}"          # unscoped ops: one node per type and device
    if depth == 0 or len(scope) >= depth:
        return "/".join(scope[:max(depth, 1)]) + f"/@{op.label}"
    return op.id


# -- lanes and layers -----------------------------------------------------------------------

def edges_between_nodes(nodes: list[Node], edges: list[tuple[str, str, bool]]) -> dict:
    """(from node, to node) -> [tensor edges, control edges], self-loops dropped."""
    owner = {op.id: node.id for node in nodes for op in node.ops}
    out: dict[tuple[str, str], list[int]] = {}
    for src, dst, control in edges:
        a, b = owner.get(src), owner.get(dst)
        if a is None or b is None or a == b:
            continue
        out.setdefault((a, b), [0, 0])[int(control)] += 1
    return out


def device_order(labels: set[str]) -> list[str]:
    """Device labels in lane order: numbers compared as numbers (``CPU:2`` before ``CPU:10``),
    unpinned ops last."""

    def key(label: str) -> tuple:
        return (label == UNPINNED, [int(t) if t.isdigit() else t for t in re.split(r"(\d+)",
                                                                                   label)])
    return sorted(labels, key=key)


def place_nodes(nodes: list[Node], edges: dict, devices: list[str],
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
