"""``model.fit`` on a worker, recorded into the kernel's Run: every fit of a scope cell gets a
tf_keras callback (``fitrecord.FitRecording``) that records each batch and stops where the
kernel's stop protocol says; tf_keras's gradient all-reduce is timed (``telemetry.fitreduce``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from ...fitrecord import FitRecording, is_number, recorder_class
from ...install_tf_keras import INSTALL_HINT
from ...patching import patched
from ...telemetry import fitreduce
from ...telemetry.run import Run, RunWriter
from ..failures import KerasUnsupported
from .runs import Forwarder, in_run, local_run
from .worker import WorkerState

KERAS3_MWMS = (
    "Keras 3 `model.fit` does not work under MultiWorkerMirroredStrategy in TensorFlow 2.21 "
    "(keras-team/keras#20585). Run the workers with tf_keras, the default when it is "
    f"installed (`{INSTALL_HINT}` in a terminal, then `%distribute restart`: fresh workers "
    "choose again; `%distribute multiworker --workers N --keras legacy` insists on it), and "
    "build the model with "
    "`tf.keras` rather than `import keras`; or train in step mode (`%%distribute --step`)."
)


def _fit_classes() -> list[tuple[type, str]]:
    """``(Model class, "tf_keras" | "keras3")`` for each Keras loaded on this worker."""
    import tensorflow as tf

    found: list[tuple[type, str]] = []
    tk = tf.keras.Model
    found.append((tk, "tf_keras" if tk.__module__.startswith("tf_keras") else "keras3"))
    keras3 = sys.modules.get("keras")
    if keras3 is not None and getattr(keras3, "Model", tk) is not tk:
        found.append((keras3.Model, "keras3"))
    return found


@contextlib.contextmanager
def recording_fits(st: WorkerState, cell_id: str, fits: Any = None) -> Iterator[None]:
    count = [0]
    with patched((cls, "fit", _recording_fit(st, cell_id, cls.fit, kind, count, fits))
                 for cls, kind in _fit_classes()):
        yield


def _recording_fit(st: WorkerState, cell_id: str, original: Any, kind: str,
                   count: list[int], fits: Any = None) -> Any:
    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        if kind == "keras3":
            raise KerasUnsupported(KERAS3_MWMS)
        count[0] += 1
        key = f"{cell_id}-fit{count[0]}"
        run = local_run(st, "fit")
        forward = Forwarder(st, key)
        clock = _allreduce_clock(model, st, run)
        callback = _fit_callback(st, run, forward, clock)
        extra = fits.callbacks(model, run, kwargs) if fits is not None else []
        kwargs["callbacks"] = [*list(kwargs.get("callbacks") or []), *extra, callback]
        with in_run(st, key, "fit", run, forward), fitreduce.hooked(clock):
            history = original(model, *args, **kwargs)
            if clock is not None and not callback.timed and run.steps_done:
                run.note("no gradient all-reduce was seen in tf_keras's optimizer (a custom "
                         "train_step?), so allreduce_ms is not measured")
            RunWriter(run).finish("stopped" if callback.stopped else "done")
            return history

    return fit


def _allreduce_clock(model: Any, st: WorkerState, run: Run) -> Any:
    """The model's all-reduce clock (telemetry.fitreduce), or None with a note saying why."""
    why = fitreduce.unavailable_reason()
    if why is not None:
        run.note(f"allreduce_ms is not measured in fit: {why}")
        return None
    clock = fitreduce.clock_for(model, st.handle.strategy)
    clock.reset()
    run.note(fitreduce.NOTE)
    return clock


class _WorkerFitRecording(FitRecording):
    """Records each training batch of a tf_keras fit on this worker into the kernel's Run
    (through ``forward``); stops where the kernel's stop protocol says."""

    timed = False

    def __init__(self, st: WorkerState, run: Run, forward: Forwarder, clock: Any = None):
        super().__init__()
        self.st, self.run, self.forward, self.clock = st, run, forward, clock

    def record_batch(self, logs: dict[str, Any], step_ms: float) -> None:
        scale = _batch_log_scale(self.model, self.st.handle.replicas)
        logs = {k: float(v) * scale for k, v in logs.items() if is_number(v)}
        extra = {k: v for k, v in logs.items() if k != "loss"}
        reported = logs.get("loss", float("nan"))
        extra["batch_loss"] = self.batch_loss(reported)
        allreduce = self.clock.read_ms() if self.clock is not None else None
        self.timed = self.timed or allreduce is not None
        RunWriter(self.run).record_step(
            self.step, self.epoch, loss=[reported], step_ms=step_ms,
            replica=-1, extra=extra, allreduce_ms=allreduce)
        self.step += 1
        self.forward.on_step(self.run)

    def stop_requested(self) -> bool:
        return self.st.gate.should_stop(self.step)


def _fit_callback(st: WorkerState, run: Run, forward: Forwarder, clock: Any = None) -> Any:
    """A tf_keras callback recording each training batch into the kernel's Run."""
    import tensorflow as tf

    cls = recorder_class("NbdistWorkerFitRecorder", _WorkerFitRecording,
                         tf.keras.callbacks.Callback)
    return cls(st, run, forward, clock)


def _batch_log_scale(model: Any, replicas: int) -> float:
    """tf_keras sums per-batch logs over replicas under MultiWorkerMirroredStrategy.

    Its default ``distribute_reduction_method`` ("auto", i.e. "sum") adds up each replica's
    metric result, which is already the global mean: batch logs come out ``replicas`` times
    too large (epoch logs and History are right). nbdist records the mean.
    """
    method = getattr(model, "distribute_reduction_method", "auto")
    return 1.0 / replicas if method in ("auto", "sum") and replicas > 1 else 1.0
