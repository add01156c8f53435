"""The gradients a step takes, checked while TensorFlow traces it.

``tape.gradient(loss, variables)`` of a loss that is a Python number, or that does not depend
on any of the variables, gives no gradient at all: Keras then fails with "No gradients provided
for any variable" (naming none), and a step that applies the gradients itself trains nothing.
``checking_gradients`` catches both at the first trace and says which variables got no
gradient (as Keras' warning for some of them does). ``errormap`` places the error at the
cell's ``.gradient(...)`` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import LossError, NoGradients
from ..patching import patched


def _names(variables: list[Any]) -> str:
    names = [str(getattr(v, "path", None) or getattr(v, "name", "?")) for v in variables]
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    return f"[{shown}]"


@contextlib.contextmanager
def checking_gradients(loss_name: str) -> Iterator[None]:
    """While the block traces a step: ``tf.GradientTape.gradient`` refuses a target that is
    not a tensor, and a result with no gradient for any variable."""
    import tensorflow as tf

    original = tf.GradientTape.gradient

    def gradient(tape: Any, target: Any, sources: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(target, (int, float, bool)) and not isinstance(target, tf.Tensor):
            raise LossError(
                f"the loss must be a tensor computed from the batch and the model; "
                f"`{loss_name}` is {target!r}, a Python {type(target).__name__}, which has no "
                "gradient, so nothing would train. Compute it inside the `with "
                "tf.GradientTape() as tape:` block from the model's output: "
                f"`{loss_name} = loss_fn(y, model(x, training=True))`.")
        result = original(tape, target, sources, *args, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        if flat_sources and all(g is None for g in tf.nest.flatten(result)):
            raise NoGradients(
                f"no gradient reaches any of the {len(flat_sources)} variables differentiated "
                f"{_names(flat_sources)}: the loss does not depend on them, so nothing would "
                "train. Compute the loss from the model's output inside the `with "
                "tf.GradientTape() as tape:` block (`loss = loss_fn(y, model(x, "
                "training=True))`), and differentiate the variables it uses.")
        return result

    # plain Python when the step's AutoGraph-converted code calls it: our errors reach the
    # user unwrapped
    checked = tf.autograph.experimental.do_not_convert(gradient)
    with patched([(tf.GradientTape, "gradient", checked)]):
        yield
