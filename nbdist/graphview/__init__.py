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

Inside: ``walk`` reads the graph into ops and edges, ``layout`` collapses and places them,
``figure`` draws them, ``view`` holds the GraphView and the entry points.
"""

from __future__ import annotations

from .layout import Node as Node
from .view import GraphView, StepGraph, graph_view, show_graph
from .walk import COLLECTIVE_OPS as COLLECTIVE_OPS
from .walk import TRANSFER_OPS as TRANSFER_OPS
from .walk import UNPINNED as UNPINNED
from .walk import Op as Op
from .walk import device_label, is_collective

__all__ = ["GraphView", "StepGraph", "device_label", "graph_view", "is_collective",
           "show_graph"]
