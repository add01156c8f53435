"""``model.fit`` telemetry: each training batch of a fit recorded into a Run.

``FitRecording`` is the part every recorder shares (epoch and step bookkeeping, batch time,
stopping); ``FitRecorder`` and ``recording_fit`` record a Keras 3 fit in the kernel. The
workers (``cluster.inengine.cells``) and the parameter-server coordinator
(``cluster.paramserver.fit``) mix ``FitRecording`` into tf_keras callbacks of their own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import RunInterrupted
from .patching import patched
from .telemetry.run import Run, RunObserver, RunWriter

CENTRAL_STORAGE_LOSS_NOTE = (
    "Keras 3 model.fit reports a wrong per-batch loss under CentralStorageStrategy in "
    "TensorFlow 2.21 (its running mean sticks at one value within each epoch, unlike the same "
    "fit under MirroredStrategy) although the weights train; nbdist leaves `loss` empty and "
    "keeps Keras' number in `keras_reported_loss`. Use step mode (`%%distribute --step`) or "
    "`mirrored` for a trustworthy loss curve."
)


BATCH_LOSS_LABEL = "loss per batch (from Keras' running mean)"
BATCH_LOSS_NOTE = (
    "batch_loss is each batch's own loss, recovered from Keras' running means (exact when the "
    "epoch's batches have one size, approximate for a smaller last batch): the dashboard draws "
    "it; compiled metrics (accuracy...) are Keras' running means too, and run.epoch_metrics "
    "has each epoch's values, validation included"
)


def batch_value(done: int, mean: float, before: int, mean_before: float) -> float:
    """The mean of the batches ``before + 1 ... done`` of an epoch, from the running means
    Keras logs after ``done`` and after ``before`` batches (``before`` 0 at the epoch's start).

    Keras 3 and tf_keras both log ``loss`` per batch as a ``Mean`` metric over the epoch so
    far, weighted by each batch's size (Keras 3's ``train_step``: ``sample_weight`` = the batch
    size; tf_keras's ``LossesContainer``: ``sample_weight=batch_dim``), reset when an epoch
    begins. With batches of one size that is ``sum(loss_i) / n``, so the batches since the
    last log sum to ``done * mean - before * mean_before``. Several batches per log
    (``steps_per_execution``) give their mean.
    """
    if not done > before >= 0:
        return float("nan")
    return (done * mean - before * mean_before) / (done - before)


def _nothing() -> None:
    pass


def _no_clearer(err: BaseException) -> BaseException | None:
    return None


class FitRecording:
    """What every fit recorder shares, mixed into a Callback class of the Keras that runs the
    fit (Keras 3 here, tf_keras on the workers and the coordinator): the epoch and global step
    of each batch (going on after a restored ``BackupAndRestore``), the batch's time, and
    stopping ``fit`` at a batch boundary when asked. A recorder implements ``record_batch``
    (which advances ``step`` for each batch it records) and ``stop_requested``; it may record
    ``batch_loss(reported)`` (the batch's own loss) beside Keras' running mean. Each
    epoch's end logs (compiled metrics, validation) go to ``Run.epoch_metrics``.
    """

    epoch, step, started, stopped = 0, 0, 0.0, False
    begun = False                   # the first epoch began
    batch = 0                       # Keras' index of the batch that just ended (in its epoch)
    _mean: tuple[int, float] = (0, 0.0)   # (batches, Keras' running mean loss) so far
    model: Any
    params: Any
    run: Run

    def on_train_begin(self, logs: Any = None) -> None:
        """The fit's length from Keras' callback params: the progress bar and time left."""
        epochs, steps = planned_length(self.params)
        RunWriter(self.run).update(epochs=epochs)
        if epochs and steps:
            RunWriter(self.run).update(total_steps=epochs * steps)

    def record_batch(self, logs: dict[str, Any], step_ms: float) -> None:
        raise NotImplementedError

    def stop_requested(self) -> bool:
        raise NotImplementedError

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch
        self._mean = (0, 0.0)        # Keras resets its metrics at each epoch's start
        if not self.begun:
            self.begun = True
            self.step = resumed_step(epoch, self.params)
            if self.run.checkpoint is not None:    # --checkpoint: a resumed fit goes on
                RunWriter(self.run).checkpointed(self.run.checkpoint, self.step)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        """The epoch's numbers as Keras logs them at its end (``val_*`` with validation)."""
        numbers = {k: float(v) for k, v in (logs or {}).items()
                   if isinstance(k, str) and is_number(v)}
        if numbers and self.step:
            RunWriter(self.run).record_epoch(epoch, self.step - 1, numbers)

    def batch_loss(self, reported: float) -> float:
        """The loss of the batch that just ended, from Keras' running mean over the epoch
        (``reported``, ``logs["loss"]``) and the previous one (``batch_value``)."""
        done = self.batch + 1
        before, mean = self._mean
        self._mean = (done, reported)
        return batch_value(done, reported, before, mean)

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.started = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batch = batch
        self.record_batch(logs or {}, (time.perf_counter() - self.started) * 1e3)
        if self.stop_requested():
            self.model.stop_training = True
            self.stopped = True

    def ended_fit(self, fit: Callable[[], Any], *, interrupted: Callable[[], None] = _nothing,
                  still_usable: str = "",
                  clearer: Callable[[BaseException], BaseException | None] = _no_clearer) -> Any:
        """``fit()``'s result, with the Run ended as the fit ended: done, stopped, interrupted
        (``interrupted()`` runs first; the error says the steps so far are kept, then
        ``still_usable``) or failed (``clearer(err)``: an error to raise instead, or None)."""
        run = self.run
        try:
            history = fit()
        except KeyboardInterrupt:
            interrupted()
            RunWriter(run).finish("interrupted")
            raise RunInterrupted(
                f"model.fit interrupted after step {run.steps_done}; the steps so far are kept "
                f"in nbdist.runs[-1] (run {run.id}).{still_usable}"
            ) from None
        except BaseException as err:
            instead = clearer(err)
            RunWriter(run).finish("failed", str(instead) if instead is not None
                                  else f"{type(err).__name__}: {err}")
            if instead is not None:
                raise instead from None
            raise
        RunWriter(run).finish("stopped" if self.stopped else "done")
        return history



def recorder_class(name: str, recording: type, callback_base: type) -> type:
    """``recording`` (a ``FitRecording``) as a Callback of ``callback_base``'s Keras."""
    return type(name, (recording, callback_base), {})


class FitRecorder(FitRecording):
    """A Keras 3 callback that appends each training batch of ``fit`` to a Run
    (``FitRecorder.create``).

    Reading the logs every batch adds no device synchronisation: Keras 3 on TensorFlow
    converts each batch's logs to Python numbers on the training thread anyway (its async
    callback dispatch is off for this backend, ``IS_THREAD_SAFE = False``, Keras 3.15).
    """

    def __init__(self, run: Run, observers: list[RunObserver], central_storage: bool):
        super().__init__()
        self.run, self.observers, self.central_storage = run, observers, central_storage

    @classmethod
    def create(cls, run: Run, observers: list[RunObserver], central_storage: bool) -> FitRecorder:
        import keras

        return recorder_class("NbdistFitRecorder", cls, keras.callbacks.Callback)(
            run, observers, central_storage)

    def stop_requested(self) -> bool:
        return any(o.should_stop() for o in self.observers)

    def record_batch(self, logs: dict[str, Any], step_ms: float) -> None:
        reported = float(logs.get("loss", float("nan")))
        extra = {k: float(v) for k, v in logs.items() if k != "loss" and is_number(v)}
        loss = reported
        if self.central_storage:
            extra["keras_reported_loss"] = reported
            loss = float("nan")
        else:
            extra["batch_loss"] = self.batch_loss(reported)
        RunWriter(self.run).record_step(self.step, self.epoch, loss=[loss], step_ms=step_ms,
                                        extra=extra or None, replica=-1)
        self.step += 1
        for observer in self.observers:
            observer.on_step(self.run)


@contextlib.contextmanager
def recording_fit(new_run: Callable[[], Run], observers: list[RunObserver], central_storage: bool,
                  extra_callbacks: Callable[[Any, Run, dict[str, Any]], list[Any]] | None = None,
                  only: Callable[[Any], bool] | None = None) -> Iterator[list[Run]]:
    """Patch ``keras.Model.fit`` so each call inside the block records into a fresh Run.

    ``extra_callbacks(model, run, fit_kwargs)``: more callbacks for each call (--checkpoint);
    ``only(model)``: record only the fits of models it accepts (others run untouched).
    """
    import keras

    cls = keras.Model
    original = cls.fit
    started: list[Run] = []

    def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
        if only is not None and not only(model):
            return original(model, *args, **kwargs)
        run = new_run()
        started.append(run)
        run.note("loss is what Keras reports: the running mean over the epoch so far; "
                 "replica -1 means the value is reduced over all replicas")
        if central_storage:
            run.note(CENTRAL_STORAGE_LOSS_NOTE)
        else:
            run.note(BATCH_LOSS_NOTE)
            RunWriter(run).update(loss_label=BATCH_LOSS_LABEL)
        recorder = FitRecorder.create(run, observers, central_storage)
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if extra_callbacks is not None:
            callbacks += extra_callbacks(model, run, kwargs)
        callbacks.append(recorder)
        return recorder.ended_fit(
            lambda: original(model, *args, callbacks=callbacks, **kwargs))

    with patched([(cls, "fit", fit)]):
        yield started


def planned_length(params: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(epochs, steps per epoch) of a fit from its callbacks' ``params`` (Keras 3 and tf_keras
    both give ``epochs`` and ``steps``, the latter None when the dataset's length is unknown)."""
    params = params or {}
    epochs, steps = params.get("epochs"), params.get("steps")
    return (epochs if isinstance(epochs, int) and epochs > 0 else None,
            steps if isinstance(steps, int) and steps > 0 else None)


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
