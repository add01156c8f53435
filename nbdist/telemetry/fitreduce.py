"""allreduce_ms for tf_keras ``model.fit`` (on multi-worker workers).

tf_keras all-reduces gradients inside its optimizer, where no callback can see it:

* ``tf_keras.optimizers.Optimizer.apply_gradients`` (the default optimizers)
  calls ``self.aggregate_gradients``, i.e. ``optimizers.utils.all_reduce_sum_gradients``,
  i.e. ``ReplicaContext.all_reduce(SUM, grads)``;
* the legacy ``optimizer_v2.OptimizerV2`` (``tf.keras.optimizers.legacy``) calls
  ``self._aggregate_gradients``, i.e. ``self.gradient_aggregator`` (the same function).

While a recorded fit runs, ``hooked`` wraps both methods: the wrapper brackets the
aggregation with ``tf.timestamp`` ops ordered by control dependencies (the first after every
gradient of this replica exists, the second after every reduced gradient does) and assigns
the pair to a per-replica (``ON_READ``) variable of the model's ``AllreduceClock``, which the
fit callback reads after each batch. The time includes waiting for the slowest worker to
reach the collective, like step mode's allreduce_ms under multiworker. The hook is traced
into the model's train function, so the clock is kept per model and reused by later fits.

The legacy method is private tf_keras API, found by ``nbdist.hooks.tf_keras``
(``gradient_aggregators``): the hook is installed only for the tf_keras versions in
``TESTED_TF_KERAS`` and when both methods exist; otherwise fit still runs and records, the
Run gets a note saying why allreduce_ms is empty.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import weakref
from collections.abc import Iterator
from typing import Any

from ..hooks import tf_keras as tf_keras_hooks
from ..patching import patched

#: tf_keras versions (major, minor) whose optimizers were checked to aggregate as above.
TESTED_TF_KERAS = ((2, 21),)
NOTE = ("allreduce_ms is tf_keras's gradient all-reduce inside the optimizer, timed on each "
        "worker from its gradients being ready to the reduced gradients (so it includes "
        "waiting for the slowest worker)")

_ACTIVE: AllreduceClock | None = None        # the clock of the fit being traced/run
_CLOCKS: weakref.WeakKeyDictionary[Any, AllreduceClock] = weakref.WeakKeyDictionary()


@functools.cache   # asked on every timed step; the package metadata lookup is slow
def _version() -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version("tf_keras")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _entry_points() -> list[tuple[type, str]] | str:
    """The two optimizer methods to hook, as (class, name), or why not."""
    version = _version()
    if version is None:
        return "tf_keras is not installed"
    if version[:2] not in TESTED_TF_KERAS:
        tested = ", ".join(f"{a}.{b}" for a, b in TESTED_TF_KERAS)
        return (f"tf_keras {version[0]}.{version[1]} is not a version nbdist's optimizer hook "
                f"was checked with ({tested})")
    return tf_keras_hooks.gradient_aggregators()


def optimizer_methods() -> list[tuple[type, str]] | str:
    """The tf_keras methods that aggregate gradients, as (class, name), or why not."""
    return _entry_points()


def unavailable_reason() -> str | None:
    """None if the hook can be installed, else why not (for the Run's note)."""
    found = _entry_points()
    return found if isinstance(found, str) else None


class AllreduceClock:
    """Per-replica ``[t_before, t_after]`` of the last gradient all-reduce, in seconds."""

    def __init__(self, strategy: Any):
        import tensorflow as tf

        self.strategy = strategy
        with strategy.scope():
            self.stamps = tf.Variable(
                tf.zeros([2], tf.float64), trainable=False, name="nbdist_allreduce_clock",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.NONE)

    def stamp(self, t0: Any, t1: Any) -> Any:
        """In the traced step (replica context): remember this replica's pair."""
        import tensorflow as tf

        return self.stamps.assign(tf.stack([t0, t1]))

    def reset(self) -> None:
        for var in self.strategy.experimental_local_results(self.stamps):
            var.assign([0.0, 0.0])

    def read_ms(self) -> list[float] | None:
        """The slowest local replica's last all-reduce, in ms; None if none was timed."""
        pairs = [v.numpy() for v in self.strategy.experimental_local_results(self.stamps)]
        spans = [(t1 - t0) * 1e3 for t0, t1 in pairs if t1 > 0]
        return [max(spans)] if spans else None


def clock_for(model: Any, strategy: Any) -> AllreduceClock:
    """The model's clock (made once: the hook is traced into the model's train function)."""
    clock = _CLOCKS.get(model)
    if clock is None or clock.strategy is not strategy:
        clock = _CLOCKS[model] = AllreduceClock(strategy)
    return clock


def timed_aggregation(original: Any, optimizer: Any, grads_and_vars: Any
                      ) -> tuple[Any, Any, list[Any], list[Any]]:
    """Call a tf_keras aggregation between two ``tf.timestamp`` ops: the first after this
    replica's gradients exist, the second after the reduced ones do. Returns ``(t0, t1,
    reduced grads_and_vars, the gradient tensors that went in)``."""
    import tensorflow as tf

    pairs = list(grads_and_vars)
    ready = [t for g, _ in pairs if g is not None
             for t in tf.nest.flatten(g, expand_composites=True)]
    with tf.control_dependencies(ready):
        t0 = tf.timestamp()
    with tf.control_dependencies([t0]):
        pairs = [(tf.identity(g) if isinstance(g, tf.Tensor) else g, v) for g, v in pairs]
    reduced = list(original(optimizer, pairs))
    done = [t for g, _ in reduced if g is not None
            for t in tf.nest.flatten(g, expand_composites=True)]
    with tf.control_dependencies(done):
        t1 = tf.timestamp()
    return t0, t1, reduced, ready


def _timed(original: Any) -> Any:
    def aggregate(optimizer: Any, grads_and_vars: Any) -> Any:
        clock = _ACTIVE
        if clock is None:
            return original(optimizer, grads_and_vars)
        import tensorflow as tf

        t0, t1, reduced, _ = timed_aggregation(original, optimizer, grads_and_vars)
        with tf.control_dependencies([clock.stamp(t0, t1)]):
            return [(tf.identity(g) if isinstance(g, tf.Tensor) else g, v) for g, v in reduced]

    return aggregate


@contextlib.contextmanager
def hooked(clock: AllreduceClock | None) -> Iterator[None]:
    """Time tf_keras's gradient all-reduce into ``clock`` while the block runs (a no-op
    when ``clock`` is None or the hook is unavailable)."""
    global _ACTIVE
    found = _entry_points()
    if clock is None or isinstance(found, str):
        yield
        return
    changes = [(cls, name, _timed(getattr(cls, name))) for cls, name in optimizer_methods()]
    with patched(changes):
        _ACTIVE = clock
        try:
            yield
        finally:
            _ACTIVE = None
