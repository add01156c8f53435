"""The Run's storage: rows of float64 columns in fixed-size numpy chunks.

A long run holds millions of rows (64 workers x 8 replicas x 50 steps/s is 25,600 a second);
as Python objects each row costs ~10x its 8 bytes per column. Here a row is one line of a
``(CHUNK, width)`` float64 array: appending copies numbers into the current chunk, a full chunk
is never copied again, and readers get copies of the ranges they ask for. Extras (metrics
beyond the fixed columns, e.g. Keras ``accuracy``) are named float64 columns in chunks of the
same shape, NaN where a row did not report them.

Not thread-safe by itself: ``Run`` serialises writers and readers with its lock.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

#: Rows per chunk (6.8 MB for the Run's 13 columns).
CHUNK = 1 << 16


class ColumnTable:
    """Append-only rows of ``width`` float64 columns, plus named extra columns."""

    def __init__(self, width: int):
        self.width = width
        self.n = 0
        self._chunks: list[np.ndarray] = []
        self._extras: dict[str, list[np.ndarray]] = {}

    def append(self, block: np.ndarray, extras: Mapping[str, np.ndarray] | None = None) -> None:
        """Append the rows of ``block`` (shape ``(k, width)``) and their extras (name -> k
        values). The row count moves last: an append interrupted half-way (KeyboardInterrupt)
        leaves no partial rows visible, and the next append writes over them."""
        k = len(block)
        while len(self._chunks) * CHUNK < self.n + k:
            self._chunks.append(np.empty((CHUNK, self.width)))
        for name in extras or ():
            if name not in self._extras:
                self._extras[name] = []
        for chunks in self._extras.values():
            while len(chunks) < len(self._chunks):
                chunks.append(np.full(CHUNK, np.nan))
        done = 0
        while done < k:
            index, at = divmod(self.n + done, CHUNK)
            take = min(k - done, CHUNK - at)
            self._chunks[index][at:at + take] = block[done:done + take]
            for name, chunks in self._extras.items():
                values = (extras or {}).get(name)
                chunks[index][at:at + take] = np.nan if values is None else \
                    values[done:done + take]
            done += take
        self.n += k

    def block(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A copy of rows ``start`` to ``stop`` (default: the end), shape ``(k, width)``."""
        return self._gather(self._chunks, start, stop, (0, self.width))

    def extra_names(self) -> list[str]:
        return list(self._extras)

    def extra(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """A copy of extra column ``name`` for rows ``start`` to ``stop``."""
        return self._gather(self._extras[name], start, stop, (0,))

    def last(self) -> np.ndarray | None:
        """The last row (a view), or None when empty."""
        if not self.n:
            return None
        return self._chunks[-1][(self.n - 1) % CHUNK]

    def _gather(self, chunks: list[np.ndarray], start: int, stop: int | None,
                empty_shape: tuple[int, ...]) -> np.ndarray:
        stop = self.n if stop is None else min(stop, self.n)
        start = max(0, min(start, stop))
        if start == stop:
            return np.empty(empty_shape)
        parts = []
        for index in range(start // CHUNK, (stop - 1) // CHUNK + 1):
            lo = max(start - index * CHUNK, 0)
            hi = min(stop - index * CHUNK, CHUNK)
            parts.append(chunks[index][lo:hi])
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
