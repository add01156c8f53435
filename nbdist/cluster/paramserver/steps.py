"""Step mode under ParameterServerStrategy: the kernel schedules, the workers train async.

``PSStepLoop`` compiles the rewritten step cell into a ``tf.function`` of a per-worker
iterator (``ClusterCoordinator.create_per_worker_dataset``) returning one packed vector per
step (``stepfn``).
``ClusterCoordinator.schedule`` hands each step to whichever worker is free: no barrier
between workers, each applies its gradients to the variables on the parameter servers as soon
as it has them (asynchronous training). At most ``window`` steps are in flight; the loop
records each finished step into the Run in schedule order, waiting only when the window is
full, so the dashboard follows every worker live. A re-run of an unchanged cell schedules the
functions its last run traced (``stepcache``, the backend's): no tracing, and no removal of
the old functions from the cluster (which took TensorFlow 1-7 s at a cell's end here).

Timing: ``step_ms`` is the worker's time for the whole step, ``data_ms`` getting the batch,
``compute_ms`` from the batch to the gradients (reading the parameters from the parameter
servers is part of it: they are read as the forward pass needs them). The parameter update
(``update_ms``, an extra column) is measured on timed steps only (``runner.TimingPacer``): a
hook on the optimizer's ``apply_gradients`` brackets it with timestamps, the second one after
a read of every updated variable on its parameter server, so it covers pushing the
gradients, applying them there and the acknowledgement. There is no allreduce:
``allreduce_ms`` stays empty.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...data.iterate import release
from ...errors import DataError, StepCodeError
from ...kerashooks import call_building_optimizers
from ...runner import TimingPacer
from ...stepcache import StepCache, TracedStep, adopted_source, cell_key, depends_on, execute_cached
from ...steploop import StepLoop
from ...telemetry.run import Run
from .health import (
    DEATH_GRACE_S,
    ProcessWatch,
    TaskDied,
    dead_message,
    dead_message_after,
    drain,
    ready,
)
from .instrument import EPOCH_NOTE, UPDATE_NOTE, quiet_recovery_logs
from .stepfn import SPANS, Scheduler, compile_step

#: Steps scheduled ahead of the oldest unfinished one, per worker (TensorFlow's tutorial
#: schedules them all: a shallow window leaves workers idle while the kernel records rows).
WINDOW_PER_WORKER = 16
#: How often the loop checks that the worker and parameter-server processes are alive.
HEALTH_EVERY_S = 0.25

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
    cache: StepCache | None = field(default=None, kw_only=True)   # the backend's traced steps
    _compiled: dict[bool, Any] = field(default_factory=dict)
    _columns: dict[bool, list[str]] = field(default_factory=dict)   # of each packed result
    _announced: set[bool] = field(default_factory=set)   # variants told to observers
    _dead_seen: set[int] = field(default_factory=set)
    _next_check: float = 0.0
    _pending: deque[tuple[int, int, bool, Any]] = field(default_factory=deque)
    _pacer: TimingPacer | None = None
    _scheduled: int = 0
    _lost: int = 0

    def execute(self) -> Run:
        per_epoch = require_known_length(self.spec.data, self.per_epoch)
        self.run.total_steps = per_epoch * self.spec.epochs
        self.run.note(UPDATE_NOTE)
        if self.epoch_note:
            self.run.note(self.epoch_note)
        if self.cache is None:
            return super().execute()
        return execute_cached(self.cache, cell_key(self.source, grouped=False), self._depends,
                              self._adopt, super().execute, self._traced_step)

    def _traced_step(self) -> TracedStep | None:
        return TracedStep(dict(self._compiled), dict(self._compiled), self._columns, None,
                          self._factory, self.source.filename) if self._compiled else None

    def _depends(self) -> Any:
        return depends_on(self.source, self.user_ns, self.strategy, self.dataset)

    def _adopt(self, entry: TracedStep) -> None:
        self._compiled.update(entry.compiled)
        self._columns, self._factory = entry.keys, entry.factory
        self.source = adopted_source(self.source, entry)

    # -- StepLoop's hooks ------------------------------------------------------------------
    def _running(self) -> contextlib.AbstractContextManager[Any]:
        return quiet_recovery_logs(self.run)

    def _interrupted(self) -> str:
        self._drain(quiet=True)
        return (f"Interrupted after step {self.run.steps_done}: nbdist stopped scheduling, "
                "waited for the steps already sent to the workers and kept them in "
                f"nbdist.runs[-1] (run {self.run.id}). The cluster is still usable.")

    def _failure(self, err: Exception) -> BaseException | None:
        if isinstance(err, TaskDied):
            return err
        died = self._dead_message_after(err)
        if died:
            return TaskDied(died)
        if type(err).__name__ == "OutOfRangeError":
            return DataError(
                f"--data {self.spec.data}: a worker's dataset ran out after step "
                f"{self.run.steps_done}. Under parameter_server each worker reads its own "
                "dataset for as many steps as are scheduled: repeat it (`.repeat()`, as "
                "TensorFlow's parameter-server tutorial does) or give fewer --steps.")
        return None

    # -- the loop --------------------------------------------------------------------------
    def _loop(self, first_epoch: int, first: int) -> None:
        iterator = iter(self.dataset)   # per-worker already (data.per_worker_input)
        try:
            self._schedule_all(iterator, first)
        finally:
            iterator = release(iterator)   # not on the cell's thread (data.iterate)

    def _schedule_all(self, iterator: Any, first: int) -> None:
        per_epoch = require_known_length(self.spec.data, self.per_epoch)
        total = per_epoch * self.spec.epochs
        window = WINDOW_PER_WORKER * self.workers
        self._pacer = TimingPacer(self.spec.timing_every)
        for step in range(first, total):
            if self.checkpoint is not None and step > first and step % per_epoch == 0:
                self._drain()   # every step of the epoch applied: then save its state
                self.checkpoint.save(step // per_epoch, step)
            if any(o.should_stop() for o in self.observers):
                self._drain()
                self.run.finish("stopped")
                return
            self._check_health()
            timed = self._pacer.due(step)
            self._pending.append((step, step // per_epoch, timed,
                                  self._schedule(iterator, timed)))
            self._scheduled = step
            # rows of finished steps now, without waiting; wait only when the window is full
            while self._pending and (len(self._pending) >= window
                                     or ready(self._pending[0][3])):
                self._record(*self._pending[0])
                self._pending.popleft()
        self._drain()

    def _drain(self, quiet: bool = False) -> None:
        """Record every step already scheduled (the coordinator runs them anyway)."""
        drain(self._pending, self._record, quiet)

    def _schedule(self, iterator: Any, timed: bool) -> Any:
        fn = self._compiled.get(timed)
        if fn is not None:
            if timed not in self._announced:   # traced by an earlier run of this cell
                self._announced.add(timed)
                self.traced(fn, iterator, timed)
            return self.coordinator.schedule(fn, args=(iterator,))
        # First use: trace (in schedule), building any Keras optimizer the step would build.
        scheduler, remote = call_building_optimizers(
            lambda: Scheduler(self.coordinator, compile_step(
                self._factory, self.spec, self.strategy, timed, self._columns)), iterator,
            self.strategy)
        self._compiled[timed] = scheduler.fn
        self._announced.add(timed)
        self.traced(scheduler.fn, iterator, timed)   # e.g. `%%distribute --graph`
        return remote

    def _record(self, step: int, epoch: int, timed: bool, remote: Any) -> None:
        """Wait for a scheduled step's result and append its row (once: an interrupt may
        come between recording and dequeuing)."""
        if step < self.run.steps_done:
            return
        while True:   # fetch blocks; wake up to watch the processes meanwhile
            if ready(remote):
                break
            self._check_health()
            time.sleep(0.002)
        try:
            values = dict(zip(self._columns[timed], remote.fetch().tolist(), strict=True))
        except Exception as err:
            if not self._lost_with_dead_worker(err):
                raise
            return
        ms = {k: (float(values[b]) - float(values[a])) * 1e3 for k, (a, b) in SPANS.items()
              if a in values and b in values}
        extra = {"update_ms": ms["update_ms"]} if "update_ms" in ms else None
        self.run.record_step(
            step, epoch, loss=[float(values["loss"])],
            grad_norm=[float(values["grad_norm"])] if "grad_norm" in values else None,
            compute_ms=[ms["compute_ms"]] if "compute_ms" in ms else None,
            step_ms=ms["step_ms"], data_ms=ms["data_ms"], worker=int(values["worker"]),
            replica=0, extra=extra, wall_time=float(values["t_end"]),
        )
        if self._pacer is not None:   # spaces timed steps from the last scheduled one
            self._pacer.observe(self._scheduled, ms["step_ms"], timed)
        self.notify()

    # -- health ----------------------------------------------------------------------------
    def _check_health(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + HEALTH_EVERY_S
        dead = self.watch.dead()
        if dead.get("ps") or len(dead.get("worker", [])) == self.workers:
            raise TaskDied(self._dead_message())
        for index in dead.get("worker", []):
            if index not in self._dead_seen:
                self._dead_seen.add(index)
                self.on_worker_death(index)
                who = self.watch.describe("worker", index)
                print(f"nbdist: {who} died after step {self.run.steps_done}; "
                      "ClusterCoordinator runs its unfinished steps on the other workers.",
                      file=sys.stderr)
                self.run.note(f"{who} died during the run; ClusterCoordinator re-ran its "
                              "unfinished steps on the other workers")

    def _lost_with_dead_worker(self, err: Exception) -> bool:
        """A step a worker finished just before it died: its update reached the parameter
        servers, but its result stayed on the worker (a RemoteValue's tensors live there
        until fetched). Count it as lost; any other error is the run's."""
        if type(err).__name__ != "UnavailableError":
            return False
        text = str(err)
        deadline = time.monotonic() + DEATH_GRACE_S
        while True:   # a killed process closes its sockets a moment before psutil sees it
            dead = self.watch.dead()
            if dead.get("ps") or len(dead.get("worker", [])) == self.workers:
                raise TaskDied(self._dead_message()) from None
            if any(f"/job:worker/replica:0/task:{i}" in text for i in dead.get("worker", [])):
                break
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        self._check_health()
        self._lost += 1
        self.run.note(f"{self._lost} step(s) finished on a worker just before it died: their "
                      "parameter updates were applied, but their metrics were lost with it")
        if self._lost > 1:   # one note, with the current count
            old = f"{self._lost - 1} step(s) finished"
            self.run.notes[:] = [n for n in self.run.notes if not n.startswith(old)]
        return True

    def _dead_message_after(self, err: Exception) -> str:
        return dead_message_after(self.watch, err, self.run.steps_done)

    def _dead_message(self) -> str:
        return dead_message(self.watch, self.run.steps_done)
