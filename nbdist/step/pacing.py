"""Which steps run the timed variant of a compiled step (``--timing-every``)."""

from __future__ import annotations

import math
from collections.abc import Callable


class TimingPacer:
    """Decides which steps run the timed variant.

    ``every=K`` times exactly every K-th step (0: never). ``every=None`` (the default) is
    automatic: the timed step is slower (its timestamps serialise the step; on a tiny MLP here
    ~1.9 ms more than a 2.3 ms untimed step), so timed steps are spaced so that their extra
    cost stays under ``budget`` of the run's time: at least every 5th step apart, and at most
    every 100th step or every ``max_gap_ms`` of training, whichever is more steps (on a step
    of a millisecond, sampling every 100th step would spend several percent on timing).
    """

    budget = 0.01
    min_gap = 5
    max_gap = 100         # still sample the allreduce at least this often (in steps)...
    max_gap_ms = 500.0    # ...or this often in time, for steps too quick for the budget

    def __init__(self, every: int | None, agree: Callable[[int], int] | None = None):
        self.auto = every is None
        self.agree = agree   # several workers: one gap for all (step.groups.agreement)
        self.every = self.min_gap if every is None else every
        self.next = 0
        self.plain_ms: float | None = None
        self.timed_ms: float | None = None

    def due(self, step: int) -> bool:
        return self.every > 0 and step >= self.next

    def observe(self, step: int, step_ms: float, timed: bool) -> None:
        if timed:
            self.timed_ms = _ema(self.timed_ms, step_ms)
        else:
            self.plain_ms = _ema(self.plain_ms, step_ms)
        if not timed or self.every <= 0:
            return
        gap = self.every
        if self.auto and self.plain_ms and self.timed_ms:
            extra = max(0.0, self.timed_ms - self.plain_ms)
            longest = max(self.max_gap, math.ceil(self.max_gap_ms / self.plain_ms))
            gap = max(gap, min(longest, math.ceil(extra / (self.budget * self.plain_ms))))
            if self.agree is not None:
                gap = self.agree(gap)
        self.next = step + gap


def _ema(previous: float | None, value: float, weight: float = 0.2) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value
