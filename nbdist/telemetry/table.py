"""The Run's storage: rows of float64 columns in numpy chunks.

A long run holds millions of rows (64 workers x 8 replicas x 50 steps/s is 25,600 a second);
as Python objects each row costs ~10x its 8 bytes per column. Here a row is one line of a
``(rows, width)`` float64 array: appending copies numbers into the current chunk, a full chunk
is never copied again, and readers get copies of the ranges they ask for. Chunks start at
``FIRST`` rows and double up to ``CHUNK``, and ``trim`` (a finished run) cuts the last one to
its rows: a notebook session of hundreds of short runs keeps their rows, not a chunk each.
Extras (metrics beyond the fixed columns, e.g. Keras ``accuracy``) are named float64 columns
in chunks of the same lengths, NaN where a row did not report them.

Not thread-safe by itself: ``Run`` serialises writers and readers with its lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

import numpy as np

#: Rows of the largest chunk (a few MB for the Run's columns) and of the first.
CHUNK = 1 << 16
FIRST = 1 << 10


class ColumnTable:
    """Append-only rows of ``width`` float64 columns, plus named extra columns."""

    def __init__(self, width: int):
        self.width = width
        self.n = 0
        self._chunks: list[np.ndarray] = []
        self._starts: list[int] = []      # the first row of each chunk
        self._extras: dict[str, list[np.ndarray]] = {}

    @property
    def capacity(self) -> int:
        return self._starts[-1] + len(self._chunks[-1]) if self._chunks else 0

    def append(self, block: np.ndarray, extras: Mapping[str, np.ndarray] | None = None) -> None:
        """Append the rows of ``block`` (shape ``(k, width)``) and their extras (name -> k
        values). The row count moves last: an append interrupted half-way (KeyboardInterrupt)
        leaves no partial rows visible, and the next append writes over them."""
        k = len(block)
        while self.capacity < self.n + k:
            size = min(CHUNK, max(FIRST, self.capacity))      # doubling, up to CHUNK
            self._starts.append(self.capacity)
            self._chunks.append(np.empty((size, self.width)))
        for name in extras or ():
            if name not in self._extras:
                self._extras[name] = []
        for chunks in self._extras.values():
            while len(chunks) < len(self._chunks):
                chunks.append(np.full(len(self._chunks[len(chunks)]), np.nan))
        done = 0
        while done < k:
            index = bisect.bisect_right(self._starts, self.n + done) - 1
            at = self.n + done - self._starts[index]
            take = min(k - done, len(self._chunks[index]) - at)
            self._chunks[index][at:at + take] = block[done:done + take]
            for name, chunks in self._extras.items():
                values = (extras or {}).get(name)
                chunks[index][at:at + take] = np.nan if values is None else \
                    values[done:done + take]
            done += take
        self.n += k

    def trim(self) -> None:
        """Cut the last chunk to the rows it holds (a copy): no more rows are expected. Rows
        appended later go to a new chunk."""
        if not self._chunks or self.capacity == self.n:
            return
        used = self.n - self._starts[-1]
        for chunks in (self._chunks, *self._extras.values()):
            if used:
                chunks[-1] = chunks[-1][:used].copy()
            else:
                chunks.pop()
        if not used:
            self._starts.pop()

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
        index = bisect.bisect_right(self._starts, self.n - 1) - 1
        return self._chunks[index][self.n - 1 - self._starts[index]]

    def _gather(self, chunks: list[np.ndarray], start: int, stop: int | None,
                empty_shape: tuple[int, ...]) -> np.ndarray:
        stop = self.n if stop is None else min(stop, self.n)
        start = max(0, min(start, stop))
        if start == stop:
            return np.empty(empty_shape)
        parts = []
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_right(self._starts, stop - 1) - 1
        for index in range(first, last + 1):
            offset = self._starts[index]
            lo = max(start - offset, 0)
            hi = min(stop - offset, len(chunks[index]))
            parts.append(chunks[index][lo:hi])
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
