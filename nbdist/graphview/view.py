"""The GraphView of a traced function and the entry points: ``graph_view`` (trace and
flatten), ``show_graph`` (and display) and ``StepGraph`` (``%%distribute --step --graph``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from ..telemetry.run import RunObserver
from ..words import count
from .figure import graph_figure, op_counts
from .layout import collapse_scopes, device_order, edges_between_nodes, place_nodes
from .walk import GraphWalker, Op, graph_def_of, is_collective


class GraphView:
    """A traced graph, flattened (``ops``, ``edges``) and ready to draw (``nodes``,
    ``node_edges``, ``figure``). Build it with ``graph_view`` or ``show_graph``."""

    def __init__(self, graph_def: Any, *, name: str = "graph", max_nodes: int = 80,
                 expand_functions: bool = True, hide_types: tuple[str, ...] = ()):
        walker = GraphWalker(graph_def.library, expand_functions)
        walker.walk(graph_def.node, "", "", {}, "")
        hidden = {i for i, op in walker.ops.items() if op.type in hide_types}
        self.name = name
        self.ops: list[Op] = [op for i, op in walker.ops.items() if i not in hidden]
        self.edges: list[tuple[str, str, bool]] = [
            e for e in walker.edges if e[0] not in hidden and e[1] not in hidden
            and e[0] in walker.ops]
        self.max_nodes = max_nodes
        self.depth, self.nodes = collapse_scopes(self.ops, self.edges, max_nodes)
        self.node_edges = edges_between_nodes(self.nodes, self.edges)
        self._positions: dict[str, tuple[float, float]] | None = None

    # -- facts --------------------------------------------------------------------------
    @property
    def devices(self) -> list[str]:
        """Device labels of the graph's ops, in lane order."""
        return device_order({op.label for op in self.ops})

    @property
    def collectives(self) -> list[Op]:
        return [op for op in self.ops if is_collective(op.type)]

    @property
    def collapsed(self) -> bool:
        return len(self.nodes) < len(self.ops)

    @property
    def summary(self) -> Any:
        """A DataFrame: per device, the number of ops, collective ops and the commonest types."""
        return op_counts(self.ops, self.devices)

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
                f"{count(len(self.devices), 'device')}, "
                f"{count(len(self.collectives), 'collective op')}"
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
            self._positions = place_nodes(self.nodes, self.node_edges, self.devices, align)
        return self._positions

    @property
    def figure(self) -> Any:
        """The plotly Figure: the graph on top, op counts per device below."""
        return graph_figure(self)

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


# -- entry points ---------------------------------------------------------------------------

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
    graph_def, name = graph_def_of(fn, args, kwargs)
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


class StepGraph(RunObserver):
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
