"""``model.fit`` under ``parameter_server``: tf_keras in the kernel, recorded into a Run.

Keras 3's ``fit`` cannot train under ParameterServerStrategy in TensorFlow 2.21; tf_keras's
can: the kernel (the coordinator) runs ``fit``, which schedules every step on whichever
worker is free through the session's ClusterCoordinator (a singleton per strategy, so it is
the one nbdist made). A user builds the model with ``import tf_keras as keras`` in a
``%%distribute`` cell; its variables are created on the parameter servers.

Recording without slowing the workers down: during a recorded ``fit`` the model's
``train_step`` is wrapped so each step also returns the index of the worker that ran it and
two timestamps taken there; its train function is wrapped so those extra values never reach
Keras' own logs or History (``_StripExtras``). A tf_keras callback that accepts
RemoteValues (a private flag: ``hooks.tf_keras.accept_tensor_logs``) keeps each step's
RemoteValue and records it when its result has arrived, in schedule order, without blocking
the scheduling of the next steps.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ...fitrecord import FitRecording, is_number, recorder_class
from ...hooks.tf_keras import accept_tensor_logs
from ...install_tf_keras import INSTALL_HINT
from ...patching import patched
from ...telemetry.run import Run, RunObserver, RunWriter
from ..failures import KerasUnsupported
from .health import ProcessWatch, TaskDied, dead_message_after, drain, ready

_WORKER, _T_START, _T_END = "nbdist_worker", "nbdist_t_start", "nbdist_t_end"
_EXTRAS = (_WORKER, _T_START, _T_END)

KERAS3_PS = (
    "Keras 3 `model.fit` does not work under ParameterServerStrategy in TensorFlow 2.21 (it "
    "asks for ClusterCoordinator.create_per_worker_dataset, which its fit cannot use). Two "
    "ways that do: build the model with tf_keras (`import tf_keras as keras` in a "
    "`%%distribute` cell, then `model.compile(...)` and `model.fit(dataset, "
    "steps_per_epoch=N)`; nbdist records every step), or train in step mode (`%%distribute "
    "--step --data DATASET`, any Keras)."
)
NO_TF_KERAS = (
    "model.fit under parameter_server needs tf_keras in this kernel, and it is not "
    f"installed: run `{INSTALL_HINT}` in a terminal (the tf-keras of your TensorFlow's "
    "version), restart the kernel and build the model with `import tf_keras "
    "as keras`. Or train in step mode (`%%distribute --step --data DATASET`)."
)
NO_TENSOR_LOGS = (
    "this tf_keras does not pass RemoteValues to callbacks (nbdist was checked with tf_keras "
    "2.21), so nbdist cannot record the steps of this fit: it trains, and Keras' own logs "
    "and History are as usual"
)
FIT_NOTE = (
    "parameter_server fit (tf_keras): loss is what Keras reports, the running mean over the "
    "epoch so far of every worker's steps (its metric variables live on the parameter "
    "servers); `worker` is the worker that ran the step, step_ms its time for the step there; "
    "steps are numbered in the order the coordinator scheduled them"
)


@contextlib.contextmanager
def recording_fits(new_run: Callable[[], Run], observers: list[RunObserver], watch: ProcessWatch,
                   extra_callbacks: Callable[[Any, Run, dict[str, Any]], list[Any]] | None = None,
                   ) -> Iterator[None]:
    """While active: Keras 3 ``fit`` is refused with the way out; tf_keras ``fit`` (if tf_keras
    is installed) records each call into a fresh Run. ``extra_callbacks(model, run,
    fit_kwargs)``: more callbacks for each call (--checkpoint: tf_keras' BackupAndRestore,
    which supports ParameterServerStrategy)."""
    import keras

    changes = [(keras.Model, "fit", _refuse)]
    legacy = _tf_keras()
    if legacy is not None:
        changes.append((legacy.Model, "fit", _recording_fit(legacy.Model.fit, new_run,
                                                            observers, watch, extra_callbacks)))
    with patched(changes):
        yield


def _refuse(model: Any, *args: Any, **kwargs: Any) -> Any:
    raise KerasUnsupported(KERAS3_PS if _tf_keras() is not None else
                           f"{KERAS3_PS} {NO_TF_KERAS}")


def _tf_keras() -> Any:
    """The tf_keras module (imported on first use), or None when it is not installed."""
    import importlib.util
    import sys

    if "tf_keras" in sys.modules:
        return sys.modules["tf_keras"]
    if importlib.util.find_spec("tf_keras") is None:
        return None
    import tf_keras

    return tf_keras


#: The start of TensorFlow's warning when ``Dataset.options()`` is read in graph mode.
TF_DATA_OPTIONS_WARNING = "To make it possible to preserve tf.data options"


def _recording_fit(original: Any, new_run: Callable[[], Run], observers: list[RunObserver],
                   watch: ProcessWatch, extra_callbacks: Any = None) -> Any:
    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        run = new_run()
        run.note(FIT_NOTE)
        recorder = _recorder(run, observers, watch)
        extra = extra_callbacks(model, run, kwargs) if extra_callbacks is not None else []
        kwargs["callbacks"] = [*list(kwargs.get("callbacks") or []), *extra, recorder]

        def instrumented_fit() -> Any:
            with _instrumented(model), warnings.catch_warnings():
                # tf_keras reads the dataset's options inside the coordinator's per-worker
                # dataset function, and TensorFlow warns about it on every such fit
                warnings.filterwarnings("ignore", TF_DATA_OPTIONS_WARNING, UserWarning)
                history = original(model, *args, **kwargs)
            recorder.drain()
            return history

        def died(err: BaseException) -> BaseException | None:
            message = dead_message_after(watch, err, run.steps_done)
            return TaskDied(message) if message else None

        return recorder.ended_fit(instrumented_fit, interrupted=lambda: recorder.drain(quiet=True),
                                  still_usable=" The cluster is still usable.", clearer=died)

    return fit


@contextlib.contextmanager
def _instrumented(model: Any) -> Iterator[None]:
    """During one fit: a train function whose steps also return the extras (traced anew
    unless the cached one is already ours), their RemoteValues wrapped by ``_StripExtras``.
    The wrapped ``train_step`` stays in place for the whole fit, as Keras may retrace."""
    import tensorflow as tf

    if not getattr(model.train_function, "_nbdist", False):
        model.train_function = None   # not traced with the extras yet
    plain_step, plain_make = model.train_step, model.make_train_function

    def train_step(data: Any) -> Any:
        t_start = tf.timestamp()
        logs = plain_step(data)
        with tf.control_dependencies(tf.nest.flatten(logs)):
            t_end = tf.timestamp()
        return {**logs, _T_START: t_start, _T_END: t_end,
                _WORKER: tf.distribute.coordinator.experimental_get_current_worker_index()}

    def make_train_function(force: bool = False) -> Any:
        fn = plain_make(force)
        if getattr(fn, "_nbdist", False):
            return fn

        def stripped(iterator: Any) -> Any:
            return _strip_class()(fn(iterator))

        stripped._nbdist = True   # type: ignore[attr-defined]
        model.train_function = stripped
        return stripped

    object.__setattr__(model, "train_step", train_step)
    object.__setattr__(model, "make_train_function", make_train_function)
    try:
        yield
    finally:   # the traced function keeps the extras; later fits reuse it, stripped
        object.__delattr__(model, "train_step")
        object.__delattr__(model, "make_train_function")


class _StripExtras:
    """A step's RemoteValue as Keras sees it: its logs without nbdist's extra values.

    Made a RemoteValue subclass on first use (``_strip_class``), so Keras treats it as one
    and importing this module does not import TensorFlow."""

    def __init__(self, inner: Any):
        self.inner = inner

    def fetch(self) -> Any:
        return _without_extras(self.inner.fetch())

    def get(self) -> Any:
        return _without_extras(self.inner.get())


@functools.cache
def _strip_class() -> type:
    import tensorflow as tf

    return type("StripExtras", (_StripExtras, tf.distribute.experimental.coordinator.RemoteValue),
                {})


def _recorder(run: Run, observers: list[RunObserver], watch: ProcessWatch) -> Any:
    return _recorder_class()(run, observers, watch)


@functools.cache
def _recorder_class() -> type:
    import tf_keras

    return recorder_class("NbdistPSFitRecorder", _Recorder, tf_keras.callbacks.Callback)


def _without_extras(logs: Any) -> Any:
    return {k: v for k, v in logs.items() if k not in _EXTRAS} if isinstance(logs, dict) else logs


class _Recorder(FitRecording):
    """A tf_keras callback (``_recorder``) appending each step's row to the Run once its
    result is there."""

    def __init__(self, run: Run, observers: list[RunObserver], watch: ProcessWatch):
        super().__init__()
        if not accept_tensor_logs(self):   # RemoteValues, not numbers: no sync per batch
            run.note(NO_TENSOR_LOGS)
        self.run, self.observers, self.watch = run, observers, watch
        self.pending: deque[tuple[int, int, Any]] = deque()

    def record_batch(self, logs: Any, step_ms: float) -> None:
        """Queue the step's RemoteValues; record the ones that are there (the step time is
        measured on the worker, ``step_ms`` here is only the scheduling)."""
        if isinstance(logs, _StripExtras):
            self.pending.append((self.step, self.epoch, logs.inner))
            self.step += 1
        while self.pending and ready(self.pending[0][2]):
            self._record(*self.pending[0])
            self.pending.popleft()

    def stop_requested(self) -> bool:
        return any(o.should_stop() for o in self.observers)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.drain()
        super().on_epoch_end(epoch, logs)

    def drain(self, quiet: bool = False) -> None:
        """Record every step still pending (fetching waits for the slowest)."""
        drain(self.pending, self._record, quiet)

    def _record(self, step: int, epoch: int, remote: Any) -> None:
        """Append a step's row (once: an interrupt may come between recording and
        dequeuing)."""
        if step < self.run.steps_done:
            return
        values = remote.fetch()
        logs = {k: float(v) for k, v in values.items() if k not in _EXTRAS and is_number(v)}
        extra = {k: v for k, v in logs.items() if k != "loss"}
        end = float(values.get(_T_END, time.time()))
        step_ms = (end - float(values.get(_T_START, float("nan")))) * 1e3
        RunWriter(self.run).record_step(
            step, epoch, loss=[logs.get("loss", float("nan"))], step_ms=step_ms,
            worker=int(values.get(_WORKER, -1)), replica=0, extra=extra or None, wall_time=end)
        for observer in self.observers:
            observer.on_step(self.run)

