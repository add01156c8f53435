"""What a cell run on every worker comes to: the Runs' statuses, one error for N workers, and
the value of the cell's last expression on each worker."""

from __future__ import annotations

from typing import Any

from ...errors import RunInterrupted
from ...telemetry.run import Run, RunWriter
from ..failures import build_error
from ..protocol import Outcome

FIT_NOTE = (
    "loss is what tf_keras reports on each worker: the running mean over the epoch, already "
    "reduced over all workers (replica -1), and batch_loss each batch's own loss recovered "
    "from it (what the dashboard draws). tf_keras's own per-batch logs under "
    "MultiWorkerMirroredStrategy are that mean times the number of replicas (its 'auto' "
    "reduction sums them); nbdist records the mean. `model.distribute_reduction_method = "
    "'first'` fixes the logs your own callbacks see"
)
STEP_NOTE = ("under multiworker wait_ms covers replicas of the same worker, and the time a worker "
             "waited for a later one to reach the step (taken out of its data_ms); waiting for "
             "the other workers inside the gradient all-reduce is part of allreduce_ms")


def finish_runs(outcomes: dict[int, Outcome], interrupted: bool, runs: list[Run],
                workers: int, stopped: bool = False) -> None:
    """Mark ``runs`` done, stopped (``stopped``: the Stop button), interrupted or failed from
    every worker's outcome; raise the error the cell shows (one for all workers), if any.
    The kernel decides, whether or not the workers' own ends have arrived yet."""
    # abandoned: blocked waiting for a failed worker, and ended by the kernel (dispatch)
    waiting = sorted(w for w, o in outcomes.items() if o.abandoned)
    failures = {w: o.error for w, o in outcomes.items() if o.error is not None}
    for run in runs:
        if run.status == "running" or (interrupted and run.status == "stopped"):
            RunWriter(run).finish("interrupted" if interrupted else "failed" if failures
                                  else "stopped" if stopped else "done")
    real = {w: o.error for w, o in outcomes.items() if o.failed()}
    if real:
        raise build_error(real, workers, waiting, ended=True)
    if (interrupted or failures) and runs:
        steps = max(r.steps_done for r in runs)
        raise RunInterrupted(
            f"Interrupted: the workers stopped together after step {steps}; the steps "
            "finished so far are kept in nbdist.runs[-1]. The workers are still usable."
        )
    if interrupted or failures:
        raise RunInterrupted("Interrupted: KeyboardInterrupt was raised in the cell's code "
                             "on every worker. The workers are still usable.")


class WorkerValues:
    """The value of a cell's last expression on each worker (shown once if all agree)."""

    def __init__(self, values: dict[int, str | None]):
        self.values = values

    def __repr__(self) -> str:
        distinct = set(self.values.values())
        if len(distinct) == 1:
            return str(distinct.pop())
        return "\n".join(f"[worker {w}] {v}" for w, v in sorted(self.values.items()))

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(repr(self))
