"""In-graph instrumentation of a per-replica step: loss, gradient norm, allreduce timing.

The generated step calls ``probe.begin(batch)`` first and returns ``probe.end(loss, grads)``.
A timed probe also brackets every ``ReplicaContext.all_reduce`` the step makes (Keras
optimizers all-reduce gradients inside ``apply_gradients``; SyncBatchNormalization
all-reduces batch statistics) with ``tf.timestamp`` ops ordered by control dependencies, and
notes which were made by an optimizer applying gradients: ``collectives`` tells the gradient
all-reduce from the others. Those ops serialise the step a little, so the runner compiles a
timed and an untimed variant and times only every k-th step.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

from ..errors import LossError, LossNotScalar, StepCodeError
from ..patching import patched
from .collectives import Attribution, Collective, attribute
from .lossform import LossForm, read_loss_form


class StepProbe:
    """The runtime object a generated step function talks to (one per compiled variant)."""

    def __init__(self, *, timed: bool, loss_name: str = "loss", grads_name: str | None = None):
        import tensorflow as tf

        # The step calls these from AutoGraph-converted code: keep them plain Python, so
        # tracing is quicker and our own errors reach the user unwrapped.
        self.begin = tf.autograph.experimental.do_not_convert(self._begin)
        self.end = tf.autograph.experimental.do_not_convert(self._end)
        self.timed = timed
        self.loss_name = loss_name
        self.grads_name = grads_name
        self.attribution: Attribution | None = None   # of the last traced replica
        #: how the traced loss adds up over the replicas (``lossform``; None: not read)
        self.loss_form: LossForm | None = None
        self._local = threading.local()  # MirroredStrategy traces each replica on its own thread

    # -- called from the generated step (at trace time) -----------------------------------
    def _begin(self, batch: Any = None) -> Any:
        import tensorflow as tf

        state = self._local
        state.reduces = []
        state.applying = 0    # > 0 inside an optimizer's apply: its all_reduce is the gradients'
        state.t_begin = None
        state.ops_before = len(tf.compat.v1.get_default_graph().get_operations())
        state.batch_size = _leading_dimension(batch)
        if not self.timed:
            return batch
        state.t_begin = tf.timestamp()
        if batch is None:
            return batch
        with tf.control_dependencies([state.t_begin]):
            return tf.nest.map_structure(_identity, batch)

    def _end(self, loss: Any, grads: Any = None) -> dict[str, Any]:
        import tensorflow as tf

        out: dict[str, Any] = {"loss": self._scalar_loss(loss)}
        form = self._read_loss_form(loss)
        if form is not None and form.reduction == "mixed":
            out["loss"] = form.share()   # its share of the global loss (``lossform``)
        if grads is not None:
            out["grad_norm"] = tf.linalg.global_norm(self._grad_list(grads))
        state = self._local
        if self.timed and getattr(state, "reduces", None):
            self.attribution = attribute(state.reduces)
            out.update(self.attribution.stamps(state.t_begin))
        state.reduces = None
        return out

    @property
    def allreduce_bytes(self) -> int:
        """Bytes each replica contributes to the gradient all-reduce (0: none traced)."""
        return self.attribution.gradient_bytes if self.attribution else 0

    # -- all_reduce hook -------------------------------------------------------------------
    @contextlib.contextmanager
    def hooked(self) -> Iterator[None]:
        """Time every ``ReplicaContext.all_reduce`` traced inside this context."""
        import tensorflow as tf

        cls = tf.distribute.ReplicaContext
        original = cls.all_reduce
        probe = self

        def timed_all_reduce(ctx: Any, reduce_op: Any, value: Any, options: Any = None) -> Any:
            reduces = getattr(probe._local, "reduces", None)
            if reduces is None:   # an all_reduce outside our step: leave it alone
                return original(ctx, reduce_op, value, options)
            tensors = [v for v in tf.nest.flatten(value) if isinstance(v, tf.Tensor)]
            with tf.control_dependencies(tensors):
                t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                value = tf.nest.map_structure(_identity, value)
            result = original(ctx, reduce_op, value, options)
            with tf.control_dependencies(
                [v for v in tf.nest.flatten(result) if isinstance(v, tf.Tensor)]
            ):
                t1 = tf.timestamp()
            gradient = getattr(probe._local, "applying", 0) > 0
            probe._record(reduces, t0, t1, tensors, gradient=gradient)
            return result

        with (patched([(cls, "all_reduce", timed_all_reduce), *self._keras_apply()]),
              self._tf_keras_hooked()):
            yield

    def _keras_apply(self) -> list[tuple[type, str, Any]]:
        """Mark what a Keras 3 optimizer all-reduces while it applies gradients
        (``apply_gradients`` calls ``apply``) as the gradient all-reduce."""
        if "keras" not in sys.modules:   # a step can only use Keras if it is imported already
            return []
        import keras

        cls = keras.optimizers.Optimizer
        original = cls.apply
        state = self._local

        def apply(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            state.applying = getattr(state, "applying", 0) + 1
            try:
                return original(optimizer, *args, **kwargs)
            finally:
                state.applying -= 1

        return [(cls, "apply", apply)]

    @contextlib.contextmanager
    def _tf_keras_hooked(self) -> Iterator[None]:
        """Also time tf_keras optimizers' gradient aggregation (the Keras of multiworker
        workers), which reaches the collective through ``merge_call``, not ``all_reduce``."""
        from .fitreduce import optimizer_methods

        # A step can only use a tf_keras optimizer if tf_keras is imported already.
        found = optimizer_methods() if "tf_keras" in sys.modules else "not imported"
        if isinstance(found, str):   # tf_keras absent or untested: nothing to hook
            yield
            return
        with patched((cls, name, self._timed_aggregation(getattr(cls, name)))
                     for cls, name in found):
            yield

    def _timed_aggregation(self, original: Any) -> Any:
        from .fitreduce import timed_aggregation

        probe = self

        def aggregate(optimizer: Any, grads_and_vars: Any) -> Any:
            import tensorflow as tf

            state = probe._local
            reduces = getattr(state, "reduces", None)
            if reduces is None:   # outside our step
                return original(optimizer, grads_and_vars)
            state.reduces = None   # an all_reduce inside is this same collective: not twice
            try:
                t0, t1, reduced, tensors = timed_aggregation(original, optimizer, grads_and_vars)
            finally:
                state.reduces = reduces
            probe._record(reduces, t0, t1, tensors, gradient=True)
            with tf.control_dependencies([t1]):
                return [(_identity(g), v) for g, v in reduced]

        return aggregate

    def _record(self, reduces: list[Any], t0: Any, t1: Any, tensors: list[Any], *,
                gradient: bool) -> None:
        """One timed collective of this step: its stamps, the bytes it carried, and whether
        an optimizer made it while applying gradients."""
        nbytes = sum(_nbytes(t) for t in tensors if hasattr(t, "shape"))
        reduces.append(Collective(t0, t1, nbytes, gradient))

    def _read_loss_form(self, loss: Any) -> LossForm | None:
        """How the loss just traced adds up over the replicas in sync (kept as
        ``loss_form``); None with one replica, where it is the batch's loss as it is."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        if replicas <= 1:
            return None
        self.loss_form = read_loss_form(loss, replicas, getattr(self._local, "batch_size", None))
        return self.loss_form

    # -- checks ----------------------------------------------------------------------------
    def _differentiated(self) -> bool:
        """Whether the step traced so far took gradients (``tape.gradient``, ``tf.gradients``,
        also inside functions the cell calls): the ops they make are named for them."""
        import tensorflow as tf

        ops = tf.compat.v1.get_default_graph().get_operations()
        made = ops[getattr(self._local, "ops_before", 0):]
        return any("gradient_tape/" in op.name or op.name.startswith("gradients")
                   or "/gradients/" in op.name for op in made)

    def _scalar_loss(self, loss: Any) -> Any:
        import tensorflow as tf

        if isinstance(loss, (str, bytes)) or (
                isinstance(loss, tf.Tensor) and loss.dtype == tf.string):
            shown = repr(loss) if isinstance(loss, (str, bytes)) else "a string tensor"
            raise LossError(
                f"the loss must be a tensor or number computed from the batch; {shown} is a "
                f"{type(loss).__name__ if isinstance(loss, (str, bytes)) else 'tf.string'}. "
                "A loss's name is what `model.compile(loss=...)` takes; in a step, call the "
                f"loss function on the batch: `{self.loss_name} = tf.reduce_mean("
                "tf.keras.losses.mean_squared_error(y, model(x)))`.")
        try:
            loss = tf.convert_to_tensor(loss)
        except (TypeError, ValueError) as err:
            raise LossError(
                f"the loss must be a tensor or number computed from the batch; "
                f"`{self.loss_name}` is a {type(loss).__name__}. Assign the step's loss to "
                "it, e.g. `loss = tf.nn.compute_average_loss(...)`."
            ) from err
        if loss.shape.rank is None:   # unknown until it runs: report the mean of its values
            return tf.reduce_mean(tf.cast(loss, tf.float32))
        if loss.shape.num_elements() != 1 and not self._differentiated():
            # a step that only evaluates (no gradients): any shape, its mean is recorded
            return tf.reduce_mean(tf.cast(loss, tf.float32))
        if loss.shape.num_elements() != 1:   # one value per example, not one per replica
            raise LossNotScalar(
                f"`{self.loss_name}` has shape {loss.shape}, not one value: differentiating "
                "it trains on the sum of its values, and nbdist would report their mean, so "
                "the step would train silently on a loss it does not show. Reduce it to one "
                f"value per replica: `{self.loss_name} = tf.nn.compute_average_loss("
                "per_example_loss, global_batch_size=GLOBAL_BATCH)` (what TensorFlow's "
                "distributed tutorials do) or `tf.reduce_mean(...)`.")
        if not loss.dtype.is_floating:
            loss = tf.cast(loss, tf.float32)
        return tf.reshape(loss, ())

    def _grad_list(self, grads: Any) -> list[Any]:
        import tensorflow as tf

        name = self.grads_name or "grads"
        if not isinstance(grads, (list, tuple)):
            raise StepCodeError(
                f"`{name}` must be a list of gradient tensors (what `tape.gradient(loss, "
                f"model.trainable_variables)` returns), got {type(grads).__name__}. Pass the "
                "right variable with --grads NAME, or leave gradient norms out."
            )
        kept = [g for g in grads if g is not None]
        bad = [type(g).__name__ for g in kept
               if not isinstance(g, (tf.Tensor, tf.IndexedSlices, tf.Variable))]
        if bad or not kept:
            what = f"it holds {sorted(set(bad))}" if bad else "every entry is None"
            raise StepCodeError(
                f"`{name}` must be a list of gradient tensors, but {what}. Check that the "
                "loss depends on the variables you differentiate, or pass --grads NAME."
            )
        return kept


def _identity(value: Any) -> Any:
    import tensorflow as tf

    return tf.identity(value) if isinstance(value, tf.Tensor) else value


def _leading_dimension(batch: Any) -> int | None:
    """The static leading dimension of the batch's first tensor (this replica's batch size),
    or None."""
    import tensorflow as tf

    for value in tf.nest.flatten(batch):
        shape = getattr(value, "shape", None)
        if shape is not None and shape.rank:
            return shape[0] if isinstance(shape[0], int) else None
    return None


def _nbytes(tensor: Any) -> int:
    n = tensor.shape.num_elements()
    return int(n * tensor.dtype.size) if n is not None else 0
