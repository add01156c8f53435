"""Keras 3 in step mode: lazily built optimizers and models, and BatchNormalization that is
not synchronized.

A Keras 3 optimizer creates its slot variables on its first ``apply_gradients``. Inside a
``tf.function`` under MirroredStrategy that first call fails deep in TensorFlow ("You must
feed a value for placeholder tensor"). A Keras 3 model without an ``Input`` (TensorFlow's
tutorial ``Sequential`` CNN) creates its weights on its first call: inside ``strategy.run``
that fails with errors that vary by run and leaves the model with empty variables.
``building_prebuild`` intercepts both builds during tracing, before anything is created,
aborts the trace, builds the object eagerly under the strategy's scope (an optimizer for its
variables, a model from the shapes and dtypes it was called with, symbolically: no data runs
through it) and lets the runner trace again. (``model.fit`` telemetry is ``fitrecord``.)

Keras 3's ``BatchNormalization`` under a multi-replica strategy normalises each replica's
batch with that replica's statistics and updates that replica's copy of its moving mean and
variance: the copies drift apart, and what is read and saved is replica 0's.
``unsynced_batchnorm`` finds the layers a traced step runs that way, for the Run's note.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from ..patching import patched
from ..words import count


class _NeedsBuild(Exception):
    """Raised inside a trace to abort it so an optimizer or a model can be built eagerly."""


@contextlib.contextmanager
def building_prebuild(pending: list[tuple[Any, Callable[[], Any]]]) -> Iterator[None]:
    """While active, an unbuilt Keras 3 optimizer or model first used inside a tf.function
    aborts the trace; ``pending`` gets ``(object, build)`` to run eagerly under the scope."""
    if "keras" not in sys.modules:   # a step can only use Keras if it is imported already:
        yield                        # importing it would lengthen a worker's cold start
        return
    import keras
    import tensorflow as tf

    optimizer_cls, model_cls = keras.optimizers.Optimizer, keras.Model
    build_optimizer, call_model = optimizer_cls.build, model_cls.__call__

    def build(self: Any, variables: Any) -> Any:
        if tf.inside_function() and not self.built:
            variables = list(variables)
            pending.append((self, lambda: self.build(variables)))   # the subclass's build
            raise _NeedsBuild()
        return build_optimizer(self, variables)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if tf.inside_function() and not self.built:
            inputs = symbolic_inputs((args, kwargs))
            pending.append((self, lambda: call_model(self, *inputs[0], **inputs[1])))
            raise _NeedsBuild()
        return call_model(self, *args, **kwargs)

    with patched([(optimizer_cls, "build", build), (model_cls, "__call__", call)]):
        yield


def symbolic_inputs(structure: Any) -> Any:
    """``structure`` with each tensor replaced by a ``keras.KerasTensor`` of its shape (batch
    dimension unknown) and dtype: calling a model on them builds it without running it."""
    import keras
    import tensorflow as tf

    def spec(value: Any) -> Any:
        if isinstance(value, tf.Tensor | tf.Variable) and value.shape.rank:
            return keras.KerasTensor((None, *value.shape[1:]), dtype=value.dtype.name)
        return value

    return tf.nest.map_structure(spec, structure)


def call_building_optimizers(
    make_fn: Callable[[], Callable[[Any], Any]], arg: Any, strategy: Any,
    first_call: Callable[[Any, Any], Any] | None = None,
) -> tuple[Callable[[Any], Any], Any]:
    """First call of a compiled step: build any Keras optimizer or model it would build (under
    ``strategy``'s scope), then run it (or ``first_call(fn, arg)``: e.g. only trace it).

    Returns the compiled function that ran and its result. After an aborted trace the function
    is compiled afresh, because variables created before the abort would otherwise linger in the
    half-finished tf.function.
    """
    call = first_call or (lambda fn, a: fn(a))
    tf_logger = logging.getLogger("tensorflow")
    for _ in range(8):  # one retry per optimizer or model the step uses
        fn = make_fn()
        pending: list[tuple[Any, Callable[[], Any]]] = []
        level = tf_logger.level
        # MirroredStrategy's thread coordinator logs our deliberate abort at INFO level.
        tf_logger.setLevel(max(level, logging.WARNING))
        try:
            with building_prebuild(pending):
                return fn, call(fn, arg)
        except _NeedsBuild:
            pass
        except Exception:  # MirroredStrategy may wrap a replica thread's exception
            if not pending:
                raise
        finally:
            tf_logger.setLevel(level)
        with strategy.scope():
            for obj, build in pending:
                if not obj.built:   # each replica thread of the trace may have asked
                    build()
    fn = make_fn()
    return fn, call(fn, arg)


def unsynced_batchnorm(found: list[str]) -> contextlib.AbstractContextManager[None]:
    """While active, each Keras 3 ``BatchNormalization`` layer called in training mode without
    ``synchronized=True`` adds its name to ``found`` (once)."""
    if "keras" not in sys.modules:   # a step can only use Keras if it is imported already
        return contextlib.nullcontext()
    import keras

    cls = keras.layers.BatchNormalization
    original = cls.call

    def call(layer: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        training = kwargs.get("training", args[0] if args else None)
        # What BatchNormalization.call itself tests to use the batch's statistics.
        if (training and layer.trainable and not getattr(layer, "synchronized", False)
                and layer.name not in found):
            found.append(layer.name)
        return original(layer, inputs, *args, **kwargs)

    return patched([(cls, "call", call)])


def unsynced_batchnorm_note(names: list[str], replicas: int) -> str:
    """The Run's note for ``unsynced_batchnorm``'s layers."""
    shown = ", ".join(names[:5]) + ("..." if len(names) > 5 else "")
    return (f"{count(len(names), 'BatchNormalization layer')} ({shown}) train on {replicas} "
            "replicas without synchronized=True: each replica normalises with its own slice of the "
            "batch and updates its own copy of moving_mean and moving_variance, so the copies "
            "drift apart per replica, and what you read, save and use for inference is replica "
            "0's. Create them with keras.layers.BatchNormalization(synchronized=True) to use the "
            "global batch's statistics (one more collective per layer and step).")
