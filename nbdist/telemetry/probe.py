"""In-graph instrumentation of a per-replica step: loss, gradient norm, allreduce timing.

The generated step calls ``probe.begin(batch)`` first and returns ``probe.end(loss, grads)``;
the function that runs it on the replicas traces it inside ``probe.tracing()``.

A timed probe also brackets every ``ReplicaContext.all_reduce`` the step makes (Keras
optimizers all-reduce gradients inside ``apply_gradients``; SyncBatchNormalization
all-reduces batch statistics) with ``tf.timestamp`` ops ordered by control dependencies, and
notes which were made by an optimizer applying gradients: ``collectives`` tells the gradient
all-reduce from the others. Those ops serialise the step a little, so the runner compiles a
timed and an untimed variant and times only every k-th step.

A loss scale optimizer (mixed precision) applies gradients in a ``merge_call``: its inner
optimizer runs in threads of its own, one per replica, inside a ``tf.cond`` that skips steps
whose gradients are not finite. The probe finds a replica's state there by its replica id;
the stamps of a collective made inside such a branch cannot leave it as tensors, so they go
through a per-replica variable (``BranchStamps``) that the step reads at its end (NaN on a
step the branch skipped).

Gradients of a scaled loss (``scale_loss`` of a Keras optimizer, ``get_scaled_loss`` of a
tf_keras one) are the true ones times the loss scale: while tracing, the probe notes which
tensors those methods return and which gradients ``GradientTape.gradient`` takes of them.
When the gradients the cell names are those, their norm is divided by that step's scale, and
the step also returns the scale (``loss_scale_factor``).
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
from .rows import LOSS_SCALE_FACTOR


class _ReplicaTrace:
    """What one replica's trace of the step has seen so far."""

    def __init__(self, graph: Any, ops_before: int):
        self.graph = graph              # the step's graph: stamps made elsewhere cannot leave
        self.ops_before = ops_before
        self.reduces: list[Collective] = []
        self.applying = 0               # > 0 inside an optimizer's apply: its all_reduce is the
        #                                 gradients'
        self.aggregating = False        # inside a tf_keras aggregation, which is timed whole
        self.t_begin: Any = None
        self.batch_size: Any = None     # the replica's examples (a tensor): empty-batch causes
        self.branch_stamps = False      # a collective left its stamps in ``BranchStamps``
        self.scaled_losses: dict[int, tuple[Any, Any]] = {}   # id -> (scaled loss, scale)
        self.scaled_grads: dict[int, tuple[Any, Any]] = {}    # id -> (gradient, scale)
        self.scale: Any = None          # the first scale the step scaled a loss by


class BranchStamps:
    """A per-replica pair of timestamps a collective traced inside a branch (``tf.cond``)
    writes and the step reads at its end, then sets to NaN again."""

    def __init__(self, strategy: Any):
        import tensorflow as tf

        with strategy.scope():
            self.variable = tf.Variable(
                tf.fill([2], tf.constant(float("nan"), tf.float64)), trainable=False,
                name="nbdist_branch_stamps",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.NONE)

    def write(self, t0: Any, t1: Any) -> None:
        import tensorflow as tf

        self.variable.assign(tf.stack([t0, t1]))

    def take(self) -> tuple[Any, Any]:
        """In the step's graph: the pair written (NaN if none was), and clear it."""
        import tensorflow as tf

        pair = tf.identity(self.variable.read_value())
        with tf.control_dependencies([pair]):
            self.variable.assign(tf.fill([2], tf.constant(float("nan"), tf.float64)))
        return pair[0], pair[1]

#: The step's output holding the replica's batch size: the examples its batch really held
#: (``data.batchsizes`` explains an empty or short one).
BATCH_SIZE = "batch_size"


class StepProbe:
    """The runtime object a generated step function talks to (one per compiled variant).

    ``strategy``: a timed probe given one can time a collective traced inside a branch
    (``BranchStamps``, made here: call it where variables may be created, not while tracing).
    """

    def __init__(self, *, timed: bool, loss_name: str = "loss", grads_name: str | None = None,
                 strategy: Any = None):
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
        #: the last trace's gradients were of a scaled loss: their norm was divided by the scale
        self.unscaled = False
        self.branch_stamps = BranchStamps(strategy) if timed and strategy is not None else None
        self._local = threading.local()  # MirroredStrategy traces each replica on its own thread
        self._replicas: dict[int, _ReplicaTrace] = {}   # replica id -> its trace under way

    # -- called from the generated step (at trace time) -----------------------------------
    def _begin(self, batch: Any = None) -> Any:
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        state = _ReplicaTrace(graph, len(graph.get_operations()))
        self._local.state = state
        replica = _replica_id()
        if replica is not None:
            self._replicas[replica] = state
        state.batch_size = _batch_size(batch)   # a tensor: each replica's examples
        self._local.static_batch_size = _leading_dimension(batch)
        if not self.timed:
            return batch
        state.t_begin = tf.timestamp()
        if batch is None:
            return batch
        with tf.control_dependencies([state.t_begin]):
            return tf.nest.map_structure(_identity, batch)

    def _end(self, loss: Any, grads: Any = None) -> dict[str, Any]:
        import tensorflow as tf

        state = self._state()
        out: dict[str, Any] = {"loss": self._scalar_loss(loss)}
        form = self._read_loss_form(loss)
        if form is not None and form.reduction == "mixed":
            out["loss"] = form.share()   # its share of the global loss (``lossform``)
        if grads is not None:
            kept = self._grad_list(grads)
            norm = tf.cast(tf.linalg.global_norm(kept), tf.float32)
            scale = _common_scale(kept, state.scaled_grads) if state is not None else None
            self.unscaled = scale is not None
            out["grad_norm"] = norm / scale if scale is not None else norm
        if state is not None and state.scale is not None:
            out[LOSS_SCALE_FACTOR] = state.scale
        if state is not None and getattr(state, "batch_size", None) is not None:
            out[BATCH_SIZE] = state.batch_size
        if self.timed and state is not None and state.reduces:
            if state.branch_stamps and self.branch_stamps is not None:
                t0, t1 = self.branch_stamps.take()
                state.reduces = [Collective(t0, t1, c.nbytes, c.gradient) if c.t0 is None
                                 else c for c in state.reduces]
            self.attribution = attribute(state.reduces)
            out.update(self.attribution.stamps(state.t_begin))
        self._forget(state)
        return out

    @property
    def allreduce_bytes(self) -> int:
        """Bytes each replica contributes to the gradient all-reduce (0: none traced)."""
        return self.attribution.gradient_bytes if self.attribution else 0

    # -- the replica's state ---------------------------------------------------------------
    def _state(self) -> _ReplicaTrace | None:
        """The trace under way of the replica calling: its thread's, or, in a thread a
        ``merge_call`` started for it (a loss scale optimizer's apply), its replica id's."""
        state = getattr(self._local, "state", None)
        if state is None:
            replica = _replica_id()
            state = self._replicas.get(replica) if replica is not None else None
        return state

    def _forget(self, state: _ReplicaTrace | None) -> None:
        self._local.state = None
        for replica, known in list(self._replicas.items()):
            if known is state:
                del self._replicas[replica]

    # -- hooks, while the step is traced ---------------------------------------------------
    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Wrap the tracing of ``strategy.run(step)``: note scaled losses and their gradients;
        a timed probe also times every ``ReplicaContext.all_reduce`` traced."""
        changes = self._scaling()
        if self.timed:
            changes += [self._timed_all_reduce(), *self._keras_apply()]
        with patched(changes), (self._tf_keras_hooked() if self.timed
                                else contextlib.nullcontext()):
            yield

    def _timed_all_reduce(self) -> tuple[type, str, Any]:
        import tensorflow as tf

        cls = tf.distribute.ReplicaContext
        original = cls.all_reduce
        probe = self

        def timed_all_reduce(ctx: Any, reduce_op: Any, value: Any, options: Any = None) -> Any:
            state = probe._state()
            if state is None or state.aggregating:   # not ours, or timed by the aggregation
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
            probe._record(state, t0, t1, tensors, gradient=state.applying > 0)
            return result

        return cls, "all_reduce", timed_all_reduce

    def _keras_apply(self) -> list[tuple[type, str, Any]]:
        """Mark what a Keras 3 optimizer all-reduces while it applies gradients
        (``apply_gradients`` calls ``apply``; a ``LossScaleOptimizer``'s inner optimizer's
        ``apply``) as the gradient all-reduce."""
        if "keras" not in sys.modules:   # a step can only use Keras if it is imported already
            return []
        import keras

        cls = keras.optimizers.Optimizer
        original = cls.apply
        probe = self

        def apply(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            state = probe._state()
            if state is None:
                return original(optimizer, *args, **kwargs)
            state.applying += 1
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

            state = probe._state()
            if state is None or state.aggregating:   # outside our step, or timed already
                return original(optimizer, grads_and_vars)
            state.aggregating = True   # an all_reduce inside is this same collective: not twice
            try:
                t0, t1, reduced, tensors = timed_aggregation(original, optimizer, grads_and_vars)
            finally:
                state.aggregating = False
            probe._record(state, t0, t1, tensors, gradient=True)
            with tf.control_dependencies([t1]):
                return [(_identity(g), v) for g, v in reduced]

        return aggregate

    def _record(self, state: _ReplicaTrace, t0: Any, t1: Any, tensors: list[Any], *,
                gradient: bool) -> None:
        """One timed collective of this step: its stamps, the bytes it carried, and whether
        an optimizer made it while applying gradients. Traced inside a branch, the step cannot
        return its stamps: a gradient one leaves them in ``branch_stamps`` (one per step)."""
        import tensorflow as tf

        nbytes = sum(_nbytes(t) for t in tensors if hasattr(t, "shape"))
        if tf.compat.v1.get_default_graph() is state.graph:
            state.reduces.append(Collective(t0, t1, nbytes, gradient))
        elif gradient and self.branch_stamps is not None and not state.branch_stamps:
            self.branch_stamps.write(t0, t1)
            state.branch_stamps = True
            state.reduces.append(Collective(None, None, nbytes, gradient))   # read at the end

    # -- loss scaling ----------------------------------------------------------------------
    def _scaling(self) -> list[tuple[type, str, Any]]:
        """Wrappers noting the losses optimizers scale (``hooks.keras.loss_scalers``,
        ``hooks.tf_keras.loss_scalers``) and the gradients taken of them."""
        import tensorflow as tf

        scalers: list[tuple[type, str, Any]] = []
        if "keras" in sys.modules:   # a step can only scale with Keras if it is imported
            from ..hooks.keras import loss_scalers

            scalers += loss_scalers()
        if "tf_keras" in sys.modules:
            from ..hooks.tf_keras import loss_scalers as tf_keras_scalers

            found = tf_keras_scalers()
            scalers += [] if isinstance(found, str) else found
        if not scalers:
            return []
        changes = [(cls, name, self._noting_scaled(getattr(cls, name), factor))
                   for cls, name, factor in scalers]
        return [*changes, (tf.GradientTape, "gradient",
                           self._noting_gradients(tf.GradientTape.gradient))]

    def _noting_scaled(self, original: Any, factor: Any) -> Any:
        import tensorflow as tf

        probe = self

        def scale_loss(optimizer: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
            scaled = original(optimizer, loss, *args, **kwargs)
            state = probe._state()
            scale = factor(optimizer) if state is not None else None
            if scale is not None and isinstance(scaled, tf.Tensor) and scaled is not loss:
                scale = tf.cast(scale, tf.float32)
                state.scaled_losses[id(scaled)] = (scaled, scale)
                if state.scale is None:
                    state.scale = scale
            return scaled

        return tf.autograph.experimental.do_not_convert(scale_loss)

    def _noting_gradients(self, original: Any) -> Any:
        import tensorflow as tf

        probe = self

        def gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(tape, target, sources, *args, **kwargs)
            state = probe._state()
            entry = state.scaled_losses.get(id(target)) if state is not None else None
            if entry is not None and entry[0] is target:
                for g in tf.nest.flatten(result):
                    if g is not None:
                        state.scaled_grads[id(g)] = (g, entry[1])
            return result

        return tf.autograph.experimental.do_not_convert(gradient)

    def _read_loss_form(self, loss: Any) -> LossForm | None:
        """How the loss just traced adds up over the replicas in sync (kept as
        ``loss_form``); None with one replica, where it is the batch's loss as it is."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        if replicas <= 1:
            return None
        static = getattr(self._local, "static_batch_size", None)
        self.loss_form = read_loss_form(loss, replicas, static)
        return self.loss_form

    # -- checks ----------------------------------------------------------------------------
    def _differentiated(self) -> bool:
        """Whether the step traced so far took gradients (``tape.gradient``, ``tf.gradients``,
        also inside functions the cell calls): the ops they make are named for them."""
        import tensorflow as tf

        ops = tf.compat.v1.get_default_graph().get_operations()
        state = self._state()
        made = ops[state.ops_before if state is not None else 0:]
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


def _replica_id() -> int | None:
    """The calling replica's id in its sync group, when known while tracing (None outside a
    replica context or when not a constant)."""
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        return None
    value = tf.get_static_value(ctx.replica_id_in_sync_group)
    return None if value is None else int(value)


def _common_scale(grads: list[Any], scaled: dict[int, tuple[Any, Any]]) -> Any:
    """The scale every one of ``grads`` was taken of a loss scaled by (the same one for all),
    else None."""
    entries = [scaled.get(id(g)) for g in grads]
    if not entries or any(e is None or e[0] is not g for e, g in zip(entries, grads, strict=True)):
        return None
    scales = {id(e[1]) for e in entries}
    return entries[0][1] if len(scales) == 1 else None


def _batch_size(batch: Any) -> Any:
    """In the traced step: the size of ``batch``'s first dimension (the examples it holds),
    from its first component that has one; None for a batch without any."""
    import tensorflow as tf

    for part in tf.nest.flatten(batch):
        if isinstance(part, tf.RaggedTensor):
            return part.nrows()
        if isinstance(part, tf.SparseTensor):
            return part.dense_shape[0]
        shape = getattr(part, "shape", None)
        if isinstance(part, tf.Tensor) and shape is not None and shape.rank:
            return tf.shape(part, out_type=tf.int64)[0]
    return None
