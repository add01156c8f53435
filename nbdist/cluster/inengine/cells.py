"""``%%distribute`` cells on a worker: scope mode, step mode, Keras fit recording, stopping.

Step mode reuses the kernel's ``StepRunner`` unchanged, with two observers: ``Forwarder``
sends each new row of the worker's local Run to the kernel over the channel, and
``GateObserver`` stops the loop at the step boundary the kernel's ``StopCoordinator`` chose.
``model.fit`` in a scope cell is recorded the same way by a small callback.
"""

from __future__ import annotations

from typing import Any

from ...backends.cells import run_cell_code
from ...tflogs import quiet_tensorflow
from .. import protocol
from ..failures import describe_exception
from ..protocol import Outcome
from .fits import recording_fits
from .runs import Forwarder, GateObserver, chief_says, in_run, local_run
from .worker import state, user_namespace

_MAX_REPR = 10000



# -- step mode --------------------------------------------------------------------------------
#: The step cell ``prepare_step`` made ready on this worker, for the ``run_step`` after it.
_PREPARED: dict[str, tuple[Any, Any]] = {}


def _prepare_step(cell: str, header: str, filename: str, key: str,
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
                         say=chief_says(st))
        _PREPARED[key] = (step, data)
        return Outcome(ok=True, value={"per_epoch": data.per_epoch}).to_dict()
    except BaseException as err:
        return Outcome(ok=False, error=describe_exception(err, filename=filename)).to_dict()


def _run_step(key: str, filename: str) -> dict[str, Any]:
    """Run the step cell ``prepare_step`` made ready with ``StepRunner`` on this worker;
    metrics go to the kernel's Run. ``--checkpoint DIR`` is created here."""
    from ...backends.cells import step_checkpoint
    from ...step.runner import StepRunner

    run = None
    try:
        st = state()
        if key not in _PREPARED:
            raise RuntimeError(f"nbdist: step cell {key} was not prepared on this worker")
        step, data = _PREPARED.pop(key)
        ns = user_namespace()
        checkpoint = step_checkpoint(step, st.handle.strategy, ns, say=chief_says(st))
        run = local_run(st, "step")
        if data.note:
            run.note(data.note)
        forward = Forwarder(st, key)
        observers = [forward, GateObserver(st.gate)]
        per_epoch = data.per_epoch
        with in_run(st, key, "step", run, forward,
                     per_epoch * step.spec.epochs if per_epoch else None):
            runner = StepRunner(step.source, ns, step.spec, run, observers=observers,
                                checkpoint=checkpoint, dataset=data.dataset, handle=st.handle,
                                on_first_batch=_input_digest_sender(st, key))
            try:
                runner.execute()
            finally:
                runner.release()   # the traced step is dropped with the runner
        return Outcome(ok=True, value={"status": run.status, "steps": run.steps_done,
                                       "notes": run.notes, "bytes": run.allreduce_bytes}
                       ).to_dict()
    except BaseException as err:
        error = describe_exception(err, filename=filename)
        if run is not None:   # the steps this worker finished before it failed
            error["step"] = run.steps_done
        return Outcome(ok=False, error=error).to_dict()


def _input_digest_sender(st: Any, key: str) -> Any:
    """What sends this worker's first-batch fingerprint to the kernel (``data.fingerprint``),
    which compares the workers' to tell whether they read the same data."""
    from ...data.fingerprint import batch_digest

    def send(batch: Any) -> None:
        if st.channel is None or st.workers < 2:
            return
        try:
            digest = batch_digest(batch)
        except Exception:   # a batch that cannot be fingerprinted is not compared
            return
        st.channel.send({"type": protocol.INPUT_DIGEST, "run": key, "digest": digest})

    return send


# -- scope mode -------------------------------------------------------------------------------
def _run_scope(cell: str, header: str, filename: str, cell_id: str,
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

            fits = FitCheckpoint(checkpoint, say=chief_says(st))
        with st.handle.strategy.scope(), recording_fits(st, cell_id, fits):
            result = run_cell_code(get_ipython(), f"# {header}\n{cell}", filename)
        value = None if result is None else repr(result)[:_MAX_REPR]
        return Outcome(ok=True, value=value).to_dict()
    except BaseException as err:
        return Outcome(ok=False, error=describe_exception(err, filename=filename)).to_dict()


# ipyparallel sends these by value (code and closure), so they are plain functions that enter
# ``quiet_tensorflow`` themselves: a context-manager decorator's closure holds a generator,
# which cannot be pickled.
def prepare_step(cell: str, header: str, filename: str, key: str,
                 spec: dict[str, Any]) -> dict[str, Any]:
    """A step cell's first call on every worker (see ``_prepare_step``), TensorFlow's logs
    quiet as in the kernel's ``%%distribute`` cells (``nbdist.tflogs``)."""
    with quiet_tensorflow():
        return _prepare_step(cell, header, filename, key, spec)


def run_step(key: str, filename: str) -> dict[str, Any]:
    """Run the prepared step cell on this worker (see ``_run_step``), logs quiet."""
    with quiet_tensorflow():
        return _run_step(key, filename)


def run_scope(cell: str, header: str, filename: str, cell_id: str,
              checkpoint: str | None = None) -> dict[str, Any]:
    """Run a scope cell on this worker (see ``_run_scope``), logs quiet."""
    with quiet_tensorflow():
        return _run_scope(cell, header, filename, cell_id, checkpoint)
