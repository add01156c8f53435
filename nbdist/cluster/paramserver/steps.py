"""Step mode under ParameterServerStrategy: the kernel schedules, the workers train async.

``PSStepLoop`` compiles the rewritten step cell into a ``tf.function`` of a per-worker iterator
(``ClusterCoordinator.create_per_worker_dataset``) returning one packed vector per step
(``stepfn``). ``ClusterCoordinator.schedule`` hands each step to whichever worker is free: no
barrier between workers, each applies its gradients to the variables on the parameter servers as
soon as it has them (asynchronous training). At most ``window`` steps are in flight, and the
loop waits only when the window is full. Each step appends its row to a ring on its worker
(``rowbuffer``: returning it would cost an RPC per step); the loop reads the rings every few
dozen steps or 0.2 s and records the rows in the order the steps finished, so the dashboard
follows every worker live. A re-run of an unchanged cell schedules the functions its last run
traced (``step.cache``): no tracing, and no removal of the old functions from the cluster (which
takes TensorFlow seconds at a cell's end). A kernel interrupt is raised between steps only.

Timing: ``step_ms`` is the worker's time for the whole step, ``data_ms`` getting the batch,
``compute_ms`` from the batch to the gradients (reading the parameters from the parameter
servers is part of it: they are read as the forward pass needs them). The parameter update
(``update_ms``, an extra column) is measured on timed steps only (``runner.TimingPacer``): a
hook on the optimizer's ``apply_gradients`` brackets it with timestamps, the second one after
a read of every updated variable on its parameter server, so it covers pushing the
gradients, applying them there and the acknowledgement. There is no allreduce:
``allreduce_ms`` stays empty.

Each worker's first step of a run also returns the digest of its batch in its row; once every
worker's is in, workers whose first batches are identical (a dataset function that ignores
which worker it runs on, a dataset copied to every worker unshuffled) get one note on the Run
(``same_input``, ``data.fingerprint``), which the backend also prints when the cell ends.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ...data.fingerprint import SAME_INPUT_PS, same_input_groups, same_input_note
from ...data.iterate import new_iterator, release
from ...errors import DataError, StepCodeError
from ...hooks.tf_coordinator import COORDINATOR_LOG_FILE
from ...step.keras_builds import call_building_optimizers
from ...step.loop import StepLoop
from ...step.runner import TimingPacer
from ...telemetry.probe import BATCH_SIZE
from ...telemetry.run import Run, RunWriter
from ...words import count
from ..engines.enginelogs import keep
from ..failures import WorkerStuck, controller_died_message
from .health import (
    CLUSTER_STATE,
    ProcessWatch,
    TaskDied,
    dead_message,
    dead_message_after,
    ready,
)
from .inputerror import input_error
from .rowbuffer import WorkerRows
from .stall import PSStall
from .stepfn import DIGEST, SPANS, Scheduler, compile_step

#: Steps scheduled ahead of the oldest unfinished one, per worker (TensorFlow's tutorial
#: schedules them all: a shallow window leaves workers idle while the kernel records rows).
WINDOW_PER_WORKER = 16
#: How often the loop checks that the worker and parameter-server processes are alive.
HEALTH_EVERY_S = 0.25
#: The workers' rows are read every this many finished steps, or this often (rowbuffer).
TAKE_EVERY_ROWS, TAKE_EVERY_S = 64, 0.2
LOST_ROWS = (" finished on a worker just before it died: their parameter updates "
             "were applied, but their rows were lost with it")
#: Errors a step raised on a worker that still answers (its dataset ran out, an assertion or
#: a shape check in the cell failed): the rows of the steps before it are read before the run
#: fails. Not after other errors: a worker cut off would make the read wait for its timeout.
RAISED_BY_THE_STEP = ("OutOfRangeError", "InvalidArgumentError", "FailedPreconditionError",
                      "ResourceExhaustedError")
#: Every step Run's notes: what its columns mean, and (``epoch_note``) how --data is read.
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


def ring_capacity(workers: int) -> int:
    """Rows each worker's ring holds: every step in flight and every one not read yet."""
    return max(256, 2 * (TAKE_EVERY_ROWS + WINDOW_PER_WORKER * workers))


def require_known_length(data: str | None, per_epoch: int | None) -> int:
    """Steps per epoch, or a StepCodeError if the coordinator cannot know how many."""
    if not per_epoch:
        raise StepCodeError(
            f"--data {data}: its number of batches is unknown (e.g. after `filter`), and under "
            "parameter_server the coordinator must know how many steps to schedule. Give "
            "--steps N (steps per epoch)."
        )
    return per_epoch


@dataclass
class PSStepLoop(StepLoop):
    """Runs a rewritten step cell on the workers through ``coordinator``, recording ``run``."""

    strategy: Any = field(kw_only=True)
    coordinator: Any = field(kw_only=True)
    workers: int = field(kw_only=True)
    watch: ProcessWatch = field(kw_only=True)
    per_epoch: int | None = field(default=None, kw_only=True)
    epoch_note: str | None = field(default=EPOCH_NOTE, kw_only=True)   # how --data is read
    on_worker_death: Callable[[int], None] = field(default=lambda index: None, kw_only=True)
    #: while True (``%distribute inject ... --at-step N`` waits for its step), one step is
    #: in flight and the rows are read after each, so the observers see each worker's count
    #: before it runs another step
    precise: Callable[[], bool] = field(default=lambda: False, kw_only=True)
    _dead_seen: set[int] = field(default_factory=set)
    _next_check: float = 0.0
    rows: WorkerRows = field(default=None, kw_only=True)   # the backend's rings of rows
    #: the backend's per-worker count 0, 1, 2, ... (stepfn.worker_positions): a fresh
    #: iterator of it per run numbers each worker's steps, so its first batch is fingerprinted
    positions: Any = field(default=None, kw_only=True)
    #: the note when workers read the same data (data.fingerprint), once their digests are in
    same_input: str | None = None
    _digests: dict[int, str] = field(default_factory=dict)   # worker -> first batch's digest
    _pending: deque[Any] = field(default_factory=deque)   # RemoteValues of scheduled steps
    _taken: deque[tuple[int, bool, dict[str, float]]] = field(default_factory=deque)
    _pacer: TimingPacer | None = None
    _scheduled: int = 0
    _next_step: int = 0     # the step number the next row recorded gets
    _finished: int = 0      # steps finished (their rows are in the workers' rings)
    _recorded: int = 0      # rows recorded into the Run
    _next_take: float = 0.0
    _stall: PSStall | None = None   # a worker stopped or stuck (``stall``), from the first step

    def execute(self) -> Run:
        per_epoch = require_known_length(self.spec.data, self.per_epoch)
        RunWriter(self.run).update(total_steps=per_epoch * self.spec.epochs)
        self.run.note(UPDATE_NOTE)
        if self.epoch_note:
            self.run.note(self.epoch_note)
        return super().execute()   # with the variants a run of this cell kept (step.cache)

    def _strategy(self) -> Any:
        return self.strategy

    # -- StepLoop's hooks ------------------------------------------------------------------
    def _running(self) -> contextlib.AbstractContextManager[Any]:
        return quiet_recovery_logs(self.run)

    def _interrupted(self) -> str:
        self._drain(quiet=True)
        return (f"Interrupted after step {self.run.steps_done}: nbdist stopped scheduling, "
                "waited for the steps already sent to the workers and kept them in "
                f"nbdist.runs[-1] (run {self.run.id}). The cluster is still usable.")

    def _failure(self, err: Exception) -> BaseException | None:
        if isinstance(err, (TaskDied, WorkerStuck)):   # no drain: its steps never finish
            return err
        died = self._dead_message_after(err)
        if died:
            return TaskDied(died)
        if type(err).__name__ in RAISED_BY_THE_STEP:
            self._drain(quiet=True)   # the workers answer: keep the rows of the steps that ran
            failed_input = input_error(
                err, self.spec.data, self.user_ns.get(self.spec.data or ""),
                lambda w: self.watch.describe("worker", w),
                lambda w: int((self.run.metrics["worker"] == w).sum()), self.run.steps_done)
            if failed_input is not None and type(err).__name__ != "OutOfRangeError":
                return failed_input
        if type(err).__name__ == "OutOfRangeError":
            return DataError(
                f"--data {self.spec.data}: a worker's dataset ran out after step "
                f"{self.run.steps_done}. Under parameter_server each worker reads its own "
                "dataset for as many steps as are scheduled: repeat it (`.repeat()`, as "
                "TensorFlow's parameter-server tutorial does) or give fewer --steps.")
        return None

    def _wind_down(self) -> None:
        self._drain(quiet=True)   # the steps already scheduled run anyway: not into a later run

    # -- the loop --------------------------------------------------------------------------
    def _loop(self, first_epoch: int, first: int) -> None:
        self.interrupts.hold()   # raised where check() is: never in TensorFlow's code or a save
        # per-worker already (data.per_worker_input); the positions start at 0 on each worker
        iterators = (new_iterator(self.dataset), new_iterator(self.positions))
        try:
            self._schedule_all(iterators, first)
        finally:
            iterators = tuple(map(release, iterators))   # not on the cell's thread

    def _schedule_all(self, iterators: Any, first: int) -> None:
        per_epoch = require_known_length(self.spec.data, self.per_epoch)
        total = per_epoch * self.spec.epochs
        window = WINDOW_PER_WORKER * self.workers
        self._pacer = TimingPacer(self.spec.timing_every)
        self._stall = PSStall(self.workers, lambda w: self.watch.state("worker", w))
        self._next_step = first
        self.rows.take(self._dead)   # rows an earlier failed run left unread are not ours
        for step in range(first, total):
            if self.checkpoint is not None and step > first and step % per_epoch == 0:
                self._drain()   # every step of the epoch applied: then save its state
                self.checkpoint.save(step // per_epoch, step)
            if any(o.should_stop() for o in self.observers):
                self._drain()
                RunWriter(self.run).finish("stopped")
                return
            self.interrupts.check()
            self._check_health()
            self._pending.append(self._schedule(iterators, self._variant(step)))
            self._scheduled = step
            # a fault waiting for its step: one step in flight, so no worker gets ahead of
            # the rows the kernel has read
            self._collect(wait=len(self._pending) >= (1 if self.precise() else window))
        self._drain()

    def _drain(self, quiet: bool = False) -> None:
        """Wait for every step already scheduled (the coordinator runs them anyway) and
        record their rows. ``quiet``: after an error, keep what can be read (the workers
        must answer: not after a worker died or was cut off)."""
        try:
            while self._pending:
                self._collect(wait=True, take=False)
        except Exception:
            if not quiet:
                raise
            self._pending.clear()   # the coordinator cancels the rest after an error
            with contextlib.suppress(Exception):
                self.coordinator.join()   # and clears the errors it holds: not the next run's
        try:
            self._take()
        except Exception:
            if not quiet:
                raise
            return
        lost = self._finished - self._recorded
        if lost > 0:   # one note, with the latest count (each epoch's checkpoint drains too)
            RunWriter(self.run).replace_note(LOST_ROWS, f"{count(lost, 'step')}{LOST_ROWS}")

    def _variant(self, step: int) -> bool:
        """Whether ``step`` runs the timed variant: as the pacer says, except that the first
        steps trace both variants. Tracing registers the function on every task and waits for
        each to answer, so a variant first traced after a worker stopped (SIGSTOP, a frozen
        host) would hang the kernel there; the pacer alone would trace the plain variant only
        once the first timed rows are read, when a worker may already be stopped."""
        due = self._pacer.due(step)
        used = {True, False} if self._pacer.every > 0 else {False}   # 0: never timed
        missing = used - set(self._compiled)
        return missing.pop() if missing and due not in missing else due

    def _schedule(self, iterators: Any, timed: bool) -> Any:
        fn = self._compiled.get(timed)
        if fn is not None:
            self._first_call(timed, iterators)
            return self.coordinator.schedule(fn, args=(iterators,))
        # First use: trace (in schedule), building any Keras optimizer the step would build.
        scheduler, remote = call_building_optimizers(
            lambda: Scheduler(self.coordinator, compile_step(
                self._factory, self.spec, self.strategy, timed, self._keys, self.rows)),
            iterators, self.strategy)
        self._keep_variant(timed, iterators, scheduler.fn)
        return remote

    def _collect(self, wait: bool, take: bool = True) -> None:
        """Count the steps that finished (in schedule order; ``wait``: for the oldest, while
        watching the processes), and read the workers' rows every ``TAKE_EVERY_ROWS`` of them
        or ``TAKE_EVERY_S`` (the dashboard follows the run)."""
        while wait and not ready(self._pending[0]):
            self.interrupts.check()
            self._check_health()
            if take and time.monotonic() >= self._next_take:   # the others' steps go on
                self._take()
            time.sleep(0.002)
        while self._pending and ready(self._pending[0]):
            self._pending[0].fetch()   # None, or the step's error raised
            self._finished += 1
            self._pending.popleft()
        unread = self._finished - self._recorded
        if take and unread and (unread >= TAKE_EVERY_ROWS or time.monotonic() >= self._next_take
                                or self.precise()):
            self._take()

    def _take(self) -> None:
        """Read the rows the workers appended since the last read and record them, in the
        order they finished."""
        self._next_take = time.monotonic() + TAKE_EVERY_S
        rows = [(bool(row[0]), dict(zip(self._keys[bool(row[0])], row[1:].tolist(),
                                        strict=False)))
                for row in self.rows.take(self._dead)]
        for timed, values in sorted(rows, key=lambda row: row[1]["t_end"]):
            self._taken.append((self._next_step, timed, values))
            self._next_step += 1
        while self._taken:   # recorded once each, even if an interrupt comes in between
            self._record(*self._taken[0])
            self._taken.popleft()

    def _record(self, step: int, timed: bool, values: dict[str, float]) -> None:
        """Append a finished step's row (once: an interrupt may come between recording and
        dequeuing). ``timed``: the compiled variant that ran it."""
        if step < self.run.steps_done:
            return
        digest = values.get(DIGEST, -1.0)
        if digest >= 0:
            self._first_batch(int(values["worker"]), digest)
        ms = {k: (values[b] - values[a]) * 1e3 for k, (a, b) in SPANS.items()
              if a in values and b in values}
        extra = {"update_ms": ms["update_ms"]} if "update_ms" in ms else None
        RunWriter(self.run).record_step(
            step, step // self.per_epoch, loss=[values["loss"]],
            grad_norm=[values["grad_norm"]] if "grad_norm" in values else None,
            compute_ms=[ms["compute_ms"]] if "compute_ms" in ms else None,
            step_ms=ms["step_ms"], data_ms=ms["data_ms"], worker=int(values["worker"]),
            replica=0, extra=extra, wall_time=values["t_end"],
        )
        self._recorded += 1
        if self._stall is not None:
            self._stall.recorded(int(values["worker"]), step,
                                 (ms["step_ms"] + ms["data_ms"]) / 1e3)
        if self._pacer is not None:   # spaces timed steps from the last scheduled one
            self._pacer.observe(self._scheduled, ms["step_ms"], timed)
        self.check_finite(step, [values["loss"]], worker=int(values["worker"]),
                          sizes=[values[BATCH_SIZE]] if BATCH_SIZE in values else None)
        self.notify()

    def _first_batch(self, worker: int, digest: float) -> None:
        """A worker's first-batch digest; once every live worker's is in, workers that read
        the same data are noted on the Run (``data.fingerprint``)."""
        self._digests[worker] = f"{int(digest):x}"
        if len(self._digests) >= self.workers - len(self._dead_seen):
            self._compare_first_batches()

    def _compare_first_batches(self) -> None:
        if self.same_input is not None or len(self._digests) < 2:
            return
        groups = same_input_groups(self._digests)
        if groups:
            self.same_input = same_input_note(groups, SAME_INPUT_PS)
            self.run.note(self.same_input)

    def _done(self) -> None:
        self._compare_first_batches()   # a worker that ran no step: the others' are compared

    def _dead(self) -> set[int]:
        """Workers whose rows cannot be read: dead, or stopped (a read would wait for it)."""
        return set(self.watch.dead().get("worker", [])) | {
            w for w in range(self.workers) if self.watch.state("worker", w) == "stopped"}

    # -- health ----------------------------------------------------------------------------
    def _check_health(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + HEALTH_EVERY_S
        gone = self.watch.controller_gone()
        if gone is not None:
            raise TaskDied(controller_died_message(
                gone, f" during this cell, after step {self.run.steps_done}", CLUSTER_STATE))
        dead = self.watch.dead()
        if dead.get("ps") or len(dead.get("worker", [])) == self.workers:
            raise TaskDied(self._dead_message())
        if self._stall is not None:
            found = self._stall.culprits(set(dead.get("worker", [])))
            if found is not None:
                raise WorkerStuck(self._stall.message(
                    *found, lambda w: self.watch.describe("worker", w), self.run.steps_done))
        for index in dead.get("worker", []):
            if index not in self._dead_seen:
                self._dead_seen.add(index)
                self.on_worker_death(index)
                who = self.watch.describe("worker", index)
                progress = self._worker_progress(index)
                print(f"nbdist: {who} died; {progress}; "
                      "ClusterCoordinator runs its unfinished steps on the other workers.",
                      file=sys.stderr)
                self.run.note(f"{who} died during the run ({progress}); ClusterCoordinator "
                              "re-ran its unfinished steps on the other workers")

    def _worker_progress(self, index: int) -> str:
        """What nbdist has of a worker's steps in this run, in the numbers users read: how
        many (what ``inject --at-step`` counts, less any rows lost with the worker) and its
        last step in ``Run.metrics``. The run's step count when the death is noticed is
        neither: the other workers went on."""
        columns, table = self.run.table_since(0)
        steps = table[table[:, columns.index("worker")] == index, columns.index("step")]
        if not len(steps):
            return "nbdist recorded none of its steps in this run"
        return (f"nbdist recorded {count(len(steps), 'step')} of it in this run, the last "
                f"step {int(steps.max())} in Run.metrics")

    def _dead_message_after(self, err: Exception) -> str:
        return dead_message_after(self.watch, err, self.run.steps_done)

    def _dead_message(self) -> str:
        return dead_message(self.watch, self.run.steps_done)


class CoordinatorLogs(logging.Filter):
    """Keeps the coordinator's own log records out of the cell: when a worker fails it logs
    every cancelled or retried step with a gRPC dump, dozens of lines that nbdist replaces by
    one error. They go to the collapsed worker logs (``engines.enginelogs``), counted.
    Installed on TensorFlow's logger while a cluster is connected (``diverted``): the
    coordinator's threads also log after a cell has ended, while the cluster stops."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0
        self._users = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.pathname.endswith(COORDINATOR_LOG_FILE):
            return True
        self.dropped += 1
        try:
            keep(f"TensorFlow's ClusterCoordinator: {record.getMessage()}")
        except Exception:  # a record that cannot format itself: counted, not shown
            pass
        return False

    @contextlib.contextmanager
    def diverted(self) -> Iterator[None]:
        logger = logging.getLogger("tensorflow")
        if self._users == 0:
            logger.addFilter(self)
        self._users += 1
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0:
                logger.removeFilter(self)


COORDINATOR_LOGS = CoordinatorLogs()


@contextlib.contextmanager
def quiet_recovery_logs(run: Run) -> Iterator[None]:
    before = COORDINATOR_LOGS.dropped
    try:
        with COORDINATOR_LOGS.diverted():
            yield
    finally:
        dropped = COORDINATOR_LOGS.dropped - before
        if dropped:
            run.note(f"TensorFlow's ClusterCoordinator logged {count(dropped, 'message')} "
                     "while it handled failures (in the collapsed worker logs below the cell: "
                     "the failure is described by the cell's error)")
