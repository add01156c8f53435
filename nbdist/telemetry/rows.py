"""The row schema of the Run store: one ``Row`` per step and replica or worker.

The columns are declared once, here, with their meaning; everything that writes or reads rows
(runners, the worker-to-kernel forwarding, the dashboard's series, TensorBoard export) names
them. ``Run.table_since`` gives rows with these names (``pack`` puts them on the channel
from a worker process to the kernel; ``unpack`` reads them back).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

_NAN = math.nan


class Row(NamedTuple):
    """One row of ``Run.metrics``: one step of one replica or worker.

    Times in milliseconds; NaN where not measured. Metrics beyond these columns (Keras
    ``accuracy``, parameter-server ``update_ms``, ``keras_reported_loss``...) are a row's
    *extras*, kept beside it under their own names.
    """

    step: int           # global step, counted from 0 across epochs
    epoch: int
    replica: int        # replica index within its worker; -1: reduced over all replicas
    worker: int         # worker (process) index; 0 for in-kernel strategies
    loss: float
    grad_norm: float    # global L2 norm of this replica's local (un-reduced) gradients
    allreduce_ms: float  # the gradient all-reduce itself, after the slowest replica arrived
    wait_ms: float      # time this replica waited for the slowest one before the gradient one
    compute_ms: float   # replica time from batch arrival to the gradient all-reduce, less
    #                     the time in other collectives meanwhile
    other_collective_ms: float  # time in the step's other collectives (SyncBatchNormalization's
    #                     batch statistics...), waiting included; 0 when there are none
    step_ms: float      # host wall time of the whole step (same for all replicas of a sync step)
    data_ms: float      # host time spent fetching the step's batch from the input pipeline
    wall_time: float    # seconds since the epoch when the step finished


#: An extra of a step that scaled its loss (mixed precision: a loss scale optimizer's
#: ``scale_loss``/``get_scaled_loss``): the scale it multiplied the loss by, per row. An extra,
#: not a ``Row`` field, so rows and files written without it read as before.
LOSS_SCALE_FACTOR = "loss_scale_factor"

#: The columns of ``Run.metrics``, in order (``Row``'s fields).
COLUMNS: tuple[str, ...] = Row._fields
#: Each column's position, by name: ``data[:, POSITION.loss]`` on an array of rows.
POSITION = Row(*range(len(COLUMNS)))
#: The measured columns (what ``Run.last`` averages over the replicas of the last step).
MEASURED: tuple[str, ...] = ("loss", "grad_norm", "allreduce_ms", "wait_ms", "compute_ms",
                             "other_collective_ms", "step_ms", "data_ms")
#: The integer columns (stored as float64 like the others; exact below 2**53).
INTEGERS = frozenset(("step", "epoch", "replica", "worker"))
_COLUMN_SET = frozenset(COLUMNS)
_INDEX_COLUMNS = [POSITION.step, POSITION.epoch, POSITION.replica, POSITION.worker]
#: Most rows one message may carry (a worker flushes ten times a second).
MAX_ROWS = 100_000


def as_row(values: list[float]) -> Row:
    """A ``Row`` of one line of a block (its integer columns as ints)."""
    return Row(*(int(v) if name in INTEGERS else v
                 for name, v in zip(COLUMNS, values, strict=True)))


def pack(names: list[str], values: np.ndarray) -> dict[str, Any]:
    """Rows for the channel (``Run.table_since``'s names and values): the column names, the
    row count and the values as base64 float64 bytes, row-major. Numbers cross as bytes: a
    JSON list of them costs the kernel ~4x more to parse, which 64 workers x 8 replicas feel."""
    data = np.ascontiguousarray(values, dtype="<f8")
    return {"columns": list(names), "n": len(data), "data": base64.b64encode(data).decode()}


def unpack(message: Mapping[str, Any], **fixed: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The rows (float64, ``COLUMNS`` order) and extras (name -> values) of a ``pack``ed
    message, with ``fixed`` columns set for every row (e.g. ``worker=``). Raises TypeError or
    ValueError for anything else: a missing column, a wrong size, a missing step or index."""
    names, n, data = message.get("columns"), message.get("n"), message.get("data")
    if not (isinstance(names, list) and all(isinstance(x, str) for x in names)
            and len(set(names)) == len(names) and isinstance(n, int) and isinstance(data, str)):
        raise TypeError("metric rows are {columns: [names], n: rows, data: base64}")
    if not 0 <= n <= MAX_ROWS:
        raise ValueError(f"{n} rows in one message; at most {MAX_ROWS}")
    raw = base64.b64decode(data, validate=True)
    if len(raw) != 8 * n * len(names):
        raise ValueError(f"{len(raw)} bytes for {n} rows of {len(names)} columns")
    values = np.frombuffer(raw, dtype="<f8").reshape(n, len(names))
    where = {name: i for i, name in enumerate(names)}
    missing = [name for name in COLUMNS if name not in where and name not in fixed]
    if missing:
        raise ValueError(f"metric rows without column(s) {missing}")
    block = np.empty((n, len(COLUMNS)))
    for i, name in enumerate(COLUMNS):
        block[:, i] = fixed[name] if name in fixed else values[:, where[name]]
    if not np.isfinite(block[:, _INDEX_COLUMNS]).all():
        raise ValueError("metric rows with a missing step, epoch, replica or worker")
    extras = {name: values[:, i].copy() for name, i in where.items() if name not in _COLUMN_SET}
    return block, extras

