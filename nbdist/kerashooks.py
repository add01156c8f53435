"""Where nbdist meets Keras: lazily built optimizers in step mode, and ``model.fit`` telemetry.

* A Keras 3 optimizer creates its slot variables on its first ``apply_gradients``. Inside a
  ``tf.function`` under MirroredStrategy that first call fails deep in TensorFlow ("You must
  feed a value for placeholder tensor"). ``optimizer_prebuild`` intercepts that build during
  tracing, aborts the trace, builds the optimizer eagerly under the strategy's scope (what a
  careful user would do by hand) and lets the runner trace again.
* ``recording_fit`` makes every ``model.fit`` run in a scope-mode cell report into a Run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import RunInterrupted
from .patching import patched
from .telemetry.run import Run

CENTRAL_STORAGE_LOSS_NOTE = (
    "Keras 3 model.fit reports a wrong per-batch loss under CentralStorageStrategy in "
    "TensorFlow 2.21 (its running mean sticks at one value within each epoch, unlike the same "
    "fit under MirroredStrategy) although the weights train; nbdist leaves `loss` empty and "
    "keeps Keras' number in `keras_reported_loss`. Use step mode (`%%distribute --step`) or "
    "`mirrored` for a trustworthy loss curve."
)


class _NeedsBuild(Exception):
    """Raised inside a trace to abort it so an optimizer can be built eagerly."""


@contextlib.contextmanager
def optimizer_prebuild(pending: list[tuple[Any, list[Any]]]) -> Iterator[None]:
    """While active, an unbuilt Keras optimizer built inside a tf.function aborts the trace."""
    import keras
    import tensorflow as tf

    cls = keras.optimizers.Optimizer
    original = cls.build

    def build(self: Any, variables: Any) -> Any:
        if tf.inside_function() and not self.built:
            pending.append((self, list(variables)))
            raise _NeedsBuild()
        return original(self, variables)

    with patched([(cls, "build", build)]):
        yield


def call_building_optimizers(
    make_fn: Callable[[], Callable[[Any], Any]], arg: Any, strategy: Any
) -> tuple[Callable[[Any], Any], Any]:
    """First call of a compiled step: build any Keras optimizer it would build, then run it.

    Returns the compiled function that ran and its result. After an aborted trace the function
    is compiled afresh, because variables created before the abort would otherwise linger in the
    half-finished tf.function.
    """
    tf_logger = logging.getLogger("tensorflow")
    for _ in range(8):  # one retry per optimizer the step uses
        fn = make_fn()
        pending: list[tuple[Any, list[Any]]] = []
        level = tf_logger.level
        # MirroredStrategy's thread coordinator logs our deliberate abort at INFO level.
        tf_logger.setLevel(max(level, logging.WARNING))
        try:
            with optimizer_prebuild(pending):
                return fn, fn(arg)
        except _NeedsBuild:
            pass
        except Exception:  # MirroredStrategy may wrap a replica thread's exception
            if not pending:
                raise
        finally:
            tf_logger.setLevel(level)
        with strategy.scope():
            for optimizer, variables in pending:
                if not optimizer.built:
                    optimizer.build(variables)
    fn = make_fn()
    return fn, fn(arg)


class FitRecorder:
    """A Keras callback that appends each training batch of ``fit`` to a Run.

    Reading the logs every batch adds no device synchronisation: Keras 3 on TensorFlow
    converts each batch's logs to Python numbers on the training thread anyway (its async
    callback dispatch is off for this backend, ``IS_THREAD_SAFE = False``, Keras 3.15).
    """

    def __init__(self, run: Run, observers: list[Any], central_storage: bool):
        import keras

        class _Callback(keras.callbacks.Callback):
            def on_epoch_begin(cb, epoch: int, logs: Any = None) -> None:
                self.epoch = epoch
                self.step = self.step or resumed_step(epoch, cb.params)

            def on_train_batch_begin(cb, batch: int, logs: Any = None) -> None:
                self.started = time.perf_counter()

            def on_train_batch_end(cb, batch: int, logs: Any = None) -> None:
                self.record(logs or {})
                if any(o.should_stop() for o in self.observers):
                    cb.model.stop_training = True
                    self.stopped = True

        self.run, self.observers, self.central_storage = run, observers, central_storage
        self.callback = _Callback()
        self.epoch, self.step, self.started, self.stopped = 0, 0, time.perf_counter(), False

    def record(self, logs: dict[str, Any]) -> None:
        step_ms = (time.perf_counter() - self.started) * 1e3
        reported = float(logs.get("loss", float("nan")))
        extra = {k: float(v) for k, v in logs.items() if k != "loss" and is_number(v)}
        loss = reported
        if self.central_storage:
            extra["keras_reported_loss"] = reported
            loss = float("nan")
        self.run.record_step(self.step, self.epoch, loss=[loss], step_ms=step_ms,
                             extra=extra or None, replica=-1)
        self.step += 1
        for observer in self.observers:
            observer.on_step(self.run)


@contextlib.contextmanager
def recording_fit(new_run: Callable[[], Run], observers: list[Any], central_storage: bool,
                  extra_callbacks: Callable[[Any, Run, dict[str, Any]], list[Any]] | None = None
                  ) -> Iterator[list[Run]]:
    """Patch ``keras.Model.fit`` so each call inside the block records into a fresh Run.

    ``extra_callbacks(model, run, fit_kwargs)``: more callbacks for each call (--checkpoint).
    """
    import keras

    cls = keras.Model
    original = cls.fit
    started: list[Run] = []

    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        run = new_run()
        started.append(run)
        run.note("loss is what Keras reports: the running mean over the epoch so far; "
                 "replica -1 means the value is reduced over all replicas")
        if central_storage:
            run.note(CENTRAL_STORAGE_LOSS_NOTE)
        recorder = FitRecorder(run, observers, central_storage)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if extra_callbacks is not None:
            callbacks += extra_callbacks(model, run, kwargs)
        callbacks.append(recorder.callback)
        try:
            history = original(model, *args, callbacks=callbacks, **kwargs)
        except KeyboardInterrupt:
            run.finish("interrupted")
            raise RunInterrupted(
                f"model.fit interrupted after step {run.steps_done}; the steps so far are kept "
                f"in nbdist.runs[-1] (run {run.id})."
            ) from None
        except BaseException as err:
            run.finish("failed", f"{type(err).__name__}: {err}")
            raise
        run.finish("stopped" if recorder.stopped else "done")
        return history

    with patched([(cls, "fit", fit)]):
        yield started


def resumed_step(epoch: int, params: dict[str, Any] | None) -> int:
    """The global step a fit starting at ``epoch`` starts from (0 for the first epoch).

    A fit that restored a backup (or got ``initial_epoch``) starts later: its steps go on from
    there, ``epoch * steps per epoch``, when Keras knows the steps per epoch.
    """
    steps = (params or {}).get("steps")
    return epoch * steps if epoch > 0 and isinstance(steps, int) else 0


def is_number(value: Any) -> bool:
    """True for values Keras logs that convert to float (skips strings, arrays...)."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True
