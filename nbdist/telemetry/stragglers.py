"""Stragglers: the replica or worker the others wait for.

In a synchronous step every replica waits for the last one to arrive: before the gradient
all-reduce (a row's ``wait_ms``, ``telemetry.rows``; under multiworker also the time moved
there from the input iterator's collective) and, where workers are separate processes, inside
the all-reduce, which each starts at its own arrival and all leave together: a worker's
``allreduce_ms`` (on a timed step) or ``step_ms`` (on any step) beyond the shortest at that
step is time it waited for the one that arrived last. The one that waits least at a
step is the one the others waited for. A straggler is the same one, waited for long enough to
matter, at most of the steps: ``last_to_arrive`` is that rule, on a matrix of waits.
``Run.stragglers()`` applies it to the run's recent steps (``StragglerWatch``: for the
dashboard, the lab's status bar and the run's notes); ``Run.explain()`` applies it to the
waits it derives from the timed steps, takes the run's own finding where those are too few to
judge, then says why that one is late.

Being slow at one's own compute is not enough: a replica whose compute takes longer but that
the others do not wait for (they have input or work of their own meanwhile) holds nobody up;
a worker delayed outside its measured step (its own code between steps, a busy host) is a
straggler though its compute looks healthy.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .rows import POSITION

#: Waited for at this share of the steps ...
SHARE = 0.6
#: ... while the others waited at least this share of the step ...
WAIT = 0.25
#: ... and at least this long (less is scheduling noise).
MIN_MS = 2.0
#: The rule needs this many steps every replica (worker) timed.
MIN_STEPS = 5
#: ``Run.stragglers()`` judges the latest this many timed steps.
RECENT_STEPS = 20


@dataclass(frozen=True)
class Straggler:
    label: str          # "replica 2", "worker 0"
    index: int          # its replica (worker) index
    share: float        # of the steps judged, those the others waited for it
    waited_ms: float    # median ms the others waited for it at those steps

    def note(self) -> str:
        """What the run's notes, the dashboard and the status bar's tooltip say of it."""
        others = "workers" if self.label.startswith("worker") else "replicas"
        return (f"straggler: {self.label}; the other {others} waited a median "
                f"{self.waited_ms:.3g} ms for it at {self.share:.0%} of the recent timed steps")


def enough_ms(step_ms: float) -> float:
    """How long the others must wait at a step of ``step_ms`` for it to count."""
    return max(WAIT * step_ms, MIN_MS) if np.isfinite(step_ms) else MIN_MS


def last_to_arrive(waits: np.ndarray, enough: float) -> tuple[int, float, float] | None:
    """The straggler among ``waits`` (a row per step, a column per replica or worker: the ms
    each waited for the others at that step, every one timed): the column that waited least
    while every other waited at least ``enough`` longer, at ``SHARE`` of the steps or more.
    (its column, that share, the median ms the others waited for it then), or None."""
    if waits.ndim != 2 or len(waits) < MIN_STEPS or waits.shape[1] < 2:
        return None
    ordered = np.sort(waits, axis=1)
    held = ordered[:, 1] - ordered[:, 0] >= enough
    if not held.any():
        return None
    late = np.argmin(waits, axis=1)
    counts = np.bincount(late[held], minlength=waits.shape[1])
    index = int(np.argmax(counts))
    share = float(counts[index] / len(waits))
    if share < SHARE:
        return None
    mine = held & (late == index)
    others = np.delete(waits[mine], index, axis=1) - waits[mine][:, [index]]
    return index, share, float(np.median(others.mean(axis=1)))


class StragglerWatch:
    """A run's recent timed steps, read from its rows as they come (each call reads only the
    rows appended since the last); ``stragglers`` applies the rule to them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen = 0
        # step -> rank -> (wait_ms, allreduce_ms, step_ms): the rows of steps not every rank
        # has sent yet
        self._pending: dict[int, dict[int, tuple[float, float, float]]] = {}
        # (each rank's wait, the step's ms) of recent steps: timed ones, and all of them
        self._timed: deque[tuple[np.ndarray, float]] = deque(maxlen=RECENT_STEPS)
        self._steps: deque[tuple[np.ndarray, float]] = deque(maxlen=RECENT_STEPS)

    def stragglers(self, read: Callable[[int], np.ndarray], by: str,
                   ranks: int) -> list[Straggler]:
        """``read(start)``: the run's rows since row ``start``; ``by``: "replica" or "worker",
        ``ranks`` of them."""
        with self._lock:
            block = read(self._seen)
            self._seen += len(block)
            self._take(block, by, ranks)
            # a timed step shows every wait; an untimed one only a worker late between steps
            steps = self._timed if len(self._timed) >= MIN_STEPS else self._steps
            if len(steps) < MIN_STEPS:
                return []
            waits = np.array([w for w, _ in steps])
            step_ms = float(np.median([s for _, s in steps]))
        found = last_to_arrive(waits, enough_ms(step_ms))
        if found is None:
            return []
        index, share, waited = found
        return [Straggler(f"{by} {index}", index, share, waited)]

    def _complete(self, rows: dict[int, tuple[float, float, float]], by: str,
                  ranks: int) -> None:
        """A step every rank sent: what each waited, if anything says so (an untimed step of
        replicas in one process has no wait_ms, and one step time for all of them)."""
        wait, allreduce, step_ms = np.array([rows[r] for r in range(ranks)]).T
        # timed: the in-graph times were measured (an untimed step's wait_ms may hold the wait
        # the kernel moved there from the input iterator's collective: ``arrivals``)
        timed = bool(np.isfinite(allreduce if by == "worker" else wait).all())
        if by == "worker":   # the all-reduce's wait is in the step's time too: counted once
            inside = allreduce - allreduce.min() if np.isfinite(allreduce).all() else 0.0
            wait = np.nan_to_num(wait) + np.maximum(inside, step_ms - step_ms.min())
        elif not np.isfinite(wait).all():
            return
        self._steps.append((wait, float(step_ms.mean())))
        if timed:
            self._timed.append((wait, float(step_ms.mean())))

    def _take(self, block: np.ndarray, by: str, ranks: int) -> None:
        column = POSITION.worker if by == "worker" else POSITION.replica
        for row in block[np.isfinite(block[:, POSITION.step_ms])]:
            rank = int(row[column])
            if not 0 <= rank < ranks:
                continue
            step = self._pending.setdefault(int(row[POSITION.step]), {})
            times = (float(row[POSITION.wait_ms]), float(row[POSITION.allreduce_ms]),
                     float(row[POSITION.step_ms]))
            if rank in step:    # a worker's replicas: it waited as long as the least of them
                times = tuple(np.fmin(times, step[rank]).tolist())
            step[rank] = times
        for number in sorted(self._pending):
            if len(self._pending[number]) == ranks:
                self._complete(self._pending.pop(number), by, ranks)
        if len(self._pending) > 4 * RECENT_STEPS:   # steps some rank never timed
            for number in sorted(self._pending)[:-RECENT_STEPS]:
                del self._pending[number]
