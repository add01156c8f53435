"""The status bar's verdict on the live run: the bottleneck ``Run.explain()`` names and its
first advice, computed now and then while a step-mode run trains and once more when it ends.

Explaining reads every row of the run (pandas, on the kernel's main thread between steps),
at a cost that grows slowly with the rows. So a live explanation waits at least
``min_interval`` seconds after the last, and happens only while all of them together stay
within ``budget`` of the time the run has trained: the first after ``first_cost / budget``
seconds (the kernel's last explanation's cost, once there was one, over the budget), the
next ones further apart the more they cost. When the run ends, one explanation of all its
steps leaves the status bar with what ``%distribute explain`` says (after training: it costs
the cell that time, not its steps; it times the run's input pipeline alone, about a second,
once per run: ``nbdist.step.inputrate``); it stays until the next run, or until the strategy
changes (the verdict was about the old one), so a user who looks once the cell is done
still sees why it was slow.

A run that cannot be explained yet (``ConfigError``: too few steps, none timed) shows no
verdict. Nor does one that explaining fails on: that is reported (``DisplayGuard``: a warning
the first time) and not tried again for that run; training and the dashboard go on, and
``%distribute explain`` shows the error to whoever asks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..displayguard import DisplayGuard
from ..errors import ConfigError
from ..telemetry.run import Run, RunObserver
from .state import Verdict

__all__ = ["LiveVerdict", "verdict_of"]

_log = logging.getLogger(__name__)


def verdict_of(run: Run) -> Verdict | None:
    """The verdict the status bar shows for ``run``: its bottleneck and its first advice
    without the numbers behind it; None if it cannot be explained yet."""
    try:
        explained = run.explain()
    except ConfigError:
        return None
    advice = explained.advice[0] if explained.advice else None
    return Verdict(
        run=run.id,
        step=run.steps_done,
        bottleneck=explained.bottleneck,
        advice=None if advice is None
        else f"{advice.text} (expected +{advice.gain:.0%} {advice.unit})",
    )


class LiveVerdict(RunObserver):
    """Follows the step-mode runs of a kernel and keeps ``verdict`` (None: nothing to show);
    calls ``changed()`` when it changes. ``enabled``: False where nobody sees a status bar (a
    terminal), where it costs nothing."""

    budget: float = 0.005       # explanations may take at most this share of the run's time
    min_interval: float = 5.0   # seconds between two explanations, at least
    first_cost: float = 0.1     # what the kernel's first explanation is assumed to cost (s)

    def __init__(self, changed: Callable[[], None], *, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.verdict: Verdict | None = None
        self.enabled = enabled
        self.explanations = 0       # how many were made (live and final)
        self.seconds = 0.0          # ... and the time they took, in total
        self._changed = changed
        self._clock = clock
        self._run: int | None = None    # id of the run followed
        self._started = 0.0
        self._spent = 0.0               # on explaining the run followed (s)
        self._cost: float | None = None  # of the last explanation (s), whichever run
        self._next = 0.0
        self._broken = False
        self._display = DisplayGuard(_log)

    def on_step(self, run: Run) -> None:
        if not self.enabled or run.mode != "step":
            return
        now = self._clock()
        if run.id != self._run:
            self._follow(run, now)
        elif not self._broken and now >= self._next:
            cost = self.first_cost if self._cost is None else self._cost
            if self._spent + cost <= self.budget * (now - self._started):
                self._explain(run)

    def finish(self, run: Run) -> None:
        """``run`` (the one followed) ended: explain all of its steps."""
        if self.enabled and run.id == self._run and not self._broken:
            live_cost = self._cost
            self._explain(run)
            # this one also timed the run's input pipeline (about a second), which explaining
            # a run that trains never does: the next run's live explanations are paced as before
            self._cost = live_cost

    def clear(self) -> None:
        """The strategy changed: the last verdict was about another one."""
        self._run = None
        self._set(None)

    def _follow(self, run: Run, now: float) -> None:
        self._run, self._started, self._spent = run.id, now, 0.0
        self._next, self._broken = now, False
        self._set(None)

    def _explain(self, run: Run) -> None:
        start = self._clock()
        try:
            verdict = verdict_of(run)
        except Exception as exc:   # a bug in explaining: the status bar shows no verdict
            self._display.report("explain", exc, (
                f"nbdist: explaining Run {run.id} for the status bar failed ({{error}}), a bug "
                "in nbdist; the status bar shows no verdict for it, training goes on and "
                f"`%distribute explain {run.id}` shows the error."))
            verdict, self._broken = None, True
        end = self._clock()
        self._cost = end - start
        self._spent += self._cost
        self._next = end + self.min_interval
        self.explanations += 1
        self.seconds += self._cost
        self._set(verdict)

    def _set(self, verdict: Verdict | None) -> None:
        if verdict != self.verdict:
            self.verdict = verdict
            self._changed()
