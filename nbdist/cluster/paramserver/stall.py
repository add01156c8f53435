"""A parameter-server worker stopped or stuck: named, and its run failed, never done.

ClusterCoordinator hands each step to a free worker and waits for it without a time limit. A
worker stopped (SIGSTOP, a debugger, a frozen host) or stuck inside TensorFlow holds the step
it was given: the others run the rest of the window of scheduled steps, then the run waits for
ever (and reading the stopped worker's rows would wait too). ``PSStall`` is asked at each of
the loop's health checks:

- a worker whose process on this machine is stopped (state T) for ``STOPPED_S`` is named at
  once, before any stall limit;
- otherwise the stall rule the worker families share (``cluster.progress``): when no step has
  been recorded for longer than the limit, the culprits are the live workers that recorded no
  step for that long while the others did. With none (every worker is slow: a long first
  trace), nothing is done and the limit doubles.

The message names the worker, its pid, its steps, the cause and what to do. The stopped
process is left as it is (a debugger may hold it); ``%distribute restart`` resumes it
(SIGCONT) so that TensorFlow can detach from it, then ends every process of the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..progress import StallWatch, rule_text

#: A worker process stopped this long is named at once, first step or not.
STOPPED_S = 1.0


class PSStall:
    """The steps each worker recorded in one run, and the stall rule over them.
    ``state(worker)`` is its process' state ("stopped", "running", ... or "unknown")."""

    def __init__(self, workers: int, state: Callable[[int], str]):
        self.workers, self.state = workers, state
        self.watch = StallWatch()
        self.watch.started()
        self.started = time.monotonic()
        self.last_row: dict[int, float] = {}   # worker -> when its last step was recorded
        self.steps: dict[int, int] = {}        # worker -> its steps recorded in this run
        self._stopped_since: dict[int, float] = {}

    def recorded(self, worker: int, step: int, seconds: float | None) -> None:
        self.last_row[worker] = time.monotonic()
        self.steps[worker] = self.steps.get(worker, 0) + 1
        self.watch.progressed(step, seconds)

    def stopped(self, dead: set[int]) -> list[int]:
        """Live workers whose process has been stopped for over ``STOPPED_S``."""
        now, out = time.monotonic(), []
        for w in range(self.workers):
            if w not in dead and self.state(w) == "stopped":
                if now - self._stopped_since.setdefault(w, now) > STOPPED_S:
                    out.append(w)
            else:
                self._stopped_since.pop(w, None)
        return out

    def culprits(self, dead: set[int]) -> tuple[list[int], str] | None:
        """(workers to blame, the cause) once the run stopped or stalled, else None."""
        stopped = self.stopped(dead)
        if stopped:
            return stopped, "stopped"
        silent = self.watch.stalled_for()
        if silent is None:
            return None
        bound, now = self.watch.bound(), time.monotonic()
        stuck = [w for w in range(self.workers) if w not in dead
                 and now - self.last_row.get(w, self.started) > bound]
        if not stuck or len(stuck) == self.workers - len(dead) and self.last_row:
            self.watch.no_culprit()   # every worker slow alike: nobody to blame
            return None
        return stuck, "stuck"

    def message(self, culprits: list[int], cause: str, describe: Callable[[int], str],
                steps_done: int) -> str:
        """The error: who, its steps, why, what the others did, what to do."""
        parts = []
        for w in culprits:
            mine = self.steps.get(w, 0)
            at = (f"after its step {mine} (the run's step {steps_done})" if mine
                  else f"before its first step (the run's step {steps_done})")
            if cause == "stopped":
                parts.append(f"{describe(w)} is stopped (SIGSTOP / state T) {at}: a debugger "
                             "holds it, or its host froze.")
            else:
                bound, median = self.watch.bound(), self.watch.median()
                parts.append(f"{describe(w)} is stuck {at}: it is running (state "
                             f"{self.state(w)}) but recorded no step for "
                             f"{time.monotonic() - self.last_row.get(w, self.started):.1f} s "
                             f"while the others did ({rule_text(bound, median)}).")
        others = [w for w in range(self.workers) if w not in culprits]
        if others:
            each = ", ".join(f"worker {w} ({self.steps.get(w, 0)} steps)" for w in others)
            parts.append(f"The others ran on: {each}.")
        parts.append(
            "TensorFlow's ClusterCoordinator waits for the step it holds without a time "
            "limit, so nbdist stopped scheduling and failed the run (its steps are kept in "
            "nbdist.runs[-1]). Run `%distribute restart` (it resumes a stopped process so "
            "that TensorFlow can let go of it, then starts fresh ones), create the model and "
            "optimizer again and re-run the cell (with --checkpoint DIR it resumes).")
        return " ".join(parts)
