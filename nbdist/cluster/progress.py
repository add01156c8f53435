"""The stall rule shared by the worker families: a run has stalled when no worker has finished
a step for longer than ``max(STALL_FACTOR x the median step time of the last STALL_WINDOW
steps, STALL_FLOOR_S)``; until a step after the first (which traces and compiles) has
finished, the bound is ``FIRST_STEP_S``. Heartbeats cannot see this: a worker blocked in its
input pipeline or in a deadlock, or one that holds a step the others wait for, still answers.
What a family does on a stall (ask for stacks, name a culprit) is its own: ``multiworker.stall``,
``paramserver.stall``.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

STALL_FACTOR = 10.0
STALL_WINDOW = 20
STALL_FLOOR_S = 5.0
FIRST_STEP_S = 60.0


def rule_text(bound: float, median: float | None) -> str:
    """The rule as the error states it, with this run's numbers."""
    if median is None:
        return f"the limit before the first steps is {bound:.0f} s"
    return (f"the limit is max({STALL_FACTOR:g} x the median step time of the last "
            f"{STALL_WINDOW} steps ({median * 1e3:.0f} ms), {STALL_FLOOR_S:g} s) = {bound:.1f} s")


class StallWatch:
    """Progress of the running cell: when a step last finished, the recent step times."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._times: deque[float] = deque(maxlen=STALL_WINDOW)
        self.last_progress = time.monotonic()
        self._extra = 1.0   # doubles after each stall with no culprit

    def started(self) -> None:
        """A worker started a run."""
        with self._lock:
            self.last_progress = time.monotonic()
            self._times.clear()
            self._extra = 1.0

    def progressed(self, step: int, seconds: float | None) -> None:
        """A worker finished ``step`` in ``seconds`` (input included; None if unknown)."""
        with self._lock:
            self.last_progress = time.monotonic()
            if step > 0 and seconds is not None and seconds >= 0:   # step 0 traces
                self._times.append(seconds)

    def bound(self) -> float:
        with self._lock:
            if not self._times:
                return FIRST_STEP_S * self._extra
            return max(STALL_FACTOR * statistics.median(self._times), STALL_FLOOR_S) * self._extra

    def median(self) -> float | None:
        with self._lock:
            return statistics.median(self._times) if self._times else None

    def silent_for(self) -> float:
        """Seconds since a worker last finished a step (or the run started)."""
        return time.monotonic() - self.last_progress

    def stalled_for(self) -> float | None:
        """Seconds since the last step if that exceeds the bound, else None."""
        silent = time.monotonic() - self.last_progress
        return silent if silent > self.bound() else None

    def no_culprit(self) -> None:
        """A stall whose stacks showed nobody to blame: wait twice as long next time."""
        with self._lock:
            self._extra *= 2
            self.last_progress = time.monotonic()
