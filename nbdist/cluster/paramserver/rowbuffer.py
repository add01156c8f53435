"""Where a parameter-server step's row waits for the kernel: on the worker that ran it.

A scheduled function that returns a value costs its result's copy to the coordinator as
soon as the step ends (``ClusterCoordinator``'s worker thread fetches every output "in case
the worker becomes unavailable later"): one RPC per step, costing the kernel's and each
worker's CPU on every step, which made a step cell slower than TensorFlow's own tutorial loop
(``benchmarks/paramserver.py`` compares them). So the step returns nothing; it appends its
packed row to a ring on its own worker (a ``tf.Variable(..., per_worker_variable=True)``: one
copy per worker, updated where the step runs), and the kernel reads each worker's ring in one
copy every few dozen steps (``WorkerRows.take``).

The ring is ``capacity`` rows of ``WIDTH`` float64, plus one row whose first entry counts the
rows ever appended. A row is ``[timed, *values]`` (``timed``: which compiled variant wrote
it, so the kernel knows its columns), padded with zeros. The step writes the row, then the
count, so every row below a count the kernel reads is complete. The kernel must read a
worker before it appends ``capacity`` rows more (``PSStepLoop`` keeps fewer steps than that
in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import StepCodeError
from ...hooks.tf_coordinator import per_worker_variable_values

#: Entries per row: the variant flag and up to WIDTH - 1 packed values.
WIDTH = 24


class WorkerRows:
    """A ring of rows on every worker, and how far the kernel has read each one."""

    def __init__(self, strategy: Any, workers: int, capacity: int):
        import tensorflow as tf

        self.workers, self.capacity = workers, capacity
        with strategy.scope():
            self.ring = tf.Variable(tf.zeros([capacity + 1, WIDTH], tf.float64),
                                    trainable=False, name="nbdist_rows",
                                    per_worker_variable=True)
        self.read = [0] * workers       # rows of each worker the kernel has taken
        self.gone: set[int] = set()     # workers whose ring died with them

    def append(self, timed: bool, packed: Any) -> None:
        """In the traced step: append ``packed`` (a float64 vector) to this worker's ring
        (the step returns nothing: its stateful ops run anyway)."""
        import tensorflow as tf

        size = int(packed.shape[0]) + 1
        if size > WIDTH:
            raise StepCodeError(f"a parameter-server step packs {size} values per row, more "
                                f"than the {WIDTH} nbdist's row ring holds.")
        row = tf.pad(tf.concat([tf.constant([float(timed)], tf.float64), packed], 0),
                     [[0, WIDTH - size]])
        count = self.ring.sparse_read([self.capacity])[0, 0]
        slot = tf.cast(tf.math.floormod(count, float(self.capacity)), tf.int64)
        write = self.ring.scatter_nd_update(tf.reshape(slot, [1, 1]), tf.reshape(row, [1, -1]))
        with tf.control_dependencies([write]):
            self.ring.scatter_nd_update([[self.capacity, 0]], tf.reshape(count + 1, [1]))

    def take(self, dead: Callable[[], set[int]]) -> list[np.ndarray]:
        """The rows appended since the last ``take``, each worker's in order. Workers in
        ``dead()`` (dead, or stopped) are not read; one that cannot be read and is in
        ``dead()`` then is left out from then on; any other error is raised."""
        values = per_worker_variable_values(self.ring)
        if values is None:   # not traced yet, or TensorFlow changed: all workers at once
            return self._rows_of(enumerate(self.ring.read_all()))
        tables = []
        unreadable = dead()   # a stopped worker's read would wait for it: not tried
        for index, value in enumerate(values):
            if index in self.gone or index in unreadable:
                continue
            try:
                tables.append((index, value.get()))
            except Exception:
                if index not in dead():
                    raise
                self.gone.add(index)
        return self._rows_of(tables)

    def _rows_of(self, tables: Any) -> list[np.ndarray]:
        rows: list[np.ndarray] = []
        for index, tensor in tables:
            table = tensor.numpy()
            count = int(table[self.capacity, 0])
            if count < self.read[index]:   # the worker came back with a fresh ring
                self.read[index] = 0
            first = max(self.read[index], count - self.capacity)
            rows += [table[k % self.capacity] for k in range(first, count)]
            self.read[index] = count
        return rows
