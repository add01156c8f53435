"""The kernel's view of its workers, fed by the telemetry channel.

``ClusterMonitor.handle`` receives every verified channel message (on the channel's reader
threads): heartbeats update each worker's health, metric rows go into the kernel's ``Run``
(``worker=i`` rows), and ``paused`` messages drive the stop protocol.

Stopping a synchronous multi-worker run must happen at the *same* step on every worker, or the
ones that go on wait forever in a collective. ``StopCoordinator``: the kernel broadcasts
``stop``; each worker finishes its current step, reports ``paused`` with its step count and
waits. When all running workers are paused at the same step, the kernel sends ``halt``; a
worker behind the others is sent ``resume_until`` the leading step; if some worker does not
pause (it is blocked in the next step's collective, waiting for the paused ones), the paused
ones are resumed for one more step. Workers in a sync run are at most one step apart, so this
ends within a step or two.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...data.fingerprint import same_input_groups, same_input_note
from ...telemetry.rows import POSITION, unpack
from ...telemetry.run import Run, RunWriter
from .. import protocol
from .arrivals import StepAligner
from .stall import StallWatch

#: A worker that sent nothing for this long while the cluster is busy is reported as hung.
HUNG_AFTER_S = 20.0
#: How long the coordinator waits for a worker to pause before resuming the paused ones.
PAUSE_GRACE_S = 0.5
#: How long a worker about to be killed gets to send the rows it has not sent yet.
UNSENT_ROWS_WAIT_S = 1.0


@dataclass
class WorkerHealth:
    index: int
    last_seen: float | None = None       # time.time() of the last message
    step: int | None = None              # steps done in the current run
    in_run: str | None = None            # key of the run the worker is in
    stacks: dict[str, Any] | None = None  # its last protocol.STACKS answer
    flushed: bool = False                # answered the last protocol.FLUSH_ROWS

    def silent_for(self, now: float | None = None) -> float | None:
        if self.last_seen is None:
            return None
        return (time.time() if now is None else now) - self.last_seen


_SEVERITY = ("done", "stopped", "interrupted", "failed")


@dataclass
class _RunEntry:
    run: Run
    rows_seen: int = 0
    ended: dict[int, str] = field(default_factory=dict)   # worker -> its run status
    aligner: StepAligner | None = None     # step runs of several workers (``arrivals``)
    digests: dict[int, str] = field(default_factory=dict)   # worker -> first batch's
    same_input: str | None = None          # the note when workers read the same data
    lock: threading.Lock = field(default_factory=threading.Lock)   # one reader per worker
    #: after an ``--elastic`` restart: the steps below this are in the Run already (the
    #: fresh workers train them again from the checkpoint); their rows are not kept twice
    skip_below: int = 0
    first_rows: tuple[float, int] | None = None   # (time.monotonic(), step) of the first rows

    def append(self, worker: int, block: Any, extras: dict[str, Any]) -> None:
        if self.first_rows is None:
            self.first_rows = (time.monotonic(), int(block[0, POSITION.step]))
        if self.skip_below:
            keep = block[:, POSITION.step] >= self.skip_below
            if not keep.all():
                block, extras = block[keep], {k: v[keep] for k, v in extras.items()}
            if not len(block):
                return
        if self.aligner is None:
            RunWriter(self.run).append_block(block, extras or None)
            return
        with self.lock:
            self._align(worker, block, extras)

    def _align(self, worker: int, block: Any, extras: dict[str, Any]) -> None:
        for ready, ready_extras in self.aligner.add(worker, block, extras):
            RunWriter(self.run).append_block(ready, ready_extras or None)

    def flush(self) -> None:
        """Rows still held by the aligner go to the Run; its straggler, if any, is noted."""
        if self.aligner is None:
            return
        with self.lock:
            for ready, ready_extras in self.aligner.flush():
                RunWriter(self.run).append_block(ready, ready_extras or None)
            for straggler in self.run.stragglers():
                self.run.note(straggler.note())

    def end(self, worker: int, status: str, workers: int) -> None:
        self.ended[worker] = status if status in _SEVERITY else "failed"
        if len(self.ended) == workers and self.run.status == "running":
            self.flush()
            RunWriter(self.run).finish(max(self.ended.values(), key=_SEVERITY.index))


class StopCoordinator:
    """Brings every worker of a sync run to a halt after the same step (see module doc)."""

    def __init__(self, send: Callable[[int, dict[str, Any]], bool]):
        self._send = send
        self._lock = threading.Lock()
        self.requested = False
        self.reason: str | None = None   # the Run status a stop ends in: interrupted/stopped
        self.paused: dict[int, int] = {}
        self._last_change = 0.0
        self.halted_at: int | None = None

    def request(self, workers: list[int], reason: str = "stopped") -> None:
        """Stop ``workers`` at a common step; their Runs end ``reason`` ("interrupted" for a
        kernel interrupt, "stopped" for the Stop button)."""
        with self._lock:
            self.requested, self.paused, self.halted_at = True, {}, None
            self.reason = reason
            self._last_change = time.monotonic()
        for w in workers:
            self._send(w, {"type": protocol.STOP})

    def reset(self) -> None:
        with self._lock:
            self.requested, self.paused, self.halted_at = False, {}, None
            self.reason = None

    def on_paused(self, worker: int, step: int) -> None:
        with self._lock:
            self.paused[worker] = step
            self._last_change = time.monotonic()

    def tick(self, running: set[int]) -> None:
        """Decide what paused workers do next; call often while a stop is under way."""
        with self._lock:
            if not self.requested or not self.paused:
                return
            top = max(self.paused.values())
            waiting = running - set(self.paused)
            if not waiting:
                behind = {w: s for w, s in self.paused.items() if s < top}
                if behind:
                    orders = {w: {"type": protocol.RESUME_UNTIL, "step": top} for w in behind}
                else:
                    orders = {w: {"type": protocol.HALT} for w in self.paused}
                    self.halted_at = top
            elif time.monotonic() - self._last_change > PAUSE_GRACE_S:
                orders = {w: {"type": protocol.RESUME_UNTIL, "step": top + 1} for w in self.paused}
            else:
                return
            for w in orders:
                del self.paused[w]
            self._last_change = time.monotonic()
        for w, message in orders.items():
            self._send(w, message)


class ClusterMonitor:
    """Health of each worker and the kernel-side Runs their metrics go to."""

    def __init__(self, workers: int, send: Callable[[int, dict[str, Any]], bool],
                 new_fit_run: Callable[[], Run]):
        self.health = [WorkerHealth(i) for i in range(workers)]
        self.send = send
        self.stopper = StopCoordinator(send)
        self._new_fit_run = new_fit_run
        self._runs: dict[str, _RunEntry] = {}
        self._lock = threading.Lock()
        self.bad_rows = 0
        self.stall = StallWatch()
        #: ``%distribute inject``: {"fault", "worker", "at_step", "delay", "applied_step"}
        self.injections: list[dict[str, Any]] = []
        #: ``cut_link(worker, entry)``: takes a link down when a worker reaches its partition
        self.cut_link: Callable[[int, dict[str, Any]], None] | None = None

    # -- runs ------------------------------------------------------------------------------
    def expect_run(self, key: str, run: Run, skip_below: int = 0) -> None:
        """Route rows tagged ``key`` to ``run`` (a step run the kernel created); rows of
        steps below ``skip_below`` are dropped (the Run has them from before a restart)."""
        with self._lock:
            self._runs[key] = _RunEntry(run, aligner=StepAligner(len(self.health))
                                        if len(self.health) > 1 else None,
                                        skip_below=skip_below)

    def first_rows(self, key: str) -> tuple[float, int] | None:
        """When the first rows of run ``key`` arrived (``time.monotonic()``) and their step."""
        entry = self._entry(key, create=False)
        return entry.first_rows if entry is not None else None

    def _entry(self, key: str, create: bool) -> _RunEntry | None:
        with self._lock:
            entry = self._runs.get(key)
            if entry is None and create:
                entry = self._runs[key] = _RunEntry(self._new_fit_run())
            return entry

    def runs_with_news(self) -> list[Run]:
        """Runs that received rows since the last call (for the observers, main thread)."""
        out = []
        with self._lock:
            entries = list(self._runs.values())
        for entry in entries:
            n = entry.run.n_rows
            if n != entry.rows_seen:
                entry.rows_seen = n
                out.append(entry.run)
        return out

    def runs(self) -> list[Run]:
        with self._lock:
            return [e.run for e in self._runs.values()]

    def flush_rows(self) -> None:
        """Every row held for alignment goes to its Run (a cell's call on the workers ended,
        whatever its outcome)."""
        with self._lock:
            entries = list(self._runs.values())
        for entry in entries:
            entry.flush()

    def forget_runs(self) -> None:
        with self._lock:
            self._runs.clear()

    def ask_stacks(self, workers: list[int]) -> None:
        for w in workers:
            self.send(w, {"type": protocol.DUMP_STACKS})

    def collect_unsent_rows(self, workers: list[int],
                            wait_s: float = UNSENT_ROWS_WAIT_S) -> list[int]:
        """Ask ``workers`` (about to be killed, blocked in a collective) for the rows they
        recorded but did not send yet; wait until each has answered, at most ``wait_s``.
        Returns the workers that did not answer (their last rows are lost)."""
        for w in workers:
            self.health[w].flushed = False
            self.send(w, {"type": protocol.FLUSH_ROWS})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(self.health[w].flushed for w in workers):
            time.sleep(0.01)
        return [w for w in workers if not self.health[w].flushed]

    def running_workers(self) -> set[int]:
        return {h.index for h in self.health if h.in_run is not None}

    # -- messages (channel reader threads) -------------------------------------------------
    def handle(self, worker: int, message: dict[str, Any]) -> None:
        if not 0 <= worker < len(self.health):
            return
        health = self.health[worker]
        health.last_seen = time.time()
        kind = message["type"]
        if kind == protocol.HEARTBEAT:
            step = message.get("step")
            health.step = step if isinstance(step, int) else health.step
        elif kind == protocol.RUN_START:
            key = str(message.get("run"))
            health.in_run, health.step = key, 0
            self.stall.started()
            entry = self._entry(key, create=message.get("mode") == "fit")
            total = message.get("total_steps")
            if entry is not None and isinstance(total, int) and entry.run.total_steps is None:
                RunWriter(entry.run).update(total_steps=total)
        elif kind == protocol.ROWS:
            self._record(worker, message)
        elif kind == protocol.RUN_END:
            health.in_run = None
            entry = self._entry(str(message.get("run")), create=False)
            if entry is not None:
                notes = message.get("notes")
                for note in notes if isinstance(notes, list) else []:
                    if isinstance(note, str):   # e.g. "resumed from epoch 2 of 3 in DIR"
                        entry.run.note(note[:1000])
                epochs = message.get("epochs") if worker == 0 else None   # the same on all
                for row in epochs if isinstance(epochs, list) else []:
                    if isinstance(row, dict) and all(isinstance(v, (int, float))
                                                     for v in row.values()):
                        numbers = {str(k): float(v) for k, v in row.items()}
                        RunWriter(entry.run).record_epoch(
                            int(numbers.pop("epoch", 0)), int(numbers.pop("step", 0)), numbers)
                status = str(message.get("status"))
                if status == "stopped" and self.stopper.reason:   # the kernel knows why
                    status = self.stopper.reason
                entry.end(worker, status, len(self.health))
        elif kind == protocol.PAUSED and isinstance(message.get("step"), int):
            self.stopper.on_paused(worker, message["step"])
        elif kind == protocol.STACKS and isinstance(message.get("threads"), list):
            health.stacks = message
        elif kind == protocol.INJECTED:
            self._injected(worker, message)
        elif kind == protocol.ROWS_FLUSHED:   # after its ROWS, on the same connection
            health.flushed = True
        elif kind == protocol.INPUT_DIGEST and isinstance(message.get("digest"), str):
            self._input_digest(worker, message)

    def _input_digest(self, worker: int, message: dict[str, Any]) -> None:
        """A worker's first-batch fingerprint; once every worker's is in, workers that read
        the same data are noted on the Run (``data.fingerprint``)."""
        entry = self._entry(str(message.get("run")), create=False)
        if entry is None:
            return
        with entry.lock:
            entry.digests[worker] = message["digest"][:64]
            if len(entry.digests) < len(self.health) or entry.same_input is not None:
                return
            groups = same_input_groups(entry.digests)
            if groups:
                entry.same_input = same_input_note(groups)
                entry.run.note(entry.same_input)

    def same_input(self, key: str) -> str | None:
        """The note saying which workers of run ``key`` read the same data, if they did."""
        entry = self._entry(key, create=False)
        return entry.same_input if entry is not None else None

    def _injected(self, worker: int, message: dict[str, Any]) -> None:
        for entry in self.injections:
            if (entry["worker"], entry["fault"]) == (worker, message.get("fault")) \
                    and entry.get("applied_step") is None:
                step = message.get("step")
                entry["applied_step"] = step if isinstance(step, int) else -1
                if isinstance(step, int) and step >= 0:   # -1: between runs
                    self.health[worker].step = step
                kind = protocol.FAULT_KINDS.get(entry["fault"])
                if kind is not None and kind.link == "down" and self.cut_link is not None:
                    try:
                        self.cut_link(worker, entry)
                    except Exception as err:   # shown by %distribute status
                        entry["error"] = str(err)
                return

    def _record(self, worker: int, message: dict[str, Any]) -> None:
        """A worker's rows (``rows.pack``) as its rows in the kernel's Run: all or none."""
        entry = self._entry(str(message.get("run")), create=False)
        if entry is None:
            self.bad_rows += 1
            return
        try:
            block, extras = unpack(message, worker=worker)
        except (TypeError, ValueError):
            self.bad_rows += 1
            return
        for name in ("total_steps", "epochs"):
            value = message.get(name)
            if isinstance(value, int) and value > 0 and getattr(entry.run, name) is None:
                RunWriter(entry.run).update(**{name: value})
        scale = message.get("loss_scale")   # read from the step each worker traced
        if isinstance(scale, int) and 1 <= scale <= entry.run.replicas * entry.run.workers:
            RunWriter(entry.run).update(loss_scale=scale)
        if len(block):
            entry.append(worker, block, extras)
            self.health[worker].step = int(block[-1, POSITION.step]) + 1
        for values in block[block[:, POSITION.replica] <= 0]:   # one per step: replica 0,
            self.stall.progressed(int(values[POSITION.step]),   # or -1 (a fit's reduced row)
                                  _seconds(values[POSITION.step_ms], values[POSITION.data_ms]))


def _seconds(step_ms: float, data_ms: float) -> float | None:
    total = sum(float(v) for v in (step_ms, data_ms) if v == v)   # NaN: not measured
    return total / 1e3 if total > 0 else None
