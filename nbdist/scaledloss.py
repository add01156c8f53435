"""A Keras 3 model's own ``test_step`` or ``train_step`` that reports ``self.compute_loss``.

Under several replicas Keras 3's ``compute_loss`` divides the loss by the replicas in sync, so
that the replicas' gradients add up to the whole batch's; Keras' own steps multiply it back
before updating the loss metric. A step written as keras.io's "Customizing what happens in
fit()/evaluate()" guides write it (``loss = self.compute_loss(...)``, then
``metric.update_state(loss)``) does not, and ``evaluate`` or ``fit`` shows the loss divided by
the replicas. ``noting_scaled_loss`` says so once per model class, when it is evaluated or fit
in a ``%%distribute`` cell, with the fix.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from .patching import patched

#: The model classes already told about, and which of their steps.
_TOLD: weakref.WeakKeyDictionary[type, set[str]] = weakref.WeakKeyDictionary()


def reports_scaled_loss(cls: type, step: str) -> bool:
    """Whether ``cls`` overrides Keras' ``step`` ("test_step", "train_step") with code that
    calls ``compute_loss`` and never scales by ``num_replicas_in_sync``."""
    import keras

    method = getattr(cls, step, None)
    if method is None or method is getattr(keras.Model, step):
        return False
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError):   # no source to read: nothing to say
        return False
    return "compute_loss" in source and "num_replicas_in_sync" not in source


def scaled_loss_note(cls: type, step: str, replicas: int) -> str:
    shows = "evaluate (and fit's val_loss)" if step == "test_step" else "fit"
    return (f"nbdist: `{cls.__name__}.{step}` reports `self.compute_loss(...)`, which Keras "
            "divides by the replicas in sync so that their gradients add up to the batch's: "
            f"under these {replicas} replicas the loss {shows} shows is {replicas} times too "
            "small. Multiply it by `self.distribute_strategy.num_replicas_in_sync` where the "
            "step updates its loss metric or returns it.")


@contextlib.contextmanager
def noting_scaled_loss(replicas: int, say: Callable[[str], None] = print) -> Iterator[None]:
    """While the block runs, ``model.evaluate`` and ``model.fit`` of a Keras 3 model whose own
    step reports a scaled loss say so (once per class and step) before they run."""
    if replicas < 2:
        yield
        return
    import keras

    cls = keras.Model

    def noting(name: str, steps: tuple[str, ...]) -> Callable[..., Any]:
        original = getattr(cls, name)

        def call(model: Any, *args: Any, **kwargs: Any) -> Any:
            told = _TOLD.setdefault(type(model), set())
            for step in steps:
                if step not in told and reports_scaled_loss(type(model), step):
                    told.add(step)
                    say(scaled_loss_note(type(model), step, replicas))
            return original(model, *args, **kwargs)

        return call

    with patched([(cls, "evaluate", noting("evaluate", ("test_step",))),
                  (cls, "fit", noting("fit", ("train_step", "test_step")))]):
        yield
