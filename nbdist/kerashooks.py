"""Lazily built Keras optimizers in step mode.

A Keras 3 optimizer creates its slot variables on its first ``apply_gradients``. Inside a
``tf.function`` under MirroredStrategy that first call fails deep in TensorFlow ("You must
feed a value for placeholder tensor"). ``optimizer_prebuild`` intercepts that build during
tracing, aborts the trace, builds the optimizer eagerly under the strategy's scope (what a
careful user would do by hand) and lets the runner trace again. (``model.fit`` telemetry is
``fitrecord``.)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from .patching import patched


class _NeedsBuild(Exception):
    """Raised inside a trace to abort it so an optimizer can be built eagerly."""


@contextlib.contextmanager
def optimizer_prebuild(pending: list[tuple[Any, list[Any]]]) -> Iterator[None]:
    """While active, an unbuilt Keras optimizer built inside a tf.function aborts the trace."""
    import keras
    import tensorflow as tf

    cls = keras.optimizers.Optimizer
    original = cls.build

    def build(self: Any, variables: Any) -> Any:
        if tf.inside_function() and not self.built:
            pending.append((self, list(variables)))
            raise _NeedsBuild()
        return original(self, variables)

    with patched([(cls, "build", build)]):
        yield


def call_building_optimizers(
    make_fn: Callable[[], Callable[[Any], Any]], arg: Any, strategy: Any
) -> tuple[Callable[[Any], Any], Any]:
    """First call of a compiled step: build any Keras optimizer it would build, then run it.

    Returns the compiled function that ran and its result. After an aborted trace the function
    is compiled afresh, because variables created before the abort would otherwise linger in the
    half-finished tf.function.
    """
    tf_logger = logging.getLogger("tensorflow")
    for _ in range(8):  # one retry per optimizer the step uses
        fn = make_fn()
        pending: list[tuple[Any, list[Any]]] = []
        level = tf_logger.level
        # MirroredStrategy's thread coordinator logs our deliberate abort at INFO level.
        tf_logger.setLevel(max(level, logging.WARNING))
        try:
            with optimizer_prebuild(pending):
                return fn, fn(arg)
        except _NeedsBuild:
            pass
        except Exception:  # MirroredStrategy may wrap a replica thread's exception
            if not pending:
                raise
        finally:
            tf_logger.setLevel(level)
        with strategy.scope():
            for optimizer, variables in pending:
                if not optimizer.built:
                    optimizer.build(variables)
    fn = make_fn()
    return fn, fn(arg)
