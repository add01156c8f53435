"""The parameter update's time inside a parameter-server step: ``UpdateTimer`` brackets the
optimizer's ``apply_gradients`` with timestamps while the step (``stepfn``) is traced; they
become the Run's ``update_ms`` (see its docstring)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...patching import patched


class UpdateTimer:
    """While tracing, brackets every optimizer ``apply_gradients`` with timestamps.

    The first timestamp waits for the gradients; the second for a read of every updated
    variable, which TensorFlow orders after the update of that variable and places on its
    parameter server: so the span covers the push, the update and the acknowledgement.
    Keras 3 and (if loaded) tf_keras optimizers are hooked.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[Any, Any]] = []

    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """Entered once per trace: a retrace (TensorFlow traces again when a tf_keras
        optimizer made its slot variables) must not read the spans of the previous graph."""
        self.spans.clear()
        with patched((cls, "apply_gradients", self._timed(cls.apply_gradients))
                     for cls in _optimizer_classes()):
            yield

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        import tensorflow as tf

        timer = self

        def apply_gradients(opt: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            with tf.control_dependencies([g for g, _ in pairs if isinstance(g, tf.Tensor)]):
                t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                pairs = [(tf.identity(g) if isinstance(g, tf.Tensor) else g, v)
                         for g, v in pairs]
            result = original(opt, pairs, *args, **kwargs)
            reads = [_read(v) for _, v in pairs]
            with tf.control_dependencies([r.op for r in reads if r is not None]):
                t1 = tf.timestamp()
            timer.spans.append((t0, t1))
            return result

        return apply_gradients


def _optimizer_classes() -> list[type]:
    import keras

    classes: list[type] = [keras.optimizers.Optimizer]
    legacy = sys.modules.get("tf_keras")
    if legacy is not None:
        classes.append(legacy.optimizers.Optimizer)
    return classes


def _read(variable: Any) -> Any:
    """A read of ``variable`` where it lives (Keras 3 variables wrap a tf.Variable)."""
    inner = getattr(variable, "value", None)
    inner = variable if inner is None or callable(inner) else inner
    try:
        return inner.read_value() if hasattr(inner, "read_value") else None
    except Exception:  # not a resource variable: no update time from it
        return None
