"""A worker's Run and how its rows reach the kernel: ``Forwarder`` sends new rows over the
channel, ``GateObserver`` stops at the step the kernel chose, ``in_run`` brackets a run with
its start and end messages."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...errors import RunInterrupted
from ...telemetry.rows import pack
from ...telemetry.run import Run, RunObserver, RunWriter
from .. import protocol
from ..protocol import StopGate
from .worker import WorkerState

#: Metric rows go to the kernel at most this often (and at the end of each run).
FLUSH_S = 0.1


class Forwarder(RunObserver):
    """RunObserver sending a worker Run's new rows to the kernel, at most every FLUSH_S.

    Rows travel packed by column name, extras included (``rows.pack``).
    Batching keeps the cost per training step to a clock read; the dashboard still updates
    ten times a second. ``flush`` also runs on the channel's thread (``protocol.FLUSH_ROWS``,
    while the training loop is blocked in a collective), hence the lock.
    """

    def __init__(self, st: WorkerState, key: str):
        self.st, self.key, self.sent, self.last = st, key, 0, 0.0
        self._lock = threading.Lock()

    def on_step(self, run: Run) -> None:
        self.st.step = run.steps_done
        faults = self.st.faults   # %distribute inject ... --at-step N, slow
        now = time.monotonic()
        if now - self.last >= FLUSH_S or (faults is not None and faults.due(run.steps_done)):
            self.last = now
            self.flush(run)
        if faults is not None:
            faults.on_step(run.steps_done)

    def flush(self, run: Run) -> None:
        with self._lock:
            if run.n_rows == self.sent or self.st.channel is None:
                return
            names, values = run.table_since(self.sent)
            self.sent += len(values)
            self.st.channel.send({"type": protocol.ROWS, "run": self.key,
                                  **pack(names, values), "total_steps": run.total_steps,
                                  "epochs": run.epochs, "loss_scale": run.loss_scale})

    def should_stop(self) -> bool:
        return False


class GateObserver(RunObserver):
    def __init__(self, gate: StopGate):
        self.gate, self.steps = gate, 0

    def on_step(self, run: Run) -> None:
        self.steps = run.steps_done

    def should_stop(self) -> bool:
        return self.gate.should_stop(self.steps)


@contextlib.contextmanager
def in_run(st: WorkerState, key: str, mode: str, run: Run, forward: Forwarder,
            total: int | None = None) -> Iterator[None]:
    """Announce a run to the kernel; at its end send the last rows and the status."""
    st.gate.reset()
    st.step, st.running = 0, True
    st.send_unsent = lambda: forward.flush(run)
    st.channel.send({"type": protocol.RUN_START, "run": key, "mode": mode, "total_steps": total})
    try:
        yield
    except BaseException as err:
        if run.status == "running":
            interrupted = isinstance(err, (KeyboardInterrupt, RunInterrupted))
            RunWriter(run).finish("interrupted" if interrupted else "failed", str(err)[:500])
        raise
    finally:
        st.running, st.send_unsent = False, None
        if run.status == "running":
            RunWriter(run).finish("done")
        forward.flush(run)
        st.channel.send({"type": protocol.RUN_END, "run": key, "status": run.status,
                         "notes": run.notes, "epochs": run.epoch_rows()})
        st.channel.flush()
        st.gate.reset()


def local_run(st: WorkerState, mode: str) -> Run:
    handle = st.handle
    return Run(id=0, mode=mode, strategy=handle.spec.name, replicas=len(handle.devices),
               workers=st.workers, devices=tuple(handle.devices))


def chief_says(st: WorkerState) -> Any:
    """Where a worker tells the user something once: worker 0 prints, the others stay quiet."""
    return print if st.index == 0 else None
