"""What the dashboard plots, computed from a Run's rows: numpy only (no plotly, no widgets).

``RunSeries`` ingests ``Run.rows_since`` batches and keeps, per (worker, replica) and per
metric, a bounded ``Decimator`` (at most ``max_points`` bucket means, whatever the run
length: the full-resolution data stays in the Run). It also keeps the per-step global lines,
the recent per-replica times used to flag stragglers, the bus bandwidth and the step rate.
``allreduce_ms`` is the gradient all-reduce; the step's other collectives (SyncBatchNormalization's
batch statistics...) have their own global line, ``other_collective_ms``, once a row has some.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..telemetry.rows import POSITION as COL
from ..telemetry.rows import Row
from .aggregate import AGGREGATE_ABOVE, StepAggregates, others_medians
from .decimator import Decimator

#: Per-key metrics. ``time`` is ``compute_ms`` for per-replica rows, ``step_ms`` for rows
#: reduced over the replicas (Keras fit).
KEY_METRICS = ("loss", "grad_norm", "allreduce_ms", "time")
#: Per-step global lines (the two times: the slowest replica's).
GLOBAL_METRICS = ("loss", "step_ms", "allreduce_ms", "other_collective_ms")

Key = tuple[int, int]          # (worker, replica); replica -1: reduced over the worker's replicas


def bus_bandwidth(nbytes: float, ranks: int, seconds: float) -> float:
    """Allreduce bus bandwidth in bytes/s, the nccl-tests convention: bytes*2(N-1)/N / time.

    ``nbytes`` is what each rank contributes; ``ranks`` the number of participants. NaN when
    it cannot be computed (no time, one rank, unknown size).
    """
    if not (nbytes and ranks > 1 and seconds > 0 and math.isfinite(seconds)):
        return math.nan
    return nbytes * 2 * (ranks - 1) / ranks / seconds


@dataclass
class Straggler:
    key: Key
    value_ms: float       # its recent time
    reference_ms: float   # median recent time of the others

    @property
    def ratio(self) -> float:
        return self.value_ms / self.reference_ms if self.reference_ms > 0 else math.inf


class RunSeries:
    """Everything the dashboard draws about one Run, updated incrementally."""

    def __init__(self, *, replicas: int, workers: int = 1, max_points: int = 2000,
                 straggler_factor: float = 1.5, straggler_min_ms: float = 0.5,
                 straggler_window: int = 8, bandwidth_window: int = 20, loss_scale: int = 1,
                 aggregate: bool | None = None):
        if straggler_factor <= 1:
            raise ValueError(f"straggler_factor must be > 1, got {straggler_factor}")
        self.replicas, self.workers, self.max_points = replicas, workers, max_points
        self.loss_scale = loss_scale    # global loss = mean of the rows x this (Run.loss_scale)
        self.straggler_factor, self.straggler_min_ms = straggler_factor, straggler_min_ms
        self.keys: list[Key] = []
        self.series: dict[tuple[str, Key | None], Decimator] = {}
        self._recent: dict[Key, deque[float]] = {}
        self._stragglers: list[Straggler] | None = None
        self._window = straggler_window
        self._pending: dict[int, list[float]] = {}     # step -> accumulators, see _accumulate
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

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, rows: np.ndarray | Sequence[Row]) -> None:
        """Add rows (``Run.block_since``'s array, or ``Row`` tuples): columns read by name
        through ``COL``."""
        if len(rows) == 0:
            return
        data = np.array(rows, dtype=np.float64)
        self.rows += len(rows)
        steps = data[:, COL.step]
        self.last_step = max(self.last_step, int(steps.max()))
        self.last_epoch = int(data[-1, COL.epoch])
        self._rate.append((float(data[-1, COL.wall_time]), float(data[-1, COL.step])))
        if self.rows == len(rows):     # first batch: per-replica rows, or reduced ones (fit)
            self._first_rows(data)
        time_col = self._time_col
        codes = (data[:, COL.worker].astype(np.int64) * 65536
                 + data[:, COL.replica].astype(np.int64) + 1)
        if self.aggregates is not None:     # no line per key: rows wait for their step's end
            for code in np.unique(codes).tolist():
                if (code // 65536, code % 65536 - 1) not in self._recent:
                    self._add_key((code // 65536, code % 65536 - 1))
            self.aggregates.keep(data)
            self._expected = max(self._expected, len(self.keys))
            self._accumulate(data)
            return
        order = np.argsort(codes, kind="stable")
        grouped, codes = data[order], codes[order]
        uniq, starts = np.unique(codes, return_index=True)
        bounds = [*starts.tolist(), len(codes)]
        for i, code in enumerate(uniq.tolist()):
            key = (code // 65536, code % 65536 - 1)
            if key not in self._recent:
                self._add_key(key)
            sub = grouped[bounds[i]:bounds[i + 1]]
            x = sub[:, COL.step]
            for metric, col in (("loss", COL.loss), ("grad_norm", COL.grad_norm),
                                ("allreduce_ms", COL.allreduce_ms), ("time", time_col)):
                self.series[(metric, key)].extend(x, sub[:, col])
            times = sub[:, time_col]
            times = times[np.isfinite(times)]
            if len(times):
                self._recent[key].extend(times[-self._window:].tolist())
                self._stragglers = None
        self._expected = max(self._expected, len(self.keys))
        self._accumulate(data)

    def _first_rows(self, data: np.ndarray) -> None:
        """Per-replica rows or reduced ones (fit); aggregated when there are too many keys."""
        self.per_replica = bool((data[:, COL.replica] >= 0).any())
        self._time_col = COL.compute_ms if self.per_replica else COL.step_ms
        n_keys = self.workers * (self.replicas if self.per_replica else 1)
        if self._aggregate if self._aggregate is not None else n_keys > AGGREGATE_ABOVE:
            self.aggregates = StepAggregates(
                workers=self.workers, replicas=self.replicas if self.per_replica else 1,
                cap=self.max_points, window=self._window)
            self.series.update(self.aggregates.lines())
            self._expected = n_keys      # a step is complete with every key, not the first seen

    @property
    def aggregated(self) -> bool:
        return self.aggregates is not None

    def _add_key(self, key: Key) -> None:
        self.keys.append(key)
        self.keys.sort()
        self._recent[key] = deque(maxlen=self._window)
        for metric in KEY_METRICS if self.aggregates is None else ():
            self.series[(metric, key)] = Decimator(self.max_points)
        if len(self.keys) == 1:
            for metric in GLOBAL_METRICS:
                self.series[(metric, None)] = Decimator(self.max_points)

    def _accumulate(self, data: np.ndarray) -> None:
        """Per-step global lines: the global loss (the mean x ``loss_scale``: for a complete
        step the sum over the replicas when they add up), mean host step time, slowest
        allreduce and slowest other collectives."""
        steps, inverse = np.unique(data[:, COL.step], return_inverse=True)
        inverse = inverse.reshape(-1)
        n = len(steps)
        sums = []
        for col in (COL.loss, COL.step_ms):
            vals = data[:, col]
            ok = np.isfinite(vals)
            sums.append(np.bincount(inverse[ok], weights=vals[ok], minlength=n))
            sums.append(np.bincount(inverse[ok], minlength=n))
        slowest = []
        for col in (COL.allreduce_ms, COL.other_collective_ms):
            top = np.full(n, -math.inf)
            vals = data[:, col]
            ok = np.isfinite(vals)
            np.maximum.at(top, inverse[ok], vals[ok])
            slowest.append(top)
        self.other_collectives = self.other_collectives or bool((slowest[1] > 0).any())
        rows = np.bincount(inverse, minlength=n)
        columns = zip(steps.astype(int).tolist(), *(c.tolist() for c in sums),
                      *(c.tolist() for c in slowest), rows.tolist(), strict=True)
        for step, *values, count in columns:
            acc = self._pending.get(step)
            if acc is None:
                self._pending[step] = [*values, count]
            else:   # loss, n_loss, step_ms, n_step: sums; allreduce, other: maxima; rows
                for i in range(4):
                    acc[i] += values[i]
                acc[4], acc[5] = max(acc[4], values[4]), max(acc[5], values[5])
                acc[6] += count
        self._flush(lag=16)

    def _flush(self, lag: int | None) -> None:
        """Finalise complete steps, and incomplete ones ``lag`` steps behind (all if None)."""
        done = [s for s, acc in self._pending.items()
                if lag is None or acc[6] >= self._expected or s < self.last_step - lag]
        if not done:
            return
        done.sort()
        accs = [self._pending.pop(s) for s in done]
        x = np.array(done, dtype=np.float64)
        if self.aggregates is not None:
            self.aggregates.finish_steps(x, self._time_col)
            self._stragglers = None

        def mean(s: int) -> np.ndarray:
            return np.array([a[s] / a[s + 1] if a[s + 1] else math.nan for a in accs])

        self.series[("loss", None)].extend(x, mean(0) * self.loss_scale)
        self.series[("step_ms", None)].extend(x, mean(2))
        for name, i, recent in (("allreduce_ms", 4, self._allreduce),
                                ("other_collective_ms", 5, self._other)):
            slowest = np.array([a[i] if a[i] > -math.inf else math.nan for a in accs])
            self.series[(name, None)].extend(x, slowest)
            recent.extend(slowest[np.isfinite(slowest)].tolist())

    def finish(self) -> None:
        """Finalise every pending step (the run ended)."""
        self._flush(lag=None)

    # -- derived numbers -------------------------------------------------------------------
    def stragglers(self) -> list[Straggler]:
        """Keys whose recent time exceeds ``straggler_factor`` x the median of the others."""
        if self._stragglers is None:
            self._stragglers = self._find_stragglers()
        return list(self._stragglers)

    def _find_stragglers(self) -> list[Straggler]:
        if self.aggregates is not None:
            recent = self.aggregates.recent_times()
        else:
            recent = {k: statistics.median(v) for k, v in self._recent.items() if v}
        if len(recent) < 2:
            return []
        values = np.array(list(recent.values()))
        refs = others_medians(values)
        slow = (values > self.straggler_factor * refs) & (values - refs >= self.straggler_min_ms)
        keys = list(recent)
        found = [Straggler(keys[i], float(values[i]), float(refs[i]))
                 for i in np.flatnonzero(slow).tolist()]
        return sorted(found, key=lambda s: -s.ratio)     # the slowest first

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
