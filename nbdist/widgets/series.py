"""What the dashboard plots, computed from a Run's rows: numpy only (no plotly, no widgets).

``RunSeries`` ingests ``Run.rows_since`` batches and keeps, per (worker, replica) and per
metric, a bounded ``Decimator`` (at most ``max_points`` bucket means, whatever the run
length: the full-resolution data stays in the Run). It also keeps the per-step global lines,
the bus bandwidth and the step rate (stragglers are the Run's own: ``Run.stragglers``).
``allreduce_ms`` is the gradient all-reduce; the step's other collectives (SyncBatchNormalization's
batch statistics...) have their own global line, ``other_collective_ms``, once a row has some.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from ..telemetry.rows import POSITION as COL
from ..telemetry.rows import Row
from .aggregate import AGGREGATE_ABOVE, StepAggregates
from .decimator import Decimator

#: Per-key metrics. ``time`` is ``compute_ms`` for per-replica rows, ``step_ms`` for rows
#: reduced over the replicas (Keras fit).
KEY_METRICS = ("loss", "grad_norm", "allreduce_ms", "time")
#: Per-step global lines (the two times: the slowest replica's).
GLOBAL_METRICS = ("loss", "step_ms", "allreduce_ms", "other_collective_ms")

#: A fit's extras that are no compiled metric (``keras_reported_loss``: Keras' number where the
#: loss column is empty, see ``fitrecord.CENTRAL_STORAGE_LOSS_NOTE``).
NOT_METRICS = frozenset(("batch_loss", "keras_reported_loss"))

#: The columns of ``RunSeries._pending``: a step's sums, counts and maxima so far.
_PENDING = ("step", "loss_sum", "loss_n", "step_ms_sum", "step_ms_n", "allreduce_max",
            "other_max", "rows")

Key = tuple[int, int]          # (worker, replica); replica -1: reduced over the worker's replicas


def _key_codes(data: np.ndarray) -> tuple[np.ndarray, list[Key]]:
    """(each row's index into the keys, the (worker, replica) keys present, sorted): counted
    with ``bincount`` over a dense code, not sorted, as a long run's final figure reads
    millions of rows at once."""
    worker = data[:, COL.worker].astype(np.int64)
    replica = data[:, COL.replica].astype(np.int64) + 1          # -1 (reduced) -> 0
    width = int(replica.max()) + 1
    dense = worker * width + replica
    present = np.flatnonzero(np.bincount(dense))
    index = np.full(present[-1] + 1, -1, dtype=np.int64)
    index[present] = np.arange(len(present))
    return index[dense], [(int(c // width), int(c % width) - 1) for c in present]


def _group(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(steps, return_inverse=True)`` for whole step numbers, with ``bincount``
    over the span of steps instead of a sort."""
    first = int(steps.min())
    offset = steps.astype(np.int64) - first
    present = np.flatnonzero(np.bincount(offset))
    index = np.empty(present[-1] + 1, dtype=np.int64)
    index[present] = np.arange(len(present))
    return (present + first).astype(np.float64), index[offset]


def bus_bandwidth(nbytes: float, ranks: int, seconds: float) -> float:
    """Allreduce bus bandwidth in bytes/s, the nccl-tests convention: bytes*2(N-1)/N / time.

    ``nbytes`` is what each rank contributes; ``ranks`` the number of participants. NaN when
    it cannot be computed (no time, one rank, unknown size).
    """
    if not (nbytes and ranks > 1 and seconds > 0 and math.isfinite(seconds)):
        return math.nan
    return nbytes * 2 * (ranks - 1) / ranks / seconds


class RunSeries:
    """Everything the dashboard draws about one Run, updated incrementally."""

    def __init__(self, *, replicas: int, workers: int = 1, max_points: int = 2000,
                 bandwidth_window: int = 20, loss_scale: int = 1,
                 aggregate: bool | None = None):
        self.replicas, self.workers, self.max_points = replicas, workers, max_points
        self.loss_scale = loss_scale    # global loss = mean of the rows x this (Run.loss_scale)
        self.keys: list[Key] = []
        self.series: dict[tuple[str, Key | None], Decimator] = {}
        self._known: set[Key] = set()
        self._pending = np.empty((0, len(_PENDING)))   # steps not complete, see _accumulate
        self._expected = 0                             # rows per complete step
        self._allreduce = deque(maxlen=bandwidth_window)
        self._other = deque(maxlen=bandwidth_window)
        self.other_collectives = False                 # a row had other_collective_ms > 0
        self._rate = deque(maxlen=64)                  # (wall_time, step) samples
        self.rows = 0
        self.last_step = -1
        self.last_epoch = 0
        self.per_replica = True                        # False for replica -1 rows (Keras fit)
        self._aggregate = aggregate                    # None: above AGGREGATE_ABOVE series
        self.aggregates: StepAggregates | None = None  # set when aggregated (first rows)
        self._time_col = COL.compute_ms
        self._loss_scale_step = -math.inf               # the last step of the loss scale line

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, rows: np.ndarray | Sequence[Row]) -> None:
        """Add rows (``Run.block_since``'s array, or ``Row`` tuples): columns read by name
        through ``COL``."""
        if len(rows) == 0:
            return
        data = np.asarray(rows, dtype=np.float64)
        self.rows += len(rows)
        steps = data[:, COL.step]
        self.last_step = max(self.last_step, int(steps.max()))
        self.last_epoch = int(data[-1, COL.epoch])
        self._rate.append((float(data[-1, COL.wall_time]), float(data[-1, COL.step])))
        if self.rows == len(rows):     # first batch: per-replica rows, or reduced ones (fit)
            self._first_rows(data)
        time_col = self._time_col
        codes, keys = _key_codes(data)
        for key in keys:
            if key not in self._known:
                self._add_key(key)
        self._expected = max(self._expected, len(self.keys))
        if self.aggregates is not None:     # no line per key: rows wait for their step's end
            self.aggregates.keep(data)
            self._accumulate(data)
            return
        for code, key in enumerate(keys):
            sub = data[codes == code] if len(keys) > 1 else data   # rows in arrival order
            x = sub[:, COL.step]
            for metric, col in (("loss", COL.loss), ("grad_norm", COL.grad_norm),
                                ("allreduce_ms", COL.allreduce_ms), ("time", time_col)):
                self.series[(metric, key)].extend(x, sub[:, col])
        self._accumulate(data)

    def _first_rows(self, data: np.ndarray) -> None:
        """Per-replica rows or reduced ones (fit); aggregated when there are too many keys."""
        self.per_replica = bool((data[:, COL.replica] >= 0).any())
        self._time_col = COL.compute_ms if self.per_replica else COL.step_ms
        n_keys = self.workers * (self.replicas if self.per_replica else 1)
        if self._aggregate if self._aggregate is not None else n_keys > AGGREGATE_ABOVE:
            self.aggregates = StepAggregates(
                workers=self.workers, replicas=self.replicas if self.per_replica else 1,
                cap=self.max_points)
            self.series.update(self.aggregates.lines())
            self._expected = n_keys      # a step is complete with every key, not the first seen

    @property
    def aggregated(self) -> bool:
        return self.aggregates is not None

    def _add_key(self, key: Key) -> None:
        self.keys.append(key)
        self.keys.sort()
        self._known.add(key)
        for metric in KEY_METRICS if self.aggregates is None else ():
            self.series[(metric, key)] = Decimator(self.max_points)
        if len(self.keys) == 1:
            for metric in GLOBAL_METRICS:
                self.series[(metric, None)] = Decimator(self.max_points)

    def _accumulate(self, data: np.ndarray) -> None:
        """Per-step global lines: the global loss (the mean x ``loss_scale``: for a complete
        step the sum over the replicas when they add up), mean host step time, slowest
        allreduce and slowest other collectives. Steps wait in ``_pending`` (one row per
        step: ``_PENDING`` columns) until complete, merged with numpy, never a loop per step."""
        steps = data[:, COL.step]
        parts = [steps]
        for col in (COL.loss, COL.step_ms):
            vals = data[:, col]
            ok = np.isfinite(vals)
            parts += [np.where(ok, vals, 0.0), ok.astype(np.float64)]
        for col in (COL.allreduce_ms, COL.other_collective_ms):
            vals = data[:, col]
            parts.append(np.where(np.isfinite(vals), vals, -math.inf))
        parts.append(np.ones(len(steps)))
        merged = np.concatenate([self._pending, np.stack(parts, axis=1)])
        uniq, inverse = _group(merged[:, 0])
        order = np.argsort(inverse, kind="stable")
        merged = merged[order]
        starts = np.flatnonzero(np.diff(inverse[order], prepend=-1))
        pending = np.add.reduceat(merged, starts, axis=0)       # sums...
        pending[:, 0] = uniq
        pending[:, 5:7] = np.maximum.reduceat(merged[:, 5:7], starts, axis=0)   # ...and maxima
        self._pending = pending
        self.other_collectives = self.other_collectives or bool((pending[:, 6] > 0).any())
        self._flush(lag=16)

    def _flush(self, lag: int | None) -> None:
        """Finalise complete steps, and incomplete ones ``lag`` steps behind (all if None)."""
        p = self._pending
        done = np.ones(len(p), dtype=bool) if lag is None else (
            (p[:, 7] >= self._expected) | (p[:, 0] < self.last_step - lag))
        if not done.any():
            return
        acc, self._pending = p[done], p[~done]
        x = acc[:, 0]
        if self.aggregates is not None:
            self.aggregates.finish_steps(x, self._time_col)
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.where(acc[:, 2] > 0, acc[:, 1] / acc[:, 2], math.nan)
            step_ms = np.where(acc[:, 4] > 0, acc[:, 3] / acc[:, 4], math.nan)
        self.series[("loss", None)].extend(x, loss * self.loss_scale)
        self.series[("step_ms", None)].extend(x, step_ms)
        for name, i, recent in (("allreduce_ms", 5, self._allreduce),
                                ("other_collective_ms", 6, self._other)):
            slowest = np.where(acc[:, i] > -math.inf, acc[:, i], math.nan)
            self.series[(name, None)].extend(x, slowest)
            recent.extend(slowest[np.isfinite(slowest)][-recent.maxlen:].tolist())

    def ingest_loss_scale(self, steps: np.ndarray, values: np.ndarray) -> None:
        """The loss scale of each step that scaled its loss (the rows' ``loss_scale_factor``,
        the same on every replica): the ``("loss_scale_factor", None)`` line, a point per
        step (a step already drawn, from another worker's rows, is not drawn again)."""
        ok = np.isfinite(values) & (steps > self._loss_scale_step)
        if not ok.any():
            return
        x, first = np.unique(steps[ok], return_index=True)
        dec = self.series.setdefault(("loss_scale_factor", None), Decimator(self.max_points))
        dec.extend(x, values[ok][first])
        self._loss_scale_step = float(x[-1])

    def ingest_metrics(self, steps: np.ndarray, extras: dict[str, np.ndarray]) -> None:
        """A fit's compiled metrics per batch (its rows' extras, ``Run.extras_since``, the
        rows' ``steps``): a ``("metric", name)`` line each; ``running_loss`` (Keras' running
        mean, see ``figure.feed``) is the ``("running_loss", None)`` line of the loss panel."""
        for name, values in extras.items():
            if name in NOT_METRICS:
                continue
            ok = np.isfinite(values)
            ident = ("running_loss", None) if name == "running_loss" else ("metric", name)
            if ident not in self.series and not ok.any():
                continue
            if ident not in self.series:
                self.series[ident] = Decimator(self.max_points)
            self.series[ident].extend(steps[ok], values[ok])

    def ingest_epochs(self, rows: Sequence[dict[str, float]]) -> None:
        """Finished epochs (``Run.epoch_rows``): a ``("epoch", name)`` series per number Keras
        logged at an epoch's end, at the epoch's last step."""
        for row in rows:
            for name, value in row.items():
                if name in ("epoch", "step") or not math.isfinite(value):
                    continue
                dec = self.series.setdefault(("epoch", name), Decimator(self.max_points))
                dec.extend(np.array([row["step"]]), np.array([value]))

    def metric_names(self) -> list[str]:
        """The compiled metrics with a line per batch (``ingest_metrics``), in order seen."""
        return [key for m, key in self.series if m == "metric"]

    def epoch_names(self) -> list[str]:
        """The numbers logged per epoch (``ingest_epochs``), in order seen."""
        return [key for m, key in self.series if m == "epoch"]

    def finish(self) -> None:
        """Finalise every pending step (the run ended)."""
        self._flush(lag=None)

    # -- derived numbers -------------------------------------------------------------------
    def allreduce_seconds(self) -> float:
        """Median over recent timed steps of the slowest replica's gradient all-reduce, in
        seconds."""
        return float(np.median(self._allreduce)) / 1e3 if self._allreduce else math.nan

    def other_collective_ms(self) -> float:
        """Median over recent timed steps of the slowest replica's other collectives (ms)."""
        return float(np.median(self._other)) if self._other else math.nan

    def bus_bandwidth(self, nbytes: int | None) -> float:
        """Of the gradient all-reduce: ``nbytes`` per replica (``Run.allreduce_bytes``)."""
        return bus_bandwidth(nbytes or 0, self.replicas * self.workers, self.allreduce_seconds())

    def steps_per_second(self, window_s: float = 5.0) -> float:
        """Recent training rate from the rows' wall times (NaN before two samples)."""
        if len(self._rate) < 2:
            return math.nan
        t_end, s_end = self._rate[-1]
        for t, s in self._rate:
            if t_end - t <= window_s and s < s_end:
                return (s_end - s) / (t_end - t) if t_end > t else math.nan
        return math.nan

    def label(self, key: Key) -> str:
        worker, replica = key
        if replica < 0:
            return f"worker {worker}"
        return f"w{worker}/r{replica}" if self.workers > 1 else f"replica {replica}"

    def plotted_keys(self) -> list[Key]:
        """Keys drawn as their own lines: all but a lone reduced row (it IS the global line)."""
        if self.aggregates is not None or (len(self.keys) == 1 and self.keys[0][1] < 0):
            return []
        return list(self.keys)
