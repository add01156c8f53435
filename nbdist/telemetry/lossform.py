"""How a step's loss adds up across replicas, read from the graph TensorFlow traced for it.

Under a strategy each replica computes the cell's loss on its slice of the global batch. What
the same expression gives on the whole global batch, on one device, depends on how the loss
reduces, and the cell's text does not tell: a Keras 3 loss object (and ``model.compute_loss``)
multiplies its value by ``1 / num_replicas_in_sync`` inside ``strategy.run``;
``tf.nn.compute_average_loss`` divides the batch's sum by the global batch; ``tf.reduce_mean``
divides by nothing; ``tf.reduce_sum`` sums the replica's batch; a regularization term (``sum(
model.losses)``) is the same on every replica. So the loss's scalar tail (the ops after the
reduction over the batch) is walked at trace time, term by term (``a + b - c``), and each term
is put in one of four kinds:

- ``divided``: returned by a call that divides by the replicas (Keras 3 and tf_keras losses
  and ``compute_loss``, ``tf.nn.compute_average_loss``, ``tf.nn.scale_regularization_loss``:
  ``recording_divisions`` notes their results while the step traces, so a constant 0.5 in the
  cell is a weight, never "1/2 replicas"), or divided by a constant equal to the global batch:
  its replicas' values add up to the global batch's value;
- ``summed``: a sum over the replica's batch: the replicas' values add up as well;
- ``mean``: a mean over the replica's batch: the global value is the replicas' mean;
- ``same``: reads no data (variables and constants only): the same on every replica.

A loss whose terms are all ``divided``/``summed`` is reported as the sum of the replicas'
values, one whose terms are all ``mean``/``same`` as their mean. A loss that mixes them (a
Keras loss plus an undivided ``sum(model.losses)``) gets, per replica, its share of the global
loss (the mean-kind terms divided by N), summed over the replicas. A term whose kind cannot be
read (an opaque call, a constant divisor under an unknown batch size) leaves the decision to
the caller's fallback.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..patching import patched

#: Kinds whose replicas' values add up to the global value.
ADDING = frozenset(("divided", "summed"))
#: Kinds whose global value is the replicas' mean.
AVERAGING = frozenset(("mean", "same"))

_PASS = frozenset(("Identity", "Cast", "Squeeze", "Reshape", "StopGradient", "EnsureShape",
                   "ExpandDims", "PreventGradient"))
_DIVIDE = frozenset(("RealDiv", "Div", "DivNoNan", "TrueDiv"))
_DATA_SOURCES = frozenset(("IteratorGetNext", "IteratorGetNextSync", "OptionalGetValue",
                           "IteratorGetNextAsOptional", "MultiDeviceIteratorGetNextFromShard"))
_RTOL = 1e-3   # constants compared in the loss's dtype (1/3 in float16 is 0.33325)

#: (graph id, tensor name) -> words, for each value a library divided by the replicas or by
#: the global batch while ``recording_divisions`` is active (cleared when it ends)
_DIVIDED: dict[tuple[int, str], str] = {}
_DIVIDED_LOCK = threading.Lock()


@contextlib.contextmanager
def recording_divisions() -> Iterator[None]:
    """While a step is traced: note every value that Keras 3, tf_keras or TensorFlow divides
    by the replicas in sync (Keras loss objects and ``compute_loss``,
    ``tf.nn.compute_average_loss``, ``tf.nn.scale_regularization_loss``). A constant 0.5 in
    the cell's own loss is a weight, not a division by 2 replicas: only these calls say so."""
    changes: list[tuple[Any, str, Any]] = []
    sites: list[tuple[Any, str, str]] = []
    if "keras" in sys.modules:
        from ..hooks.keras import replica_scaling_site

        site = replica_scaling_site()
        if site:
            sites.append((*site, "a Keras loss, which Keras divides by the replicas"))
    if "tf_keras" in sys.modules:
        from ..hooks.tf_keras import replica_scaling_site as tf_keras_site

        site = tf_keras_site()
        if site:
            sites.append((*site, "a tf_keras loss, which tf_keras divides by the replicas"))
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        sites += [(tf.nn, "compute_average_loss",
                   "tf.nn.compute_average_loss, divided by the global batch"),
                  (tf.nn, "scale_regularization_loss",
                   "tf.nn.scale_regularization_loss, divided by the replicas")]
    for owner, name, words in sites:
        changes.append((owner, name, _noting(getattr(owner, name), words)))
    try:
        with patched(changes):
            yield
    finally:
        with _DIVIDED_LOCK:
            _DIVIDED.clear()


def _noting(original: Callable[..., Any], words: str) -> Callable[..., Any]:
    def divide(*args: Any, **kwargs: Any) -> Any:
        value = original(*args, **kwargs)
        graph, name = getattr(value, "graph", None), getattr(value, "name", None)
        if graph is not None and isinstance(name, str):
            with _DIVIDED_LOCK:
                _DIVIDED[(id(graph), name)] = words
        return value

    return divide


def _divided_by(tensor: Any) -> str | None:
    with _DIVIDED_LOCK:
        return _DIVIDED.get((id(tensor.graph), tensor.name))


@dataclass(frozen=True)
class Term:
    """One additive term of the loss: its tensor, its sign and its kind (or None)."""

    tensor: Any
    sign: float
    kind: str | None
    what: str   # how it reduces, in words, for notes


@dataclass(frozen=True)
class LossForm:
    """The terms of one traced per-replica loss and how they add up over ``replicas``."""

    replicas: int
    terms: tuple[Term, ...]

    @property
    def reduction(self) -> str | None:
        """``"sum"``, ``"mean"``, ``"mixed"``, or None when a term's kind is unknown."""
        kinds = {t.kind for t in self.terms}
        if None in kinds or not kinds:
            return None
        if kinds <= ADDING:
            return "sum"
        if kinds <= AVERAGING:
            return "mean"
        return "mixed"

    def share(self) -> Any:
        """This replica's share of the global loss (a scalar tensor; ``reduction`` known)."""
        import tensorflow as tf

        parts = []
        for term in self.terms:
            value = tf.cast(tf.reshape(term.tensor, ()), tf.float32) * term.sign
            parts.append(value if term.kind in ADDING else value / float(self.replicas))
        return tf.add_n(parts)

    def kinds(self, wanted: frozenset[str]) -> list[str]:
        """The words (``Term.what``) of the terms of the ``wanted`` kinds, in order, once."""
        return list(dict.fromkeys(t.what for t in self.terms if t.kind in wanted))


def read_loss_form(loss: Any, replicas: int, batch_size: int | None) -> LossForm | None:
    """The ``LossForm`` of the graph tensor ``loss`` computed in one replica of ``replicas``
    (``batch_size``: that replica's batch, when its leading dimension is static). None for an
    eager value or a loss that is not a scalar (nothing to read)."""
    import tensorflow as tf

    if not isinstance(loss, tf.Tensor) or not hasattr(loss, "op") or tf.executing_eagerly():
        return None
    if loss.shape.rank is None or loss.shape.num_elements() != 1:
        return None
    reader = _Reader(replicas, batch_size)
    return LossForm(replicas, tuple(reader.term(t, s) for t, s in _terms(loss, 1.0)))


def _terms(tensor: Any, sign: float) -> list[tuple[Any, float]]:
    """Split a scalar sum (``a + b``, ``add_n``, ``a - b``, ``-a``) into signed terms."""
    op = tensor.op
    if op.type in _PASS and op.inputs and _scalar(op.inputs[0]):
        return _terms(op.inputs[0], sign)
    if op.type in ("AddV2", "Add") and all(map(_scalar, op.inputs)):
        return _terms(op.inputs[0], sign) + _terms(op.inputs[1], sign)
    if op.type == "AddN" and all(map(_scalar, op.inputs)):
        return [part for x in op.inputs for part in _terms(x, sign)]
    if op.type == "Sub" and all(map(_scalar, op.inputs)):
        return _terms(op.inputs[0], sign) + _terms(op.inputs[1], -sign)
    if op.type == "Neg":
        return _terms(op.inputs[0], -sign)
    if op.type == "Sum" and op.inputs[0].op.type == "Pack" and all(
            map(_scalar, op.inputs[0].op.inputs)):   # sum(a list of scalars): Keras compute_loss
        return [part for x in op.inputs[0].op.inputs for part in _terms(x, sign)]
    return [(tensor, sign)]


def _scalar(tensor: Any) -> bool:
    return tensor.shape.rank is not None and tensor.shape.num_elements() == 1


class _Reader:
    """Walks one term's scalar tail down to the reduction over the batch."""

    def __init__(self, replicas: int, batch_size: int | None):
        self.replicas, self.batch_size = replicas, batch_size
        self._reads_data: dict[str, bool] = {}

    def term(self, tensor: Any, sign: float) -> Term:
        kind, what = self._kind(tensor, divided_by_batch=False)
        return Term(tensor, sign, kind, what)

    def _kind(self, tensor: Any, divided_by_batch: bool) -> tuple[str | None, str]:
        """(kind, words) of the scalar ``tensor``; ``divided_by_batch``: a division by the
        replica's batch size was passed on the way down (a sum below it is a mean)."""

        same = (None if self.reads_data(tensor)
                else ("same", "a term that reads no data, such as a regularization loss"))
        while True:
            words = _divided_by(tensor)
            if words is not None:
                return "divided", words
            op = tensor.op
            if op.type in _PASS and op.inputs:
                tensor = op.inputs[0]
                continue
            if op.type == "Mul" and len(op.inputs) == 2:
                constant, other = self._constant_and_other(op.inputs)
                if constant is None:
                    return None, f"a product computed by {op.type}"
                tensor = other   # a weight
                continue
            if op.type in _DIVIDE and len(op.inputs) == 2:
                numerator, denominator = op.inputs
                divisor = _static(denominator)
                if divisor is not None:
                    if self.batch_size is None:
                        return None, "a loss divided by a constant (the batch size is unknown)"
                    if _close(divisor, self.batch_size * self.replicas):
                        return "divided", "a loss divided by the global batch"
                    if _close(divisor, self.batch_size):
                        divided_by_batch = True
                    tensor = numerator
                    continue
                if self._multiplies_by_replicas(denominator):
                    return "divided", ("a loss divided by the global batch, as "
                                       "tf.nn.compute_average_loss does")
                if self.reads_data(denominator) or _reads_shape(denominator):
                    divided_by_batch = True   # the batch's size, or its summed weights
                    tensor = numerator
                    continue
                tensor = numerator   # divided by a variable: a weight
                continue
            if same is not None:   # not divided by the replicas on the way down
                return same
            if op.type == "Mean" and op.inputs:
                return "mean", "a mean over each replica's batch, as tf.reduce_mean gives"
            if op.type == "Sum" and op.inputs:
                if divided_by_batch:
                    return "mean", "a mean over each replica's batch"
                return "summed", "a sum over each replica's batch, as tf.reduce_sum gives"
            return None, f"a value computed by {op.type}"

    def _constant_and_other(self, inputs: Any) -> tuple[float | None, Any]:

        for i in (0, 1):
            value = _static(inputs[i])
            if value is not None:
                return value, inputs[1 - i]
        # neither is a constant: a product with a term that reads no data is a weight too
        for i in (0, 1):
            if not self.reads_data(inputs[i]):
                return 1.0, inputs[1 - i]
        return None, None

    def _multiplies_by_replicas(self, tensor: Any) -> bool:
        """Whether the scalar ``tensor`` is computed by multiplying with N (the global batch
        of ``compute_average_loss``: the replica's batch x ``num_replicas_in_sync``)."""

        for op in _scalar_ancestors(tensor):
            if op.type == "Mul" and len(op.inputs) == 2:
                for x in op.inputs:
                    value = _static(x)
                    if value is not None and _close(value, self.replicas):
                        return True
        return False

    def reads_data(self, tensor: Any) -> bool:
        """Whether ``tensor`` depends on the step's input (a non-resource placeholder of the
        function or an iterator's output), not only on variables and constants."""
        import tensorflow as tf

        name = tensor.name
        if name in self._reads_data:
            return self._reads_data[name]
        seen, queue, found = set(), deque([tensor.op]), False
        while queue and not found:
            op = queue.popleft()
            if op.name in seen:
                continue
            seen.add(op.name)
            if op.type in ("ReadVariableOp", "VarHandleOp", "Const"):
                continue
            if op.type in _DATA_SOURCES or (op.type == "Placeholder"
                                            and op.outputs[0].dtype != tf.resource):
                found = True
            queue.extend(x.op for x in op.inputs)
        self._reads_data[name] = found
        return found


def _scalar_ancestors(tensor: Any) -> list[Any]:
    """The ops of the scalar computation that produced ``tensor`` (stopping at non-scalars)."""
    out, seen, queue = [], set(), deque([tensor])
    while queue:
        t = queue.popleft()
        if t.op.name in seen or not _scalar(t):
            continue
        seen.add(t.op.name)
        out.append(t.op)
        queue.extend(t.op.inputs)
    return out


def _reads_shape(tensor: Any) -> bool:
    return any(op.type in ("Shape", "Size", "ShapeN") or any(
        x.op.type in ("Shape", "Size", "ShapeN") for x in op.inputs)
        for op in _scalar_ancestors(tensor))


def _static(tensor: Any) -> float | None:
    """The value of a scalar computed from constants only (TensorFlow's constant folding,
    plus the product of a constant shape that Keras divides by), else None."""
    import numpy as np
    import tensorflow as tf

    value = tf.get_static_value(tensor)
    if value is not None:
        return _scalar_value(value)
    op = tensor.op
    if op.type in _PASS and op.inputs:
        return _static(op.inputs[0])
    if op.type == "Prod" and op.inputs:
        dims = tf.get_static_value(op.inputs[0])
        return None if dims is None else float(np.prod(dims))
    if op.type == "Mul" and len(op.inputs) == 2:
        a, b = (_static(x) for x in op.inputs)
        return None if a is None or b is None else a * b
    if op.type == "StridedSlice" and op.get_attr("shrink_axis_mask") == 1:
        vector, begin = (tf.get_static_value(x) for x in op.inputs[:2])
        if vector is not None and begin is not None and np.ndim(vector) == 1 \
                and np.size(begin) == 1 and -len(vector) <= int(begin[0]) < len(vector):
            return float(vector[int(begin[0])])   # tf.shape(x)[0] of a static shape
    return None


def _scalar_value(value: Any) -> float | None:
    import numpy as np

    array = np.asarray(value)
    if array.size != 1 or not np.issubdtype(array.dtype, np.number):
        return None
    return float(array.reshape(()))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _RTOL * max(abs(a), abs(b), 1e-12)


#: step cell text -> whether its replicas' losses add up to the global loss, as the last run
#: of it in this kernel traced it (``%distribute export`` reduces its printed loss the same way)
_ADDS_UP: dict[str, bool] = {}


def remember_reduction(cell: str, loss_scale: int) -> None:
    """Keep what a run of the step cell ``cell`` decided (``Run.loss_scale``)."""
    _ADDS_UP[_body(cell)] = loss_scale > 1


def remembered_reduction(cell: str) -> bool | None:
    """Whether the replicas' losses of ``cell`` add up, as its last run traced it; None when
    no run of it traced on several replicas here."""
    return _ADDS_UP.get(_body(cell))


def _body(cell: str) -> str:
    """The cell's code without its ``%%distribute`` line (the traced step keeps it as a
    comment, the export's history does not)."""
    lines = cell.strip().splitlines()
    if lines and lines[0].lstrip("# ").startswith("%%distribute"):
        lines = lines[1:]
    return "\n".join(lines).strip()


def global_loss(form: LossForm | None, replicas: int, text_divides: bool) -> tuple[int, str | None]:
    """``Run.loss_scale`` for a step traced on ``replicas`` replicas in sync, and the note
    that says how the global loss comes from the replicas' losses (None: nothing to say).
    ``form``: the traced loss's (None: not read); ``text_divides``: the cell's text calls
    ``compute_average_loss`` or names a global batch (the fallback when the graph does not
    tell)."""
    if replicas <= 1:
        return 1, None
    n = replicas
    reduction = form.reduction if form is not None else None
    if reduction == "sum":
        how = "; ".join(form.kinds(ADDING))
        return n, (f"loss (global) is the sum of the {n} replicas' losses, which is what the "
                   "cell's loss gives on the whole global batch on one device. The loss is "
                   f"{how}; TensorFlow's tutorials report it the same way, with "
                   "strategy.reduce(SUM, per_replica_losses). The per-replica values are the "
                   "`loss` column of run.metrics")
    if reduction == "mean":
        if not form.kinds(frozenset(("mean",))):
            return 1, None   # it reads no data: the same value on every replica
        return 1, (f"loss (global) is the mean of the {n} replicas' losses, which is what the "
                   "cell's loss gives on the whole global batch on one device: it is a mean "
                   "over each replica's batch, not divided by the replicas "
                   "(tf.nn.compute_average_loss or a Keras loss would be), and the optimizer "
                   f"sums the replicas' gradients, so they are {n} times the gradients of that "
                   "mean")
    if reduction == "mixed":
        divided = "; ".join(form.kinds(ADDING))
        undivided = "; ".join(form.kinds(AVERAGING))
        return n, (f"loss (global) is the sum of the {n} replicas' shares of it, which is what "
                   "the cell's loss gives on the whole global batch on one device. Its terms "
                   f"add up differently over the replicas. Divided by them: {divided}. Not "
                   f"divided: {undivided}. So each replica's `loss` here is its share (the "
                   f"undivided terms divided by {n}). The optimizer sums the replicas' "
                   f"gradients, so the undivided terms weigh {n} times what they weigh on one "
                   "device: divide them by the replicas (tf.nn.scale_regularization_loss(...) "
                   "for model.losses) to train as one device would")
    unread = ("; ".join(t.what for t in form.terms if t.kind is None)
              if form is not None else "a value nbdist cannot read")
    if text_divides:
        return n, (f"loss (global) is the sum of the {n} replicas' losses: the cell divides "
                   "its loss by the global batch (it calls compute_average_loss or names a "
                   f"global batch), but nbdist could not read its graph to check ({unread})")
    return 1, (f"loss (global) is the mean of the {n} replicas' losses, which is the global "
               "batch's loss only if each replica's loss is a mean over its own batch: nbdist "
               f"could not read how the loss adds up over the replicas ({unread})")
