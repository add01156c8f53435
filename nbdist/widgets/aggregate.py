"""Per-step aggregates over many replicas: what the dashboard draws above ``AGGREGATE_ABOVE``
series, where one line per replica is unreadable and too costly to keep and send.

``StepAggregates`` takes the rows of finished steps and computes, vectorised with numpy, each
metric's quantiles over all replicas at each step (min, 10%, median, 90%, max) and each
worker's slowest replica time (the heatmap), into ``StepGrid``s: fixed-size step buckets
whose width doubles as the run grows, so memory and the points sent stay bounded.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..telemetry.rows import POSITION as COL

#: More series (worker x replica keys) than this: aggregate views instead of one line each.
AGGREGATE_ABOVE = 16
QUANTILES = (0.0, 0.1, 0.5, 0.9, 1.0)
STATS = ("min", "q10", "median", "q90", "max")
METRIC_COLUMNS = ("loss", "grad_norm", "allreduce_ms", "time")
#: The band's edges over a bucket of steps: the extremes, not their means.
_REDUCE = {"min": "min", "max": "max"}


class StepGrid:
    """Values of ``columns`` columns per step, kept in at most ``cap`` buckets of ``k`` steps
    (bucket b: steps b*k ... b*k+k-1), each cell the mean of its finite values, and also their
    least and greatest (``points(reduce=...)``: a min-max band keeps a one-step spike visible
    in a long run). Steps may arrive in any order; when a step falls beyond the last bucket,
    pairs merge and k doubles."""

    def __init__(self, columns: int, cap: int):
        self.cap, self.k, self.version = cap - cap % 2, 1, 0
        self._sum = np.zeros((self.cap, columns))
        self._count = np.zeros((self.cap, columns))
        self._min = np.full((self.cap, columns), np.inf)
        self._max = np.full((self.cap, columns), -np.inf)
        self._xsum = np.zeros(self.cap)
        self._xcount = np.zeros(self.cap)

    def add(self, steps: np.ndarray, values: np.ndarray) -> None:
        """``values[i]`` (one per column) measured at ``steps[i]``."""
        if not len(steps):
            return
        steps = steps.astype(np.int64)
        while int(steps.max()) // self.k >= self.cap:
            self._halve()
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order], values[order]
        bucket = steps // self.k
        starts = np.flatnonzero(np.diff(bucket, prepend=-1))
        used = bucket[starts]
        ok = np.isfinite(values)
        self._sum[used] += np.add.reduceat(np.where(ok, values, 0.0), starts, axis=0)
        self._count[used] += np.add.reduceat(ok.astype(np.float64), starts, axis=0)
        self._min[used] = np.fmin(self._min[used], np.fmin.reduceat(values, starts, axis=0))
        self._max[used] = np.fmax(self._max[used], np.fmax.reduceat(values, starts, axis=0))
        self._xsum[used] += np.add.reduceat(steps.astype(np.float64), starts)
        self._xcount[used] += np.diff(np.append(starts, len(steps)))
        self.version += 1

    def _halve(self) -> None:
        half = self.cap // 2
        for a in (self._sum, self._count, self._xsum, self._xcount):
            a[:half] = a[0::2] + a[1::2]
            a[half:] = 0
        for a, merge, empty in ((self._min, np.fmin, np.inf), (self._max, np.fmax, -np.inf)):
            a[:half] = merge(a[0::2], a[1::2])
            a[half:] = empty
        self.k *= 2

    def points(self, reduce: str = "mean") -> tuple[np.ndarray, np.ndarray]:
        """(x: the mean step of each used bucket, values: buckets x columns, NaN if none),
        the values each bucket's mean, least or greatest (``reduce``: mean, min, max)."""
        used = self._xcount > 0
        x = self._xsum[used] / self._xcount[used]
        count = self._count[used]
        if reduce != "mean":
            extreme = (self._min if reduce == "min" else self._max)[used]
            return x, np.where(count > 0, extreme, np.nan)
        with np.errstate(invalid="ignore", divide="ignore"):
            values = np.where(count > 0, self._sum[used] / count, np.nan)
        return x, values


class GridLine:
    """One column of a StepGrid, read as a dashboard line (a ``Decimator``'s interface): each
    bucket's mean, least or greatest value (``reduce``)."""

    def __init__(self, grid: StepGrid, column: int, reduce: str = "mean"):
        self.grid, self.column, self.reduce = grid, column, reduce

    @property
    def version(self) -> int:
        return self.grid.version

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        x, values = self.grid.points(self.reduce)
        y = values[:, self.column]
        keep = np.isfinite(y)
        return x[keep], y[keep]

    @property
    def raw(self) -> int:
        return int(self.grid._count[:, self.column].sum())

    @property
    def last(self) -> tuple[float, float] | None:
        x, y = self.points()
        return (float(x[-1]), float(y[-1])) if len(x) else None


class StepAggregates:
    """Quantile bands of every metric and the worker x step heatmap, from finished steps."""

    def __init__(self, *, workers: int, replicas: int, cap: int, window: int = 8):
        self.workers, self.replicas = workers, max(1, replicas)
        self.bands = StepGrid(len(METRIC_COLUMNS) * len(STATS), cap)
        self.heat = StepGrid(workers, min(cap, 200))
        self._rows: list[np.ndarray] = []       # rows of steps not finished yet
        self._window = window
        self.recent = np.empty((0, workers * self.replicas))   # last steps' times per key

    def lines(self) -> dict[tuple[str, str], GridLine]:
        """(metric, stat) -> its line."""
        return {(m, s): GridLine(self.bands, i * len(STATS) + j, _REDUCE.get(s, "mean"))
                for i, m in enumerate(METRIC_COLUMNS) for j, s in enumerate(STATS)}

    def keep(self, data: np.ndarray) -> None:
        self._rows.append(data)

    def waiting_with(self, metric: str) -> bool:
        """Whether a row of a step not finished yet measured ``metric`` (a ``COL`` name): the
        first rows of a live run are often one worker's part of its first step."""
        col = getattr(COL, metric)
        return any(np.isfinite(rows[:, col]).any() for rows in self._rows)

    def finish_steps(self, steps: np.ndarray, time_col: int) -> None:
        """Aggregate the kept rows of ``steps`` (finished: every replica reported, or late)."""
        if not self._rows or not len(steps):
            return
        rows = np.concatenate(self._rows) if len(self._rows) > 1 else self._rows[0]
        mine = np.isin(rows[:, COL.step], steps)
        self._rows = [rows[~mine]] if not mine.all() else []
        rows = rows[mine]
        if not len(rows):
            return
        uniq, at = np.unique(rows[:, COL.step], return_inverse=True)
        at = at.reshape(-1)
        worker = rows[:, COL.worker].astype(np.int64)
        key = worker * self.replicas + np.maximum(rows[:, COL.replica], 0).astype(np.int64)
        width = self.workers * self.replicas
        stats = []
        for col in (COL.loss, COL.grad_norm, COL.allreduce_ms, time_col):
            grid = np.full((len(uniq), width), np.nan)
            grid[at, key] = rows[:, col]
            if col == time_col:
                times = grid
                timed = grid[np.isfinite(grid).any(axis=1)]
                self.recent = np.vstack([self.recent, timed])[-self._window:]
            stats.append(row_quantiles(grid, QUANTILES))
        self.bands.add(uniq, np.hstack(stats))
        with warnings.catch_warnings():     # a worker with no time at a step: NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            heat = np.nanmax(times.reshape(len(uniq), self.workers, self.replicas), axis=2)
        self.heat.add(uniq, heat)

    def recent_times(self) -> dict[tuple[int, int], float]:
        """(worker, replica) -> its median time over the last timed steps."""
        if not len(self.recent):
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            medians = np.nanmedian(self.recent, axis=0)
        return {divmod(int(i), self.replicas): float(medians[i])
                for i in np.flatnonzero(np.isfinite(medians))}


def row_quantiles(grid: np.ndarray, quantiles: tuple[float, ...]) -> np.ndarray:
    """``np.nanquantile(grid, quantiles, axis=1).T`` (linear interpolation, NaN for a row
    with no finite value), vectorised: numpy's falls back to one call per row when a row
    has a NaN, ~50x slower on a long run's thousands of steps."""
    ordered = np.sort(grid, axis=1)                  # NaN sorts last
    count = np.isfinite(grid).sum(axis=1)
    pos = np.asarray(quantiles)[None, :] * np.maximum(count - 1, 0)[:, None]
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0)[:, None])
    below = np.take_along_axis(ordered, lo, axis=1)
    above = np.take_along_axis(ordered, hi, axis=1)
    out = below + (pos - lo) * (above - below)
    out[count == 0] = np.nan
    return out
