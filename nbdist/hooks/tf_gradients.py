"""Private TensorFlow API for releasing what a discarded traced step holds.

Each ``tf.custom_gradient`` called while tracing (e.g. ``ReplicaContext.all_reduce``, which
Keras' optimizers call on every trace) registers a "CustomGradient-N" entry in TensorFlow's
global gradient registry (``ops.gradient_registry._registry``) that keeps its whole FuncGraph
for the life of the process: a kernel that re-runs step cells grows by ~1 MB a run. Checked
with TensorFlow 2.21. TensorFlow is never imported here: it is loaded once anything traced.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from .api import PrivateAPI, first_problem, lacks

CHECKED = "2.21"
PREFIX = "CustomGradient"


@contextlib.contextmanager
def recording_gradient_registrations(keys: list[str]) -> Iterator[None]:
    """Append to ``keys`` the custom-gradient names that tracing inside this context adds to
    the gradient registry (for ``release_gradient_registrations``).

    Feature: step mode's memory over a long session. Checked with TensorFlow 2.21. Without the
    registry nothing is recorded and each traced step keeps its graphs until the kernel ends.
    """
    registry = _gradient_registry()
    before = set(registry) if registry is not None else set()
    try:
        yield
    finally:
        registry = registry if registry is not None else _gradient_registry()
        if registry is not None:
            keys.extend(k for k in registry if k not in before and k.startswith(PREFIX))


def release_gradient_registrations(keys: list[str]) -> None:
    """Remove the gradient-registry entries named in ``keys``, then empty ``keys``.

    Call it only once nothing can differentiate the graphs that registered them (nbdist no
    longer holds the traced step): a gradient of such a graph would fail to find them.
    Checked with TensorFlow 2.21; without the registry it does nothing.
    """
    registry = _gradient_registry()
    if registry is not None:
        for key in keys:
            registry.pop(key, None)
    keys.clear()


def _gradient_registry() -> dict[str, Any] | None:
    ops = sys.modules.get("tensorflow.python.framework.ops")
    registry = getattr(getattr(ops, "gradient_registry", None), "_registry", None)
    return registry if isinstance(registry, dict) else None


def _probe_gradient_registry() -> str | None:
    import tensorflow as tf
    from tensorflow.python.framework import ops

    def registered() -> str | None:
        keys: list[str] = []
        with recording_gradient_registrations(keys):
            tf.function(lambda x: tf.custom_gradient(lambda v: (v, lambda d: d))(x)
                        ).get_concrete_function(tf.TensorSpec([], tf.float32))
        if not keys:
            return "tracing a tf.custom_gradient registered no CustomGradient entry"
        release_gradient_registrations(keys)
        return None

    return first_problem(lambda: lacks(ops, "gradient_registry"),
                         lambda: lacks(ops.gradient_registry, "_registry"), registered)


DECLARED = [
    PrivateAPI("tensorflow", "ops.gradient_registry._registry",
               "tf_gradients.recording_gradient_registrations, release_gradient_registrations",
               "step mode's memory over a long session (a discarded traced step is released)",
               CHECKED, "every traced step keeps its FuncGraphs in TensorFlow's gradient "
               "registry until the kernel ends (~1 MB per step-cell run)",
               _probe_gradient_registry, ("_registry",)),
]
