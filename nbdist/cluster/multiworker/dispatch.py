"""Run one call on every worker and wait for it like a cell: live output, health, interrupts.

While the workers run, the kernel's main thread loops every ~50 ms: it prints new worker
output (``[worker i]`` prefix), shows new metric rows to the observers, checks that every
worker process is alive and still sending heartbeats, and drives the stop protocol after a
kernel interrupt or a Stop request. A dead worker fails the call within a few seconds,
after giving the survivors ``SURVIVOR_GRACE_S`` to fail on their own (their collectives lose
the peer); survivors still blocked then are ended, as they would otherwise wait for the
collective. A worker whose cell failed (its input raised, say) leaves the others blocked in
their next collective: after the same grace the ones still inside TensorFlow are ended too
(``_PeerFailed``). A worker alive but stuck is found by ``stall`` and diagnosed from every
worker's stacks.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from ...errors import ConfigError
from ...telemetry.run import RunObserver
from ..failures import (
    ClusterError,
    ControllerDied,
    WorkerDied,
    WorkerHung,
    WorkerStuck,
    controller_died_message,
    describe_exception,
)
from ..protocol import Outcome
from .monitor import HUNG_AFTER_S, ClusterMonitor
from .output import WorkerOutput
from .stall import ANSWER_S, diagnose, stacks_text, stuck_message

POLL_S = 0.05
#: After a worker died: how long the others get to finish (fail) on their own.
SURVIVOR_GRACE_S = 3.0
#: After an interrupt: when to send SIGINT to workers that did not stop, and when to give up.
ESCALATE_S = 8.0
GIVE_UP_S = 20.0
#: A local worker process stopped (SIGSTOP) this long is diagnosed at once, first step or not.
STOPPED_S = 1.0
#: Without any run on the workers (plain code), SIGINT is sent after this long.
NO_RUN_SIGINT_S = 0.5
#: What is lost with multiworker's workers when they must be ended.
WORKER_STATE = ("the workers' state: the models, optimizers, datasets and variables your "
                "`%%distribute` cells built on them")


class Dispatcher:
    """Calls functions on the workers' engines (``engine_ids[i]`` is worker ``i``)."""

    def __init__(self, client: Any, engine_ids: list[int], monitor: ClusterMonitor,
                 signal_workers: Callable[..., None],
                 pids: dict[int, int] | None = None,
                 controller_gone: Callable[[], int | None] = lambda: None):
        self.client = client
        self.controller_gone = controller_gone   # EngineSet.controller_gone
        self.engine_ids = engine_ids
        self.monitor = monitor
        self.signal_workers = signal_workers
        self.pids = pids or {}
        self._stopped_since: dict[int, float] = {}   # worker -> when it was seen stopped
        self.reach: Any = None   # reach.ReachWatch: workers on other hosts

    def call(self, fn: Callable[..., Any], args: list[tuple[Any, ...]],
             observers: list[RunObserver] = (), quiet: bool = False,
             fail_fast: float | None = None) -> tuple[dict[int, Outcome], bool]:
        """Run ``fn(*args[i])`` on worker i; return ({worker: outcome}, interrupted).

        ``quiet``: show the workers' output only if the call fails. ``fail_fast``: once a
        worker has failed, wait at most this many seconds for the others; those still running
        then get an ``abandoned`` outcome (they are typically blocked
        waiting for the failed one, e.g. in the strategy's start-up, and must be stopped).
        """
        self._check_alive()
        results = {}
        for i, eid in enumerate(self.engine_ids):
            try:
                results[i] = self.client[eid].apply_async(fn, *args[i])
            except IndexError:   # the controller already dropped the engine: it is gone
                self._abandon(results)
                raise _died([i], self.pids, {}, self.monitor, True) from None
        return self.wait(results, list(observers), quiet, fail_fast)

    def _check_alive(self) -> None:
        """Refuse to dispatch to workers known dead (killed between cells, out of memory): the
        others would wait for them in their first collective."""
        self._check_controller(before_cell=True)
        dead = self.dead_workers()
        if dead:
            raise _died(dead, self.pids, {}, self.monitor, True)
        stopped = [w for w, pid in sorted(self.pids.items())
                   if _process_state(pid).startswith("stopped")]
        if stopped:   # not broken yet: it may be resumed
            raise ConfigError(
                f"worker {stopped[0]} (pid {self.pids[stopped[0]]}) is stopped (SIGSTOP, or a "
                "debugger), so this cell was not run: the others would wait for it. Resume it "
                f"(`kill -CONT {self.pids[stopped[0]]}`) and run the cell again, or run "
                "`%distribute restart` to start fresh workers.")

    def _abandon(self, results: dict[int, Any]) -> None:
        """Calls already sent when a later one could not be: interrupt them (they wait for
        the missing worker)."""
        if results:
            self.signal_workers(signal.SIGKILL, sorted(results))

    def wait(self, results: dict[int, Any], observers: list[RunObserver], quiet: bool = False,
             fail_fast: float | None = None) -> tuple[dict[int, Outcome], bool]:
        try:
            return self._wait(results, observers, quiet, fail_fast)
        finally:   # rows held to align the workers' steps (``arrivals``) reach their Runs
            self.monitor.flush_rows()

    def _wait(self, results: dict[int, Any], observers: list[RunObserver], quiet: bool,
              fail_fast: float | None) -> tuple[dict[int, Outcome], bool]:
        output = WorkerOutput(results, quiet)
        stopping: _Stopping | None = None
        give_up = _FailFast(results, fail_fast)
        peer_failed = _PeerFailed(self, results)
        while True:
            try:
                while not all(ar.ready() for ar in results.values()) and not give_up():
                    output.pump()
                    self._notify(observers)
                    self._check_health(results, output)
                    if stopping is None and fail_fast is None and peer_failed():
                        break
                    if stopping is not None:
                        stopping.tick()
                    elif any(o.should_stop() for o in observers):
                        stopping = _Stopping(self, interrupted=False)
                    else:   # not while the workers pause for a stop
                        self._check_progress(results)
                    _wait_a_little(results)
                break
            except KeyboardInterrupt:
                if stopping is None or not stopping.interrupted:
                    stopping = _Stopping(self, interrupted=True)
                else:
                    stopping.escalate()
        if give_up.expired:
            outcomes = {i: _outcome(ar) if ar.ready() else Outcome(ok=False, abandoned=True)
                        for i, ar in results.items()}
            output.pump(final=True, show=True)
            return outcomes, False
        if peer_failed.ended:
            outcomes = {i: Outcome(ok=False, abandoned=True) if i in peer_failed.ended
                        else _outcome(ar) for i, ar in results.items()}
            output.pump(final=True, show=True)
            self._notify(observers)
            return outcomes, False
        self._check_health(results, output)   # a worker may have died just as it returned
        for ar in results.values():
            ar.wait_for_output(1.0)
        outcomes = {i: _outcome(ar) for i, ar in results.items()}
        output.pump(final=True, show=not all(o.ok for o in outcomes.values()))
        self._notify(observers)
        return outcomes, bool(stopping and stopping.interrupted)

    def _notify(self, observers: list[RunObserver]) -> None:
        for run in self.monitor.runs_with_news():
            for observer in observers:
                observer.on_step(run)

    # -- health ----------------------------------------------------------------------------
    def dead_workers(self) -> list[int]:
        dead = []
        for worker, pid in self.pids.items():
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    dead.append(worker)
            except psutil.NoSuchProcess:
                dead.append(worker)
        return dead

    def _check_controller(self, before_cell: bool = False) -> None:
        """The controller died: nothing reaches the workers, nor comes back from them. Their
        last rows are collected (they come over the channel), then they are ended."""
        pid = self.controller_gone()
        if pid is None:
            return
        workers = list(range(len(self.engine_ids)))
        steps = [h.step for h in self.monitor.health if h.step is not None]
        if before_cell:
            during = " since the last cell, so this cell was not run" + (
                f" (its last run ended at step {max(steps)})" if steps else "")
        else:
            self.monitor.collect_unsent_rows(sorted(self.monitor.running_workers()))
            steps += [r.steps_done for r in self.monitor.runs() if r.status == "running"]
            during = " during this cell" + (f", after step {max(steps)}" if steps else "")
        self.signal_workers(signal.SIGKILL, workers)
        raise ControllerDied(controller_died_message(pid, during, WORKER_STATE))

    def _check_health(self, results: dict[int, Any], output: WorkerOutput) -> None:
        self._check_controller()
        dead = self.dead_workers()
        if dead:
            survivors = self._let_survivors_finish(results, dead, output)
            raise _died(dead, self.pids, survivors, self.monitor)
        if self.reach is not None:
            self.reach.check(self.monitor, results)
        now = time.time()
        for health in self.monitor.health:
            silent = health.silent_for(now)
            if silent is not None and silent > HUNG_AFTER_S and not results[health.index].ready():
                state = _process_state(self.pids.get(health.index))
                raise WorkerHung(
                    f"worker {health.index} (pid {self.pids.get(health.index, '?')}, process "
                    f"{state}) has sent no heartbeat for {silent:.0f} s, so the run was "
                    "aborted. The workers must be restarted: run `%distribute restart`."
                )

    def _check_progress(self, results: dict[int, Any]) -> None:
        """A stalled run (``stall``): ask for the stacks, name the culprit, end the workers."""
        stall = self.monitor.stall
        running = sorted(w for w in self.monitor.running_workers() if not results[w].ready())
        stalled = stall.stalled_for() if running else None
        stopped = False
        if stalled is None:   # a local worker SIGSTOPped: no need to wait for the stall limit
            unready = sorted(w for w, ar in results.items() if not ar.ready())
            if unready and self._stopped_for(unready) > STOPPED_S:   # (first steps: a minute)
                stopped, running = True, unready
                stalled = self._stopped_for(unready)
        if stalled is None:
            return
        bound, median = stall.bound(), stall.median()
        stacks = self._ask_stacks(running)
        steps = {w: self.monitor.health[w].step for w in running}
        culprits, waiting = diagnose(stacks)
        if not culprits:
            stall.no_culprit()
            return
        message = stuck_message(stalled, bound, median, stacks, steps, culprits, waiting,
                                lambda w: _process_state(self.pids.get(w)), stopped)
        self.signal_workers(signal.SIGKILL, running)
        raise WorkerStuck(message, stacks_text(stacks))

    def _stopped_for(self, workers: list[int]) -> float:
        """Seconds the longest-stopped of ``workers`` on this machine has been stopped
        (SIGSTOP, a debugger), 0 if none is."""
        now, longest = time.monotonic(), 0.0
        for w in workers:
            pid = self.pids.get(w)
            if pid is not None and _process_state(pid).startswith("stopped"):
                longest = max(longest, now - self._stopped_since.setdefault(w, now))
            else:
                self._stopped_since.pop(w, None)
        return longest

    def _ask_stacks(self, workers: list[int]) -> dict[int, dict[str, Any] | None]:
        health = self.monitor.health
        for w in workers:
            health[w].stacks = None
        self.monitor.ask_stacks(workers)
        deadline = time.monotonic() + ANSWER_S
        while time.monotonic() < deadline and any(health[w].stacks is None for w in workers):
            time.sleep(POLL_S)
        return {w: health[w].stacks for w in workers}

    def _let_survivors_finish(self, results: dict[int, Any], dead: list[int],
                              output: WorkerOutput) -> dict[int, str]:
        deadline = time.monotonic() + SURVIVOR_GRACE_S
        others = {w: ar for w, ar in results.items() if w not in dead}
        while time.monotonic() < deadline and not all(ar.ready() for ar in others.values()):
            output.pump()
            time.sleep(POLL_S)
        output.pump(final=True, show=True)
        blocked = sorted(w for w, ar in others.items() if not ar.ready())
        if blocked:   # else they wait for the collective timeout (minutes)
            self.monitor.collect_unsent_rows(blocked)   # their last rows would die with them
            self.signal_workers(signal.SIGKILL, blocked)
        out = {}
        for w, ar in others.items():
            if w in blocked:
                out[w] = (f"was still blocked in its collective after {SURVIVOR_GRACE_S:g} s "
                          "and was ended")
                continue
            outcome = _outcome(ar)
            out[w] = ("finished" if outcome.ok
                      else f"stopped with {outcome.error['type']}")
        return out


class _FailFast:
    """True once some worker failed more than ``grace`` seconds ago (never if grace is None)."""

    def __init__(self, results: dict[int, Any], grace: float | None):
        self.results, self.grace = results, grace
        self.failed_at: float | None = None
        self.expired = False

    def __call__(self) -> bool:
        if self.grace is None:
            return False
        if self.failed_at is None:
            if any(ar.ready() and not _outcome(ar).ok for ar in self.results.values()):
                self.failed_at = time.monotonic()
            return False
        self.expired = time.monotonic() - self.failed_at > self.grace
        return self.expired


class _PeerFailed:
    """True once the workers still running after a peer's cell failed have been ended.

    A worker whose cell raised leaves its peers blocked in their next collective, which has
    no timeout (``backend.COLLECTIVE_TIMEOUT_S``). ``SURVIVOR_GRACE_S`` after the failure
    the kernel asks the others for their stacks: those inside TensorFlow (or not answering)
    are waiting for the failed one and are ended, after sending their last rows; those busy
    in the cell's own Python code are asked again after another grace."""

    def __init__(self, dispatcher: Dispatcher, results: dict[int, Any]):
        self.d, self.results = dispatcher, results
        self.failed_at: float | None = None
        self.ended: list[int] = []

    def __call__(self) -> bool:
        if self.failed_at is None:
            if any(ar.ready() and _outcome(ar).failed() for ar in self.results.values()):
                self.failed_at = time.monotonic()
            return False
        if time.monotonic() - self.failed_at < SURVIVOR_GRACE_S:
            return False
        running = sorted(w for w, ar in self.results.items() if not ar.ready())
        if not running:
            return False
        stacks = self.d._ask_stacks(running)
        blocked = [w for w in running if not _busy_in_own_code(stacks[w])]
        if not blocked:
            self.failed_at = time.monotonic()
            return False
        self.d.monitor.collect_unsent_rows(blocked)   # their last rows would die with them
        self.d.signal_workers(signal.SIGKILL, blocked)
        self.ended = blocked
        return True


def _busy_in_own_code(stacks: dict[str, Any] | None) -> bool:
    """A worker's main thread runs code of the cell's own (``stacks.snapshot``), not
    TensorFlow's, where a collective waits for the failed peer."""
    if stacks is None:
        return False
    main = [t for t in stacks["threads"] if t.get("main")]
    return bool(main) and not main[0].get("in_library", True)


class _Stopping:
    """A stop in progress: the step-boundary protocol first, then SIGINT, then give up."""

    def __init__(self, dispatcher: Dispatcher, interrupted: bool):
        self.d = dispatcher
        self.interrupted = interrupted
        self.started = time.monotonic()
        self.signalled = False
        workers = list(range(len(dispatcher.engine_ids)))
        if interrupted:
            print("nbdist: interrupted; stopping the workers at the same step boundary...",
                  file=sys.stderr)
        dispatcher.monitor.stopper.request(workers,
                                           "interrupted" if interrupted else "stopped")

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        running = self.d.monitor.running_workers()
        self.d.monitor.stopper.tick(running)
        if not self.signalled and self.interrupted and (
                (not running and elapsed > NO_RUN_SIGINT_S) or elapsed > ESCALATE_S):
            self.escalate()
        if elapsed > GIVE_UP_S:
            raise ClusterError(
                f"The workers did not stop within {GIVE_UP_S:.0f} s of the interrupt. They "
                "must be restarted: run `%distribute restart`."
            )

    def escalate(self) -> None:
        """Send SIGINT to every worker (raises KeyboardInterrupt in their Python code)."""
        if not self.signalled:
            self.signalled = True
            self.d.signal_workers(signal.SIGINT)


def _wait_a_little(results: dict[int, Any]) -> None:
    """Block until a pending result is ready, or POLL_S."""
    pending = [ar for ar in results.values() if not ar.ready()]
    if pending:
        pending[0].wait(POLL_S)


def _outcome(ar: Any) -> Outcome:
    """What the worker function answered, or an error outcome if ipyparallel itself failed."""
    try:
        value = ar.get(0)
    except Exception as err:
        cause = getattr(err, "ename", None)
        info = describe_exception(err)
        if cause:
            info.update(type=cause, message=getattr(err, "evalue", str(err)))
        return Outcome(ok=False, error=info)
    return Outcome.of(value)


def _process_state(pid: int | None) -> str:
    if pid is None:
        return "unknown"
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
    return "stopped (SIGSTOP?)" if status == psutil.STATUS_STOPPED else status


def _died(dead: list[int], pids: dict[int, int], survivors: dict[int, str],
          monitor: ClusterMonitor, before_cell: bool = False) -> WorkerDied:
    """The error for workers ``dead``, with their indexes, pids and the step they died at."""
    steps = [monitor.health[w].step for w in dead if monitor.health[w].step is not None]
    return WorkerDied(_died_message(dead, pids, survivors, monitor, before_cell),
                      {w: pids.get(w) for w in dead},
                      None if before_cell or not steps else max(steps))


def _died_message(dead: list[int], pids: dict[int, int], survivors: dict[int, str],
                  monitor: ClusterMonitor, before_cell: bool = False) -> str:
    """``before_cell``: found dead before the cell was sent to the workers (nothing ran)."""
    names = ", ".join(f"worker {w} (pid {pids.get(w, '?')})" for w in dead)
    steps = [monitor.health[w].step for w in dead if monitor.health[w].step is not None]
    at = f" after step {max(steps)}" if steps and not before_cell else ""
    if before_cell:
        at = " since the last cell, so this cell was not run" + (
            f" (its last run ended at step {max(steps)})" if steps else "")
    others = "; ".join(f"worker {w} {what}" for w, what in sorted(survivors.items()))
    return (
        f"{names} died{at}: its process is gone (killed, or out of memory). "
        + (f"The others: {others}. " if others else "")
        + "TensorFlow cannot continue a multi-worker job without it: run `%distribute "
        "restart` to start fresh workers (variables on the workers are lost)."
    )
