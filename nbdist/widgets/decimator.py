"""A growing (x, y) series kept to a bounded number of points: what each dashboard line holds
(the full-resolution data stays in the Run)."""

from __future__ import annotations

import numpy as np


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
