"""``%distribute inject`` under parameter_server: the kernel applies the faults itself.

The workers only run the TensorFlow functions the coordinator schedules (no nbdist code runs
in them), so the kernel signals the worker's process (its engine; through ipyparallel for
remote ones), at once or, with ``--at-step N``, once that worker has done N steps of a run (counted
from the rows the coordinator records; while a fault waits for its step one step is in flight
and the rows are read after each, so it lands right after the worker's step N):

- ``kill``: SIGKILL. ClusterCoordinator takes the worker as preempted: the steps it held go
  back in the queue, the other workers run them and the run goes on (tutorial 05).
- ``stop``: SIGSTOP. The coordinator waits for the step the frozen worker holds without a
  time limit; nbdist names the stopped worker within a second and fails the run
  (``stall``), and ``%distribute restart`` resumes it before it starts fresh processes.
- ``slow`` is refused (``NOT_HERE``): the workers run no nbdist code between their steps,
  and pausing the process after each step would stall the coordinator as a frozen worker
  does. A straggler is made in the step code instead (tutorial 05, section 6).
  The kinds that change a link (``partition``, ``heal``) are not offered here.

Only workers can be targeted. A parameter server lost ends the run at once with an error
naming it (its variables are gone): kill its process (its pid is in ``%distribute status``)
to see that.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from ...telemetry.rows import POSITION
from ...telemetry.run import Run, RunObserver
from ..injection import check, entry, what
from ..protocol import FAULT_KINDS

#: The kinds of fault offered under parameter_server: the kernel sends their signal.
OFFERED = ("kill", "stop")
#: Why a kind is refused here, where there is more to say than ``NOT_OFFERED``.
NOT_HERE = {
    "slow": ("`%distribute inject slow` under parameter_server: the workers only run the "
             "TensorFlow functions the coordinator sends them (no nbdist code runs between "
             "their steps), and pausing the process stalls the coordinator as a frozen worker "
             "does. Make the straggler in your step code: `if tf.distribute.coordinator."
             "experimental_get_current_worker_index() == 1:` do extra work (tutorial 05, "
             "section 6)."),
}
NOT_OFFERED = ("`%distribute inject {fault}` is offered under multiworker only: under "
               "parameter_server use `inject kill WORKER` or `inject stop WORKER` to take a "
               "worker away.")


class PSFaults:
    """The injection log and the faults waiting for their step. ``signal_worker(sig,
    worker)`` signals a worker's process."""

    def __init__(self, signal_worker: Callable[[int, int], None], workers: int):
        self.signal_worker, self.workers = signal_worker, workers
        self.log: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []

    def inject(self, fault: str | None, worker: str | None, at_step: int | None,
               delay: float | None) -> str:
        if isinstance(worker, str) and worker.startswith("ps"):
            raise ConfigError(f"inject {fault} {worker}: only workers can be targeted. A "
                              "parameter server lost ends the run at once with an error "
                              "naming it (its variables are gone); to see that, kill its "
                              "process (the pid `%distribute status` shows).")
        fault, index, delay = check(fault, worker, self.workers, at_step, delay)
        if fault not in OFFERED:
            raise ConfigError(NOT_HERE.get(fault) or NOT_OFFERED.format(fault=fault))
        e = entry(fault, index, at_step, delay)
        self.log.append(e)
        if at_step is None:
            self.apply(e, -1)
        else:
            self.pending.append(e)
        return f"nbdist: {what(e)}."

    def observer(self) -> _Watch:
        """For one cell's runs: applies the faults waiting for their step."""
        return _Watch(self)

    def forget(self) -> None:
        """Drop the faults still waiting for their step (the cluster stops)."""
        self.pending.clear()

    def apply(self, e: dict[str, Any], steps_done: int) -> None:
        e["applied_step"], e["applied_at"] = steps_done, time.time()
        self.signal_worker(signal.Signals[FAULT_KINDS[e["fault"]].signal], e["worker"])


class _Watch(RunObserver):
    """RunObserver: counts each worker's recorded steps of this run."""

    def __init__(self, faults: PSFaults):
        self.faults, self.run = faults, None
        self.seen, self.done = 0, [0] * faults.workers

    def on_step(self, run: Run) -> None:
        if run is not self.run:   # a scope cell's second model.fit: a new run
            self.run, self.seen, self.done = run, 0, [0] * self.faults.workers
        if run.n_rows == self.seen:
            return
        rows = run.block_since(self.seen)
        self.seen += len(rows)
        for value in rows[:, POSITION.worker]:
            worker = int(value)
            if not 0 <= worker < len(self.done):
                continue
            self.done[worker] += 1
        for e in [e for e in self.faults.pending if self.done[e["worker"]] >= e["at_step"]]:
            self.faults.pending.remove(e)
            self.faults.apply(e, self.done[e["worker"]])

    def should_stop(self) -> bool:
        return False
