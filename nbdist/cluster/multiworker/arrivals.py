"""Waiting for a slower worker, told apart from reading input; the worker waited for, named.

Under MultiWorkerMirroredStrategy a worker that reaches a step late holds the others: in the
distributed iterator's own collective (``next(iterator)``, so their ``data_ms`` grows) or in
the step's all-reduce. Each worker measures only itself, so without the others' rows the
waiter looks input-bound and the late worker looks healthy. The kernel has every worker's
rows; ``StepAligner`` holds each worker's rows of a step run until every worker's rows of the
same steps are in, then, per step and worker:

- its arrival: when it started fetching the step's batch, ``wall_time - (step_ms + data_ms)``;
- the time it waited for the last one to arrive: at most how much earlier it arrived
  (``max(arrival) - arrival``) and at most how much longer its fetch took than the shortest
  (``data_ms - min(data_ms)``: everyone leaves the iterator's collective together, so the
  last to arrive fetched for the shortest time). Taking the smaller of the two keeps a clock
  offset between hosts, or an input slower on one worker, from being counted as waiting.

That time moves from the waiter's ``data_ms`` to its ``wait_ms``, where ``Run.stragglers()``
finds the worker the others waited for (``telemetry.stragglers``), though its delay happened
outside its measured step and fetch (its own code between steps, a slow or overloaded host, an
injected delay).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ...telemetry.rows import POSITION

#: Rows held longer than this (a worker's rows are late or will never come) go on unaligned.
HOLD_S = 2.0


class StepAligner:
    """Holds the rows of a step run's ``workers`` until every worker's rows of a step are in;
    ``add`` returns what can go to the Run, adjusted (see the module docstring)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._held: dict[int, list[tuple[float, np.ndarray, dict[str, np.ndarray]]]] = {
            w: [] for w in range(workers)}
        self._last_step = dict.fromkeys(range(workers), -1)

    def add(self, worker: int, block: np.ndarray, extras: dict[str, np.ndarray]
            ) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        if len(block):
            self._held[worker].append((time.monotonic(), block, extras))
            self._last_step[worker] = max(self._last_step[worker],
                                          int(block[:, POSITION.step].max()))
        return self._release()

    def flush(self) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Everything still held (the run ended, or a worker's rows will never come)."""
        ready = [(b, e) for chunks in self._held.values() for _, b, e in chunks]
        for chunks in self._held.values():
            chunks.clear()
        return ready

    def _release(self) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        common = min(self._last_step.values())
        out: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
        if common >= 0:
            ready, kept = _split(self._held, common)
            self._held = kept
            if ready:
                out.append(self._aligned(ready))
        old = time.monotonic() - HOLD_S
        for chunks in self._held.values():
            while chunks and chunks[0][0] < old:
                _, block, extras = chunks.pop(0)
                out.append((block, extras))
        return out

    def _aligned(self, chunks: list[tuple[np.ndarray, dict[str, np.ndarray]]]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        block = np.concatenate([b for b, _ in chunks])
        names = sorted({name for _, e in chunks for name in e})
        extras = {name: np.concatenate([e.get(name, np.full(len(b), np.nan))
                                        for b, e in chunks]) for name in names}
        steps = block[:, POSITION.step]
        for step in np.unique(steps):
            rows = np.flatnonzero(steps == step)
            self._align_step(block, rows)
        return block, extras

    def _align_step(self, block: np.ndarray, rows: np.ndarray) -> None:
        workers = block[rows, POSITION.worker].astype(int)
        if len(set(workers.tolist())) < self.workers:
            return
        data = block[rows, POSITION.data_ms]
        spent = block[rows, POSITION.step_ms] + data
        arrival = block[rows, POSITION.wall_time] - spent / 1e3
        if not (np.isfinite(data).all() and np.isfinite(arrival).all()):
            return
        waited = np.clip(np.minimum(data - data.min(), (arrival.max() - arrival) * 1e3),
                         0.0, data)
        if not waited.any():
            return
        block[rows, POSITION.data_ms] = data - waited
        wait = block[rows, POSITION.wait_ms]
        block[rows, POSITION.wait_ms] = np.where(np.isnan(wait), 0.0, wait) + waited


def _split(held: dict[int, list[tuple[float, np.ndarray, dict[str, np.ndarray]]]],
           upto: int) -> tuple[list[tuple[np.ndarray, dict[str, np.ndarray]]],
                               dict[int, list[tuple[float, np.ndarray, dict[str, Any]]]]]:
    """The rows of steps <= ``upto`` (every worker has them) and what stays held."""
    ready: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    kept: dict[int, list[tuple[float, np.ndarray, dict[str, Any]]]] = {}
    for w, chunks in held.items():
        kept[w] = []
        for when, block, extras in chunks:
            mask = block[:, POSITION.step] <= upto
            if mask.all():
                ready.append((block, extras))
            elif not mask.any():
                kept[w].append((when, block, extras))
            else:
                ready.append((block[mask], {k: v[mask] for k, v in extras.items()}))
                kept[w].append((when, block[~mask], {k: v[~mask] for k, v in extras.items()}))
    return ready, kept
