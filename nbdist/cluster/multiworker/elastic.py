"""``--elastic N``: the deaths one step cell may recover from, and what it says about them.

``MultiWorkerCluster.run_step_cell`` keeps training through a worker's death: it stops what
is left, starts fresh workers (same count), replays the journal on them (``journal``), and
calls the cell again, which restores the last checkpoint the cell saved. ``Restarts`` decides
whether a death may be recovered from (at most N restarts a cell; the same worker dying again
at the same step is not a chance event, so the cell ends there) and words the causes when the
cell ends.
"""

from __future__ import annotations

from typing import Any

from ...errors import NbdistError
from ...telemetry.run import Restart
from ...words import count
from ..failures import WorkerDied


class ElasticGaveUp(NbdistError):
    """A step cell with ``--elastic`` ended: more deaths than its restarts, a worker dying
    again at the same step, or fresh workers that could not be started or rebuilt."""


class Restarts:
    """The deaths of one elastic cell, in order."""

    def __init__(self, limit: int):
        self.limit = limit
        self.records: list[Restart] = []   # the cell Run's ``restarts``
        self.deaths: list[tuple[str, tuple[int, ...], int | None]] = []   # (what, who, step)

    @property
    def used(self) -> int:
        """Restarts made so far (every death but the one that ended the cell)."""
        return len(self.deaths)

    def check(self, died: WorkerDied, what: str) -> None:
        """Record a death; raise ``ElasticGaveUp`` when the cell may not restart again."""
        who, step = tuple(sorted(died.workers)), died.step
        again = [d for d in self.deaths if step is not None and (d[1], d[2]) == (who, step)]
        self.deaths.append((what, who, step))
        if again:
            raise ElasticGaveUp(
                f"{what} died again at the same step ({step}) after the workers were restarted "
                "from the checkpoint, so the cell ended instead of restarting again: the same "
                "worker failing at the same point is a cause to fix, not bad luck (out of "
                "memory on that step's batch, a bad input, a fault on that host). The deaths: "
                f"{self.causes()}. The steps trained so far are in nbdist.runs[-1]; "
                "the checkpoint stays for the next run of the cell.")
        if len(self.deaths) > self.limit:
            raise ElasticGaveUp(
                f"{what} died after the cell had restarted its workers "
                f"{count(self.limit, 'time')}, the most --elastic {self.limit} allows, so the "
                f"cell ended. The deaths: {self.causes()}. The steps trained so far are in "
                "nbdist.runs[-1]; the checkpoint stays: run `%distribute restart`, then the "
                "cells that build the model, and this cell again to resume from it (or give "
                "--elastic a larger N).")

    def causes(self) -> str:
        return "; ".join(f"{i}. {what}" + (f" after step {step}" if step is not None else "")
                         for i, (what, _, step) in enumerate(self.deaths, 1))

    def failed_recovery(self, what: str, err: BaseException) -> ElasticGaveUp:
        """Fresh workers could not be started, or the journal not replayed on them."""
        return ElasticGaveUp(
            f"{what} died and nbdist restarted the workers (--elastic), but then "
            f"{type(err).__name__}: {err} The deaths: {self.causes()}. The steps trained so "
            "far are in nbdist.runs[-1]; the checkpoint stays for the next run of the cell.")


def died_what(died: WorkerDied, info: list[dict[str, Any]]) -> tuple[str, str]:
    """("worker 1 (pid 4242)", its host) for the workers of ``died``."""
    names = ", ".join(f"worker {w} (pid {pid if pid is not None else '?'})"
                      for w, pid in sorted(died.workers.items()))
    hosts = sorted({str(info[w].get("host", "?")) for w in died.workers if w < len(info)})
    return names or "a worker", ", ".join(hosts) or "?"


def restarting_line(what: str, step: int | None, used: int, limit: int) -> str:
    at = f" after step {step}" if step is not None else ""
    return (f"nbdist: {what} died{at}; --elastic: restart {used} of {limit}, fresh workers "
            "start, the cells and pushes that built the workers' state run again on them, and "
            "the cell resumes from its last checkpoint.")


def restored_line(number: int, restart: Restart) -> str:
    return f"nbdist: restart {number}: {restart.describe()}."


def restart_note(number: int, restart: Restart) -> str:
    return f"restart {number} (--elastic): {restart.describe()}"
