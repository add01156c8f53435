"""Reading a traced graph into ops and tensor edges: the GraphDef of a tf.function (or a
ConcreteFunction, a ``tf.Graph``, partition GraphDefs), flattened together with the bodies of
the functions it calls (``StatefulPartitionedCall``, the ``cond``/``body`` of ``While``, the
branches of ``If``...). Also what an op is: its device label, collective or transfer.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


def is_collective(op_type: str) -> bool:
    """True for ops that exchange data between replicas (all-reduce, gather, broadcast...)."""
    return op_type in COLLECTIVE_OPS


def communicates(op_type: str) -> bool:
    """True for ops that move data between devices (collectives and transfers): they are
    never collapsed into a name-scope node."""
    return op_type in COLLECTIVE_OPS or op_type in TRANSFER_OPS


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


# -- walking the graph ----------------------------------------------------------------------

class GraphWalker:
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


# -- reading what the user passed -----------------------------------------------------------

def graph_def_of(fn: Any, args: tuple, kwargs: dict) -> tuple[Any, str]:
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
