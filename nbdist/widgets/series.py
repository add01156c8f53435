"""What the dashboard plots, computed from a Run's rows: numpy only (no plotly, no widgets).

``RunSeries`` ingests ``Run.rows_since`` batches and keeps, per (worker, replica) and per
metric, a bounded ``Decimator`` (at most ``max_points`` bucket means, whatever the run
length: the full-resolution data stays in the Run). It also keeps the per-step global lines,
the recent per-replica times used to flag stragglers, the bus bandwidth and the step rate.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Column indices of nbdist.telemetry.run.COLUMNS.
STEP, EPOCH, REPLICA, WORKER, LOSS, GRAD_NORM, ALLREDUCE_MS, WAIT_MS, COMPUTE_MS, STEP_MS, \
    DATA_MS, WALL_TIME = range(12)

#: Per-key metrics: name -> column. ``time`` is filled by ``RunSeries`` (see ``_time_column``).
KEY_METRICS = ("loss", "grad_norm", "allreduce_ms", "time")
#: Per-step global lines.
GLOBAL_METRICS = ("loss", "step_ms", "allreduce_ms")

Key = tuple[int, int]          # (worker, replica); replica -1: reduced over the worker's replicas


def bus_bandwidth(nbytes: float, ranks: int, seconds: float) -> float:
    """Allreduce bus bandwidth in bytes/s, the nccl-tests convention: bytes*2(N-1)/N / time.

    ``nbytes`` is what each rank contributes; ``ranks`` the number of participants. NaN when
    it cannot be computed (no time, one rank, unknown size).
    """
    if not (nbytes and ranks > 1 and seconds > 0 and math.isfinite(seconds)):
        return math.nan
    return nbytes * 2 * (ranks - 1) / ranks / seconds


class Decimator:
    """A growing (x, y) series kept to at most ``cap`` points.

    Points are averaged in buckets of ``k`` raw points; when ``cap`` buckets are full, pairs
    are merged and ``k`` doubles. Appending is amortised O(1) per point and vectorised; NaN
    and inf values are skipped (a line through the measured points, never a zero).
    """

    def __init__(self, cap: int = 2000):
        if cap < 4:
            raise ValueError(f"cap must be at least 4, got {cap}")
        self.cap = cap - cap % 2
        self.k = 1
        self.n = 0                          # completed buckets
        self._x = np.empty(self.cap)
        self._y = np.empty(self.cap)
        self._sx = self._sy = 0.0           # sums of the pending (partial) bucket
        self._pc = 0                        # raw points in the pending bucket
        self.raw = 0                        # raw finite points seen
        self.version = 0                    # bumped on every change

    def extend(self, x: np.ndarray, y: np.ndarray) -> None:
        keep = np.isfinite(y)
        if not keep.all():
            x, y = x[keep], y[keep]
        if not len(y):
            return
        self.version += 1
        self.raw += len(y)
        i, total = 0, len(y)
        while i < total:
            if self._pc:                    # top up the pending bucket first
                take = min(self.k - self._pc, total - i)
                self._sx += float(x[i:i + take].sum())
                self._sy += float(y[i:i + take].sum())
                self._pc += take
                i += take
                if self._pc == self.k:
                    self._push(self._sx / self.k, self._sy / self.k)
                    self._sx = self._sy = 0.0
                    self._pc = 0
                continue
            full = min((total - i) // self.k, self.cap - self.n)
            if full:
                end = i + full * self.k
                if self.k == 1:
                    self._x[self.n:self.n + full] = x[i:end]
                    self._y[self.n:self.n + full] = y[i:end]
                else:
                    self._x[self.n:self.n + full] = x[i:end].reshape(full, self.k).mean(axis=1)
                    self._y[self.n:self.n + full] = y[i:end].reshape(full, self.k).mean(axis=1)
                self.n += full
                i = end
                if self.n == self.cap:
                    self._halve()
                continue
            self._sx = float(x[i:].sum())   # fewer than k left: start a pending bucket
            self._sy = float(y[i:].sum())
            self._pc = total - i
            i = total

    def _push(self, x: float, y: float) -> None:
        self._x[self.n], self._y[self.n] = x, y
        self.n += 1
        if self.n == self.cap:
            self._halve()

    def _halve(self) -> None:
        half = self.n // 2
        self._x[:half] = (self._x[0:self.n:2] + self._x[1:self.n:2]) / 2
        self._y[:half] = (self._y[0:self.n:2] + self._y[1:self.n:2]) / 2
        self.n = half
        self.k *= 2

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the current points (at most ``cap``), float64."""
        x, y = self._x[:self.n], self._y[:self.n]
        if self._pc:
            x = np.append(x, self._sx / self._pc)
            y = np.append(y, self._sy / self._pc)
        return x.copy(), y.copy()

    @property
    def last(self) -> tuple[float, float] | None:
        if self._pc:
            return self._sx / self._pc, self._sy / self._pc
        if self.n:
            return float(self._x[self.n - 1]), float(self._y[self.n - 1])
        return None


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
                 straggler_window: int = 8, bandwidth_window: int = 20):
        if straggler_factor <= 1:
            raise ValueError(f"straggler_factor must be > 1, got {straggler_factor}")
        self.replicas, self.workers, self.max_points = replicas, workers, max_points
        self.straggler_factor, self.straggler_min_ms = straggler_factor, straggler_min_ms
        self.keys: list[Key] = []
        self.series: dict[tuple[str, Key | None], Decimator] = {}
        self._recent: dict[Key, deque[float]] = {}
        self._stragglers: list[Straggler] | None = None
        self._window = straggler_window
        self._pending: dict[int, list[float]] = {}     # step -> accumulators, see _accumulate
        self._expected = 0                             # rows per complete step
        self._allreduce = deque(maxlen=bandwidth_window)
        self._rate = deque(maxlen=64)                  # (wall_time, step) samples
        self.rows = 0
        self.last_step = -1
        self.last_epoch = 0
        self.per_replica = True                        # False for replica -1 rows (Keras fit)

    # -- ingest ----------------------------------------------------------------------------
    def ingest(self, rows: Sequence[tuple]) -> None:
        """Add rows (tuples in ``COLUMNS`` order, as ``Run.rows_since`` returns them)."""
        if not rows:
            return
        data = np.array(rows, dtype=np.float64)
        self.rows += len(rows)
        steps = data[:, STEP]
        self.last_step = max(self.last_step, int(steps.max()))
        self.last_epoch = int(data[-1, EPOCH])
        self._rate.append((float(data[-1, WALL_TIME]), float(data[-1, STEP])))
        if self.rows == len(rows):     # first batch: per-replica rows, or reduced ones (fit)
            self.per_replica = bool((data[:, REPLICA] >= 0).any())
        time_col = COMPUTE_MS if self.per_replica else STEP_MS
        codes = data[:, WORKER].astype(np.int64) * 65536 + data[:, REPLICA].astype(np.int64) + 1
        order = np.argsort(codes, kind="stable")
        grouped, codes = data[order], codes[order]
        uniq, starts = np.unique(codes, return_index=True)
        bounds = [*starts.tolist(), len(codes)]
        for i, code in enumerate(uniq.tolist()):
            key = (code // 65536, code % 65536 - 1)
            if key not in self._recent:
                self._add_key(key)
            sub = grouped[bounds[i]:bounds[i + 1]]
            x = sub[:, STEP]
            for metric, col in (("loss", LOSS), ("grad_norm", GRAD_NORM),
                                ("allreduce_ms", ALLREDUCE_MS), ("time", time_col)):
                self.series[(metric, key)].extend(x, sub[:, col])
            times = sub[:, time_col]
            times = times[np.isfinite(times)]
            if len(times):
                self._recent[key].extend(times[-self._window:].tolist())
                self._stragglers = None
        self._expected = max(self._expected, len(self.keys))
        self._accumulate(data)

    def _add_key(self, key: Key) -> None:
        self.keys.append(key)
        self.keys.sort()
        self._recent[key] = deque(maxlen=self._window)
        for metric in KEY_METRICS:
            self.series[(metric, key)] = Decimator(self.max_points)
        if len(self.keys) == 1:
            for metric in GLOBAL_METRICS:
                self.series[(metric, None)] = Decimator(self.max_points)

    def _accumulate(self, data: np.ndarray) -> None:
        """Per-step global lines: mean loss, mean host step time, slowest allreduce."""
        steps, inverse = np.unique(data[:, STEP], return_inverse=True)
        inverse = inverse.reshape(-1)
        n = len(steps)
        sums = []
        for col in (LOSS, STEP_MS):
            vals = data[:, col]
            ok = np.isfinite(vals)
            sums.append(np.bincount(inverse[ok], weights=vals[ok], minlength=n))
            sums.append(np.bincount(inverse[ok], minlength=n))
        ar = np.full(n, -math.inf)
        vals = data[:, ALLREDUCE_MS]
        ok = np.isfinite(vals)
        np.maximum.at(ar, inverse[ok], vals[ok])
        rows = np.bincount(inverse, minlength=n)
        columns = zip(steps.astype(int).tolist(), *(c.tolist() for c in sums), ar.tolist(),
                      rows.tolist(), strict=True)
        for step, loss, n_loss, step_ms, n_step, slowest, count in columns:
            acc = self._pending.get(step)
            if acc is None:
                self._pending[step] = [loss, n_loss, step_ms, n_step, slowest, count]
            else:
                acc[0] += loss
                acc[1] += n_loss
                acc[2] += step_ms
                acc[3] += n_step
                acc[4] = max(acc[4], slowest)
                acc[5] += count
        self._flush(lag=16)

    def _flush(self, lag: int | None) -> None:
        """Finalise complete steps, and incomplete ones ``lag`` steps behind (all if None)."""
        done = [s for s, acc in self._pending.items()
                if lag is None or acc[5] >= self._expected or s < self.last_step - lag]
        if not done:
            return
        done.sort()
        accs = [self._pending.pop(s) for s in done]
        x = np.array(done, dtype=np.float64)

        def mean(s: int) -> np.ndarray:
            return np.array([a[s] / a[s + 1] if a[s + 1] else math.nan for a in accs])

        self.series[("loss", None)].extend(x, mean(0))
        self.series[("step_ms", None)].extend(x, mean(2))
        ar = np.array([a[4] if a[4] > -math.inf else math.nan for a in accs])
        self.series[("allreduce_ms", None)].extend(x, ar)
        self._allreduce.extend(ar[np.isfinite(ar)].tolist())

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
        recent = {k: statistics.median(v) for k, v in self._recent.items() if v}
        if len(recent) < 2:
            return []
        values = sorted(recent.values())
        out = []
        for key, value in recent.items():
            others = list(values)
            others.remove(value)               # the median of the others (leave-one-out)
            ref = statistics.median(others)
            if value > self.straggler_factor * ref and value - ref >= self.straggler_min_ms:
                out.append(Straggler(key, value, ref))
        return out

    def allreduce_seconds(self) -> float:
        """Median over recent timed steps of the slowest replica's allreduce, in seconds."""
        return float(np.median(self._allreduce)) / 1e3 if self._allreduce else math.nan

    def bus_bandwidth(self, nbytes: int | None) -> float:
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
        if len(self.keys) == 1 and self.keys[0][1] < 0:
            return []
        return list(self.keys)
