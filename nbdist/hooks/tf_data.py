"""Private TensorFlow API: a distributed iterator's per-device pipelines without autotuning,
and the stages of a user's pipeline as its dataset graph holds them.

A distributed dataset's iterator over N local devices (``OwnedMultiDeviceIterator``) builds one
small pipeline per device (``multi_device_iterator_ops._create_device_dataset``: a generator
and a fixed ``prefetch``), each with TensorFlow's default options, so each starts its own
autotuning thread although it has nothing to tune. Deleting the iterator joins those threads
one after another, and in TensorFlow 2.21 a thread can miss the cancellation and sleep out
its tuning period first (up to 60 s; see ``nbdist.data.iterate``). Built inside
``untuned_device_pipelines()``, they run without autotuning: the host pipeline (the user's
dataset, with the user's options) keeps its own. Checked with TensorFlow 2.21.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .api import PrivateAPI, first_problem, lacks

CHECKED = "2.21"
#: the ops that run Python in a dataset function: ``tf.py_function`` (EagerPyFunc),
#: ``tf.numpy_function`` and ``tf.compat.v1.py_func`` (PyFunc, PyFuncStateless)
PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function",
              "PyFuncStateless": "tf.numpy_function"}
_MODULE = "tensorflow.python.data.ops.multi_device_iterator_ops"


@contextlib.contextmanager
def untuned_device_pipelines() -> Iterator[None]:
    """Distributed iterators made inside build their per-device pipelines without
    autotuning (the user's own pipeline is untouched).

    Feature: deleting the iterators of step mode's epochs without waiting on TensorFlow.
    Checked with TensorFlow 2.21. Without the API they autotune as usual, and deleting one
    can take longer (nbdist still deletes it off the cell's thread).
    """
    module = sys.modules.get(_MODULE)
    build = getattr(module, "_create_device_dataset", None)
    if build is None or getattr(build, "nbdist_untuned", False):   # gone, or already inside
        yield
        return
    module._create_device_dataset = _untuned(build)
    try:
        yield
    finally:
        module._create_device_dataset = build


def _untuned(build: Any) -> Any:
    def untuned(*args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        options = tf.data.Options()
        options.autotune.enabled = False
        return build(*args, **kwargs).with_options(options)

    untuned.nbdist_untuned = True   # type: ignore[attr-defined]
    return untuned


@dataclass(frozen=True)
class Stage:
    """One transformation of a pipeline, as its graph holds it: the op (``MapDataset``,
    ``ParallelMapDatasetV2``, ``PrefetchDataset``...), its place from the source (0), and how
    its functions run Python (``PYTHON_OPS``' values, once each)."""

    op: str
    index: int
    python: tuple[str, ...] = ()


def pipeline_stages(dataset: Any) -> list[Stage] | None:
    """The stages of ``dataset`` from its source to its output, None where its graph cannot
    be read (``_as_serialized_graph`` gone, or refused for this dataset).

    Feature: ``%distribute explain`` names the stage of the input pipeline that does Python
    work and whether it runs in parallel. Checked with TensorFlow 2.21. Without the API the
    explanation still measures the pipeline's rate, and names no stage.
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2

    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        return None
    try:
        # Python functions are external state: a graph for reading, never for running
        ignore = tf.data.experimental.ExternalStatePolicy.IGNORE
        graph = graph_pb2.GraphDef.FromString(
            serialize(external_state_policy=ignore).numpy())
    except Exception:   # a dataset TensorFlow cannot serialise: no stages to name
        return None
    functions = {f.signature.name: f for f in graph.library.function}
    nodes = {node.name: node for node in graph.node}
    python_of = functools.cache(lambda name: _python_ops(functions, name, set()))
    stages, seen = [], set()

    def visit(name: str) -> None:
        node = nodes.get(name.split(":")[0].lstrip("^"))
        if node is None or node.name in seen:
            return
        seen.add(node.name)
        for upstream in node.input:
            visit(upstream)
        if "Dataset" in node.op:
            found = [op for f in _functions_of(node) for op in python_of(f)]
            stages.append(Stage(node.op, len(stages), tuple(dict.fromkeys(found))))

    for node in graph.node:   # the output is the node nothing else reads
        visit(node.name)
    return stages


def _functions_of(node: Any) -> list[str]:
    return [value.func.name for value in node.attr.values() if value.HasField("func")]


def _python_ops(functions: dict[str, Any], name: str, seen: set[str]) -> list[str]:
    """The Python ops of function ``name`` and the functions it calls."""
    function = functions.get(name)
    if function is None or name in seen:
        return []
    seen.add(name)
    found = []
    for node in function.node_def:
        if node.op in PYTHON_OPS:
            found.append(PYTHON_OPS[node.op])
        for called in [*_functions_of(node), node.op]:
            found += _python_ops(functions, called, seen)
    return found


def _probe_device_dataset() -> str | None:
    import importlib

    module = importlib.import_module(_MODULE)

    def builds_device_datasets() -> str | None:
        source = inspect.getsource(module.OwnedMultiDeviceIterator)
        if "_create_device_dataset(" not in source:
            return ("OwnedMultiDeviceIterator (what distributed iterators use) no longer builds "
                    "its per-device pipelines with _create_device_dataset")
        return None

    return first_problem(lambda: lacks(module, "_create_device_dataset"), builds_device_datasets)


def _probe_serialized_graph() -> str | None:
    import tensorflow as tf

    return lacks(tf.data.Dataset, "_as_serialized_graph")


DECLARED = [
    PrivateAPI("tensorflow", "multi_device_iterator_ops._create_device_dataset",
               "tf_data.untuned_device_pipelines",
               "deleting a distributed iterator without waiting on TensorFlow",
               CHECKED, "each per-device pipeline of a distributed iterator autotunes, and "
               "deleting one can wait up to 60 s per device (off the cell's thread)",
               _probe_device_dataset, ("_create_device_dataset",)),
    PrivateAPI("tensorflow", "tf.data.Dataset._as_serialized_graph",
               "tf_data.pipeline_stages",
               "naming the input pipeline's stage that runs Python (`%distribute explain`)",
               CHECKED, "the explanation measures the pipeline's rate but names no stage",
               _probe_serialized_graph, ("_as_serialized_graph",)),
]
