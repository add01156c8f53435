"""Private TensorFlow API: a distributed iterator's per-device pipelines without autotuning.

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
import inspect
import sys
from collections.abc import Iterator
from typing import Any

from .api import PrivateAPI, first_problem, lacks

CHECKED = "2.21"
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


DECLARED = [
    PrivateAPI("tensorflow", "multi_device_iterator_ops._create_device_dataset",
               "tf_data.untuned_device_pipelines",
               "deleting a distributed iterator without waiting on TensorFlow",
               CHECKED, "each per-device pipeline of a distributed iterator autotunes, and "
               "deleting one can wait up to 60 s per device (off the cell's thread)",
               _probe_device_dataset, ("_create_device_dataset",)),
]
