"""The objects a step cell trains, checked before anything runs.

A step cell names a model, an optimizer, variables... made in earlier cells. Two mistakes make
TensorFlow fail deep inside a traced step, after it may already have changed those objects:

* an object created outside the session's strategy (a cell without ``%%distribute``, or under
  an earlier ``%distribute`` line): Keras fails with a bare ``AssertionError`` or "Mixing
  different tf.distribute.Strategy objects". ``check_strategy`` finds its variables with
  ``strategy.extended.variable_created_in_scope`` and refuses with the object's name.
* a Keras model not built yet (a ``Sequential`` without ``Input``): built for the first time
  inside ``strategy.run`` it fails with errors that vary by run and leaves empty variables.
  ``unbuilt_models`` lists them; Keras 3 models are built before tracing by
  ``step.keras_builds.call_building_optimizers``; tf_keras models build themselves correctly inside
  the step (their variables are created under the strategy, out of the trace, as Keras 2's
  were: the tutorial was written for it); any other is refused here with what to do.

And one TensorFlow cannot train: a Keras 3 model whose variables ParameterServerStrategy
sharded (``--partitioner``). A Keras 3 ``Variable`` wraps the ``ShardedVariable`` the
strategy's variable creator returned, and Keras 3 layers and optimizers use its ``handle``,
which a ShardedVariable does not have: the step would fail at ``tape.gradient`` with
"'ShardedVariable' object has no attribute 'handle'". ``check_sharded`` refuses it first.
"""

from __future__ import annotations

import ast
import sys
from typing import Any

from ..cellnames import name_lines
from ..checkpoint.step import named_trackables
from ..errors import StepCodeError
from ..hooks.keras import wrapped_variable
from ..hooks.tensorflow import is_sharded_variable


def check_step_objects(cell: str, user_ns: dict[str, Any], strategy: Any) -> None:
    """Refuse a step cell whose objects would fail (or be damaged) inside the traced step."""
    objects = named_trackables(cell, user_ns)
    check_sharded(cell, objects)
    check_strategy(cell, objects, strategy)
    unbuildable = {name: value for name, value in unbuilt_models(objects).items()
                   if not _builds_safely(value)}
    if unbuildable:
        refuse_unbuilt(cell, unbuildable)


def check_strategy(cell: str, objects: dict[str, Any], strategy: Any) -> None:
    """Refuse (``StepCodeError`` on the cell's first line naming it) an object with a
    variable that was not created under ``strategy``."""
    for name, value in objects.items():
        variable = _foreign_variable(value, strategy)
        if variable is None:
            continue
        import tensorflow as tf

        inner = wrapped_variable(variable)
        inner = variable if inner is None else inner
        where = ("under another strategy (an earlier `%distribute` line)"
                 if isinstance(inner, tf.distribute.DistributedValues)
                 else "outside `%%distribute` (in a plain cell)")
        line, text = _first_use(cell, name)
        raise StepCodeError(
            f"`{name}` ({type(value).__name__}) was created {where}: its variable "
            f"`{_variable_name(variable)}` does not belong to the notebook's strategy "
            f"({type(strategy).__name__}), so TensorFlow cannot place or update it on the "
            f"replicas. Create `{name}` (and what holds it: model, optimizer, checkpoint) "
            "again in a `%%distribute` cell (scope mode, no `--step`), then re-run this "
            "cell. Nothing was run or changed.",
            cell_line=line, line_text=text)


def check_sharded(cell: str, objects: dict[str, Any]) -> None:
    """Refuse an object holding a Keras 3 variable that wraps a ShardedVariable."""
    for name, value in objects.items():
        sharded = next((v for v in _variables(value)
                        if is_sharded_variable(wrapped_variable(v))), None)
        if sharded is None:
            continue
        line, text = _first_use(cell, name)
        raise StepCodeError(
            f"`{name}` ({type(value).__name__}) holds the Keras 3 variable "
            f"`{_variable_name(sharded)}`, which `--partitioner` sharded over the parameter "
            "servers: Keras 3 layers and optimizers do not support tf.distribute's "
            "ShardedVariable (its gradient fails with \"'ShardedVariable' object has no "
            "attribute 'handle'\"), so this step cannot train it. Build the model and its "
            "optimizer with tf_keras, whose layers and optimizers train sharded variables "
            "(`import tf_keras` in a `%%distribute` cell, then `tf_keras.Sequential`, "
            "`tf_keras.layers...`, `tf_keras.optimizers...`; `python3 -m nbdist.install_tf_keras` "
            "installs it), or leave the variables whole: `%distribute parameter_server` "
            "without --partitioner. Nothing was run or changed.",
            cell_line=line, line_text=text)


def unbuilt_models(objects: dict[str, Any]) -> dict[str, Any]:
    """The objects that are Keras layers/models with no variables yet (built lazily)."""
    return {name: value for name, value in objects.items()
            if getattr(value, "built", True) is False and hasattr(value, "call")
            and not _variables(value)}   # add_weight in __init__ is built enough


def refuse_unbuilt(cell: str, unbuilt: dict[str, Any]) -> None:
    """For models no hook can build before tracing (a layer, or neither Keras 3 nor tf_keras):
    the error and the fix."""
    name, value = next(iter(unbuilt.items()))
    line, text = _first_use(cell, name)
    raise StepCodeError(
        f"`{name}` ({type(value).__name__}) has no weights yet: it builds them the first time "
        "it is called, which here would be inside the compiled, distributed step, where "
        "creating variables fails and can leave the model with empty weights. Give it its "
        "input shape where you create it, in a `%%distribute` cell: start a Sequential with "
        "`tf.keras.Input(shape=...)`, or call `model.build((None, ...))` (or the model on one "
        "batch) there. Nothing was run or changed.",
        cell_line=line, line_text=text)


def _builds_safely(value: Any) -> bool:
    """A Keras 3 model (``step.keras_builds`` builds it before tracing) or a tf_keras one (builds
    itself in the step), not a layer."""
    return any(name in sys.modules and isinstance(value, sys.modules[name].Model)
               for name in ("keras", "tf_keras"))


def _foreign_variable(value: Any, strategy: Any) -> Any:
    """The first variable of ``value`` not created under ``strategy`` (None: all are)."""
    created_in = strategy.extended.variable_created_in_scope
    for variable in _variables(value):
        inner = wrapped_variable(variable)
        try:
            if not created_in(variable if inner is None else inner):
                return variable
        except (AttributeError, TypeError):   # a variable kind the strategy cannot tell
            continue
    return None


def _variables(value: Any) -> list[Any]:
    """``value`` itself if a variable, else its ``variables`` (none if it has no list)."""
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return [value]
    try:   # a tf_keras model not built yet raises ValueError
        return list(getattr(value, "variables", []))
    except (TypeError, ValueError):
        return []


def _variable_name(variable: Any) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", "?"))


def _first_use(cell: str, name: str) -> tuple[int | None, str]:
    """The cell line (the ``%%distribute`` line is 1) where ``name`` first appears."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return None, ""
    lines = name_lines(tree, name)
    if not lines:
        return None, ""
    first = min(lines)
    return first + 1, cell.splitlines()[first - 1]
