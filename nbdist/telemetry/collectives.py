"""Which of a step's collectives is the gradient all-reduce, and the time each replica spent.

A step can make several collectives: SyncBatchNormalization (``BatchNormalization(
synchronized=True)``) all-reduces each layer's batch statistics in the forward pass and their
gradients in the backward pass, before the optimizer all-reduces the gradients. The probe
(``probe.StepProbe``) stamps every one of them; this module decides which one is the
*gradient* all-reduce and turns the stamps into the row columns (``rows.Row``):

* the gradient all-reduce is what a Keras optimizer's ``apply`` (``apply_gradients``) or a
  tf_keras optimizer's gradient aggregation all-reduces; if the step made none there, it is the
  collective that carries the most bytes (the last of them on a tie);
* ``compute_ms``: from the batch to the gradient all-reduce, less the time in other
  collectives meanwhile; ``wait_ms``: waiting for the slowest replica to reach the gradient
  all-reduce; ``allreduce_ms``: the gradient all-reduce after the last replica arrived;
* ``other_collective_ms``: the time this replica spent in every other collective of the step
  (overlapping ones counted once), waiting for the other replicas included; 0 when the step
  made none.

A step whose gradient all-reduce did not run (a loss scale optimizer skips a step whose
gradients are not finite) has NaN stamps for it: its timing columns are NaN.

The bus bandwidth (``Run.allreduce_bytes`` over ``allreduce_ms``) then counts the gradient
all-reduce alone. Host side is numpy only; the in-graph side takes the stamps as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..words import count

# The step output's keys (one float64 per replica each): the probe writes them, the runner
# reads them back with ``split_timing``.
T_BEGIN = "t_begin"
T_GRAD_START = "t_grad_start"
T_GRAD_END = "t_grad_end"
_OTHER_START = "t_other_start_"
_OTHER_END = "t_other_end_"


@dataclass(frozen=True)
class Collective:
    """One collective a replica's step made, as traced: its two stamps (tensors) and size."""

    t0: Any               # tf.timestamp after its inputs exist
    t1: Any               # tf.timestamp after its outputs exist
    nbytes: int           # what this replica contributes
    gradient: bool        # made by an optimizer applying gradients


@dataclass(frozen=True)
class Attribution:
    """A traced step's collectives, split into the gradient all-reduce and the others."""

    gradient: tuple[Collective, ...]
    others: tuple[Collective, ...]
    by_optimizer: bool    # False: no optimizer all-reduce was seen, the largest was taken

    @property
    def gradient_bytes(self) -> int:
        return sum(c.nbytes for c in self.gradient)

    def stamps(self, t_begin: Any) -> dict[str, Any]:
        """The step output's timing entries (tensors), keyed as ``split_timing`` reads them."""
        out = {T_BEGIN: t_begin, T_GRAD_START: self.gradient[0].t0,
               T_GRAD_END: self.gradient[-1].t1}
        for i, c in enumerate(self.others):
            out[f"{_OTHER_START}{i}"] = c.t0
            out[f"{_OTHER_END}{i}"] = c.t1
        return out

    def describe(self) -> str:
        """For the Run's note: how the gradient all-reduce was told from the others."""
        what = (f"{count(len(self.others), 'other collective')} per step (SyncBatchNormalization's "
                "batch statistics, for example) are other_collective_ms, left out of "
                "compute_ms and allreduce_ms")
        how = ("the one the optimizer makes in apply_gradients" if self.by_optimizer else
               "no optimizer all-reduce was seen, so the collective carrying the most bytes")
        return (f"{what}; allreduce_ms and the bus bandwidth are the gradient all-reduce only "
                f"({how}; {self.gradient_bytes} bytes per replica)")


def attribute(collectives: Sequence[Collective]) -> Attribution:
    """Split a traced step's collectives (in trace order, at least one)."""
    chosen = [c for c in collectives if c.gradient]
    by_optimizer = bool(chosen)
    if not chosen:
        largest = max(range(len(collectives)), key=lambda i: (collectives[i].nbytes, i))
        chosen = [collectives[largest]]
    others = tuple(c for c in collectives if not any(c is g for g in chosen))
    return Attribution(tuple(chosen), others, by_optimizer)


def split_timing(values: dict[str, Any]) -> dict[str, list[float]]:
    """Per replica, from a step's output arrays (seconds): the timing columns in ms."""
    import numpy as np

    begin, start, end = (np.asarray(values[k], dtype=np.float64)
                         for k in (T_BEGIN, T_GRAD_START, T_GRAD_END))
    n_other = sum(1 for k in values if k.startswith(_OTHER_START))
    other = np.array([[values[f"{_OTHER_START}{i}"], values[f"{_OTHER_END}{i}"]]
                      for i in range(n_other)], dtype=np.float64).reshape(n_other, 2, len(begin))
    last_arrival = float(start.max())
    compute, others = [], []
    for r in range(len(begin)):
        spans = _merged(other[:, :, r])
        others.append(sum(e - s for s, e in spans) * 1e3)
        inside = sum(max(0.0, min(e, start[r]) - max(s, begin[r])) for s, e in spans)
        compute.append(float(np.maximum(0.0, (start[r] - begin[r] - inside) * 1e3)))
    return {   # NaN stays NaN (np.maximum): a step whose gradient all-reduce did not run
        "compute_ms": compute,
        "wait_ms": ((last_arrival - start) * 1e3).tolist(),
        "allreduce_ms": [float(np.maximum(0.0, (e - last_arrival) * 1e3)) for e in end],
        "other_collective_ms": others,
    }


def _merged(spans: Any) -> list[tuple[float, float]]:
    """Intervals ``[[start, end], ...]`` merged where they overlap (collectives that do not
    depend on each other may run at the same time: their time counts once)."""
    out: list[list[float]] = []
    for s, e in sorted((float(s), max(float(s), float(e))) for s, e in spans):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]
