"""The gradients a step takes, checked while TensorFlow traces it.

``tape.gradient(loss, variables)`` of a loss that is a Python number, or that does not depend
on any of the variables, gives no gradient at all: Keras then fails with "No gradients provided
for any variable" (naming none), and a step that applies the gradients itself trains nothing.
``checking_gradients`` catches both at the first trace and says which variables got no
gradient (as Keras' warning for some of them does). ``errormap`` places the error at the
cell's ``.gradient(...)`` line.

A step that takes no gradient at all can still return a constant loss (``loss = 0.5``): the
run would show the same loss at every step and train nothing. ``checking_loss`` refuses, at
the first trace, a loss that depends neither on the batch nor on any variable; ``errormap``
places it at the line assigning the loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


#: Graph operations that bring in what a step's loss should depend on: its inputs (the batch,
#: captured tensors and variable handles) and the values of datasets and variables.
_SOURCES = ("Placeholder", "IteratorGetNext", "IteratorGetNextSync", "ReadVariableOp",
            "VarHandleOp", "VariableV2", "ResourceGather")


def _depends_on_inputs(tensor: Any) -> bool:
    """Whether the traced ``tensor`` depends on the step's inputs or on a variable (a walk
    up its graph that stops at the first such operation)."""
    seen: set[str] = set()
    todo = [tensor.op]
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _SOURCES or op.type.startswith("Iterator"):
            return True
        todo.extend(t.op for t in op.inputs)
    return False


def constant_loss_refusal(loss: Any, loss_name: str) -> LossError | None:
    """The error for a step ``loss`` that depends neither on the batch nor on any variable
    (a Python number, or a tensor computed from constants), else None."""
    import tensorflow as tf

    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        what = f"the Python {type(loss).__name__} {loss!r}"
    elif isinstance(loss, tf.Tensor) and tf.is_symbolic_tensor(loss) \
            and not _depends_on_inputs(loss):
        what = "a tensor computed from constants alone"
    else:
        return None
    return LossError(
        f"`{loss_name}` is {what}: it depends neither on the batch nor on any variable, so "
        "every step would report the same loss and train nothing. Compute it from the batch "
        "and the model inside a `with tf.GradientTape() as tape:` block, "
        f"`{loss_name} = loss_fn(y, model(x, training=True))`, then apply its gradients "
        f"(`optimizer.apply_gradients(zip(tape.gradient({loss_name}, "
        "model.trainable_variables), model.trainable_variables))`).")


def checking_loss(factory: Callable[[Any], Any], loss_name: str) -> Callable[[Any], Any]:
    """The generated ``make_step(runtime)`` whose step refuses a constant loss while it is
    traced (``constant_loss_refusal``), before the runtime records it."""
    import tensorflow as tf

    def make_step(runtime: Any) -> Any:
        return factory(_LossChecked(runtime, loss_name, tf.autograph.experimental))

    return make_step


class _LossChecked:
    """A step runtime (``telemetry.probe.StepProbe``) whose ``end`` checks the loss first."""

    def __init__(self, runtime: Any, loss_name: str, autograph: Any):
        self._runtime = runtime
        self._loss_name = loss_name
        self.end = autograph.do_not_convert(self._end)   # plain Python, as the runtime's

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    def _end(self, loss: Any, *args: Any, **kwargs: Any) -> Any:
        refusal = constant_loss_refusal(loss, self._loss_name)
        if refusal is not None:
            raise refusal
        return self._runtime.end(loss, *args, **kwargs)
