"""The row schema of the Run store: one ``Row`` per step and replica or worker.

The columns are declared once, here, with their meaning; everything that writes or reads rows
(runners, the worker-to-kernel forwarding, the dashboard's series, TensorBoard export) names
them. ``Run.records_since`` gives rows as dicts keyed by these names (what crosses from a
worker process to the kernel) and ``row_from_record`` reads one back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

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


#: The columns of ``Run.metrics``, in order (``Row``'s fields).
COLUMNS: tuple[str, ...] = Row._fields
#: Each column's position, by name: ``data[:, POSITION.loss]`` on an array of rows.
POSITION = Row(*range(len(COLUMNS)))
#: The measured columns (what ``Run.last`` averages over the replicas of the last step).
MEASURED: tuple[str, ...] = ("loss", "grad_norm", "allreduce_ms", "wait_ms", "compute_ms",
                             "other_collective_ms", "step_ms", "data_ms")
_INTEGERS = frozenset(("step", "epoch", "replica", "worker"))
_COLUMN_SET = frozenset(COLUMNS)


def row_from_record(record: Mapping[str, Any], **columns: Any) -> tuple[Row, dict[str, float]]:
    """A row and its extras from a dict keyed by column name (``Run.records_since``), with
    ``columns`` overriding its values (e.g. ``worker=``). None reads as NaN; a missing column
    raises KeyError, a value of the wrong type TypeError or ValueError."""
    if not isinstance(record, Mapping):
        raise TypeError(f"a metric row is a dict of columns, got {type(record).__name__}")
    values = {**record, **columns}
    row = Row(**{name: _column_value(name, values[name]) for name in COLUMNS})
    extras = {k: _column_value(k, v) for k, v in values.items() if k not in _COLUMN_SET}
    return row, extras


def _column_value(name: str, value: Any) -> float:
    if name in _INTEGERS:
        return int(value)
    return _NAN if value is None else float(value)
