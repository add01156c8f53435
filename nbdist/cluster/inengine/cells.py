"""``%%distribute`` cells on a worker: scope mode, step mode, Keras fit recording, stopping.

Step mode reuses the kernel's ``StepRunner`` unchanged, with two observers: ``_Forwarder``
sends each new row of the worker's local Run to the kernel over the channel, and
``_GateObserver`` stops the loop at the step boundary the kernel's ``StopCoordinator`` chose.
``model.fit`` in a scope cell is recorded the same way by a small callback.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

from ...backends.cells import run_cell_code
from ...errors import RunInterrupted
from ...fitrecord import FitRecording, is_number, recorder_class
from ...patching import patched
from ...telemetry import fitreduce
from ...telemetry.run import Run
from .. import protocol
from ..failures import KerasUnsupported, describe_exception
from ..protocol import StopGate
from .worker import WorkerState, state, user_namespace

#: Metric rows go to the kernel at most this often (and at the end of each run).
FLUSH_S = 0.1
_MAX_REPR = 10000
KERAS3_MWMS = (
    "Keras 3 `model.fit` does not work under MultiWorkerMirroredStrategy in TensorFlow 2.21 "
    "(keras-team/keras#20585). Run the workers with tf_keras, the default when it is "
    "installed (`pip install tf-keras --no-deps`, then `%distribute restart`, or start with "
    "`%distribute multiworker --workers N --keras legacy`), and build the model with "
    "`tf.keras` rather than `import keras`; or train in step mode (`%%distribute --step`)."
)


class _Forwarder:
    """RunObserver sending a worker Run's new rows to the kernel, at most every FLUSH_S.

    Rows travel as dicts keyed by column name, with their extras (``Run.records_since``).
    Batching keeps the cost per training step to a clock read; the dashboard still updates
    ten times a second.
    """

    def __init__(self, st: WorkerState, key: str):
        self.st, self.key, self.sent, self.last = st, key, 0, 0.0

    def on_step(self, run: Run) -> None:
        self.st.step = run.steps_done
        now = time.monotonic()
        if now - self.last >= FLUSH_S:
            self.last = now
            self.flush(run)

    def flush(self, run: Run) -> None:
        records = run.records_since(self.sent)
        if not records or self.st.channel is None:
            return
        self.sent += len(records)
        self.st.channel.send({"type": protocol.ROWS, "run": self.key, "rows": records})

    def should_stop(self) -> bool:
        return False


class _GateObserver:
    def __init__(self, gate: StopGate):
        self.gate, self.steps = gate, 0

    def on_step(self, run: Run) -> None:
        self.steps = run.steps_done

    def should_stop(self) -> bool:
        return self.gate.should_stop(self.steps)


@contextlib.contextmanager
def _in_run(st: WorkerState, key: str, mode: str, run: Run, forward: _Forwarder,
            total: int | None = None) -> Iterator[None]:
    """Announce a run to the kernel; at its end send the last rows and the status."""
    st.gate.reset()
    st.step = 0
    st.channel.send({"type": protocol.RUN_START, "run": key, "mode": mode, "total_steps": total})
    try:
        yield
    except BaseException as err:
        if run.status == "running":
            interrupted = isinstance(err, (KeyboardInterrupt, RunInterrupted))
            run.finish("interrupted" if interrupted else "failed", str(err)[:500])
        raise
    finally:
        if run.status == "running":
            run.finish("done")
        forward.flush(run)
        st.channel.send({"type": protocol.RUN_END, "run": key, "status": run.status,
                         "notes": run.notes})
        st.channel.flush()
        st.gate.reset()


def _local_run(st: WorkerState, mode: str) -> Run:
    handle = st.handle
    return Run(id=0, mode=mode, strategy="multiworker", replicas=len(handle.devices),
               workers=st.workers, devices=tuple(handle.devices))


# -- step mode --------------------------------------------------------------------------------
#: The step cell ``prepare_step`` made ready on this worker, for the ``run_step`` after it.
_PREPARED: dict[str, tuple[Any, Any]] = {}


def prepare_step(cell: str, header: str, filename: str, key: str,
                 spec: dict[str, Any]) -> dict[str, Any]:
    """A step cell's first call on every worker: rewrite it and read its ``--data`` (checked
    and distributed: no collective, nothing created), kept for ``run_step``. The kernel calls
    ``run_step`` (and creates the Run) only once every worker got here: a ``--data`` refused
    on any worker leaves no Run and no ``--checkpoint`` directory behind.

    ``spec``: the cell's ``RunSpec.to_dict()``, its ``--checkpoint`` already absolute.
    """
    from ...backends.cells import step_cell, step_data
    from ...spec import RunSpec

    _PREPARED.clear()
    try:
        st = state()
        step = step_cell(cell, RunSpec.from_dict(spec), header, 0, filename=filename)
        data = step_data(step, st.handle.strategy, user_namespace(), len(st.handle.devices),
                         say=_chief_says(st))
        _PREPARED[key] = (step, data)
        return {"ok": True, "value": {"per_epoch": data.per_epoch}}
    except BaseException as err:
        return {"ok": False, "error": describe_exception(err, filename=filename)}


def run_step(key: str, filename: str) -> dict[str, Any]:
    """Run the step cell ``prepare_step`` made ready with ``StepRunner`` on this worker;
    metrics go to the kernel's Run. ``--checkpoint DIR`` is created here."""
    from ...backends.cells import step_checkpoint
    from ...runner import StepRunner

    try:
        st = state()
        if key not in _PREPARED:
            raise RuntimeError(f"nbdist: step cell {key} was not prepared on this worker")
        step, data = _PREPARED.pop(key)
        ns = user_namespace()
        checkpoint = step_checkpoint(step, st.handle.strategy, ns, say=_chief_says(st))
        run = _local_run(st, "step")
        if data.note:
            run.note(data.note)
        forward = _Forwarder(st, key)
        observers = [forward, _GateObserver(st.gate)]
        per_epoch = data.per_epoch
        with _in_run(st, key, "step", run, forward,
                     per_epoch * step.spec.epochs if per_epoch else None):
            StepRunner(step.source, ns, step.spec, run, observers=observers,
                       checkpoint=checkpoint, dataset=data.dataset,
                       handle=st.handle).execute()
        return {"ok": True, "value": {"status": run.status, "steps": run.steps_done,
                                      "notes": run.notes, "bytes": run.allreduce_bytes}}
    except BaseException as err:
        return {"ok": False, "error": describe_exception(err, filename=filename)}


# -- scope mode -------------------------------------------------------------------------------
def run_scope(cell: str, header: str, filename: str, cell_id: str,
              checkpoint: str | None = None) -> dict[str, Any]:
    """Run a cell under the strategy's scope, recording every ``model.fit`` into a Run.

    ``checkpoint``: --checkpoint DIR, Keras BackupAndRestore in each fit (nbdist.checkpoint).
    """
    try:
        st = state()
        from IPython import get_ipython

        fits = None
        if checkpoint:
            from ...checkpoint import FitCheckpoint

            fits = FitCheckpoint(checkpoint, say=_chief_says(st))
        with st.handle.strategy.scope(), _recording_fits(st, cell_id, fits):
            result = run_cell_code(get_ipython(), f"# {header}\n{cell}", filename)
        value = None if result is None else repr(result)[:_MAX_REPR]
        return {"ok": True, "value": value}
    except BaseException as err:
        return {"ok": False, "error": describe_exception(err, filename=filename)}


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
def _recording_fits(st: WorkerState, cell_id: str, fits: Any = None) -> Iterator[None]:
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
        run = _local_run(st, "fit")
        forward = _Forwarder(st, key)
        clock = _allreduce_clock(model, st, run)
        callback = _fit_callback(st, run, forward, clock)
        extra = fits.callbacks(model, run, kwargs) if fits is not None else []
        kwargs["callbacks"] = [*list(kwargs.get("callbacks") or []), *extra, callback]
        with _in_run(st, key, "fit", run, forward), fitreduce.hooked(clock):
            history = original(model, *args, **kwargs)
            if clock is not None and not callback.timed and run.steps_done:
                run.note("no gradient all-reduce was seen in tf_keras's optimizer (a custom "
                         "train_step?), so allreduce_ms is not measured")
            run.finish("stopped" if callback.stopped else "done")
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

    def __init__(self, st: WorkerState, run: Run, forward: _Forwarder, clock: Any = None):
        super().__init__()
        self.st, self.run, self.forward, self.clock = st, run, forward, clock

    def record_batch(self, logs: dict[str, Any], step_ms: float) -> None:
        scale = _batch_log_scale(self.model, self.st.handle.replicas)
        logs = {k: float(v) * scale for k, v in logs.items() if is_number(v)}
        extra = {k: v for k, v in logs.items() if k != "loss"}
        allreduce = self.clock.read_ms() if self.clock is not None else None
        self.timed = self.timed or allreduce is not None
        self.run.record_step(self.step, self.epoch, loss=[logs.get("loss", float("nan"))],
                             step_ms=step_ms, replica=-1, extra=extra or None,
                             allreduce_ms=allreduce)
        self.step += 1
        self.forward.on_step(self.run)

    def stop_requested(self) -> bool:
        return self.st.gate.should_stop(self.step)


def _fit_callback(st: WorkerState, run: Run, forward: _Forwarder, clock: Any = None) -> Any:
    """A tf_keras callback recording each training batch into the kernel's Run."""
    import tensorflow as tf

    cls = recorder_class("NbdistWorkerFitRecorder", _WorkerFitRecording,
                         tf.keras.callbacks.Callback)
    return cls(st, run, forward, clock)


def _chief_says(st: WorkerState) -> Any:
    """Where a worker tells the user something once: worker 0 prints, the others stay quiet."""
    return print if st.index == 0 else None


def _batch_log_scale(model: Any, replicas: int) -> float:
    """tf_keras sums per-batch logs over replicas under MultiWorkerMirroredStrategy.

    Its default ``distribute_reduction_method`` ("auto", i.e. "sum") adds up each replica's
    metric result, which is already the global mean: batch logs come out ``replicas`` times
    too large (epoch logs and History are right). nbdist records the mean.
    """
    method = getattr(model, "distribute_reduction_method", "auto")
    return 1.0 / replicas if method in ("auto", "sum") and replicas > 1 else 1.0
