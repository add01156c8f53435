"""Instrumentation for parameter-server steps: the update timer, quieter TensorFlow logs and
the notes a step Run carries (what its columns and epochs mean).

``UpdateTimer`` times the parameter update inside a traced step (see its docstring);
``quiet_recovery_logs`` hides the coordinator's per-closure failure logs during a run and
leaves a note in the Run instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...hooks.tf_coordinator import COORDINATOR_LOG_FILE
from ...patching import patched
from ...telemetry.run import Run

UPDATE_NOTE = (
    "parameter_server: update_ms is the parameter update measured on the worker (push the "
    "gradients to the parameter servers, apply them there, acknowledgement), on timed steps "
    "only; reading the parameters is part of compute_ms; there is no allreduce, so "
    "allreduce_ms is empty. Steps are numbered in the order the coordinator scheduled them; "
    "`worker` is the worker that ran the step (asynchronous: no two rows share a step)"
)
EPOCH_NOTE = (
    "parameter_server: each worker reads its own copy of the dataset, repeated; an epoch is "
    "as many steps as the dataset has batches, spread over the workers"
)


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


class _RecoveryLogFilter(logging.Filter):
    """Drops (and counts) the coordinator's own log records: when a worker fails it logs
    every retried closure with a gRPC dump, dozens of lines nbdist replaces by one note."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.pathname.endswith(COORDINATOR_LOG_FILE):
            self.dropped += 1
            return False
        return True


@contextlib.contextmanager
def quiet_recovery_logs(run: Run) -> Iterator[None]:
    logger = logging.getLogger("tensorflow")
    quiet = _RecoveryLogFilter()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
        if quiet.dropped:
            run.note(f"TensorFlow's ClusterCoordinator logged {quiet.dropped} message(s) "
                     "while it handled failures (hidden by nbdist: the failure is described "
                     "above)")


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
