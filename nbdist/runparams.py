"""What a run was set up with, read from the kernel's namespace: the learning rate of the
optimizer the cell uses and the global batch of its ``--data``. ``Run.params`` keeps them,
and ``Run.label`` and ``nbdist.compare`` name runs by the ones that differ.

Read where they are plain to see (an optimizer or model the cell names, a dataset with a
static batch size); anything else is left out rather than guessed. No TensorFlow import.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable
from typing import Any

from .spec import RunSpec

__all__ = ["cell_params", "cell_params_names", "learning_rate_of"]


def cell_params(text: str, spec: RunSpec, namespace: dict[str, Any]) -> dict[str, Any]:
    """``{"learning_rate": 0.01, "global_batch": 64}``, as far as ``namespace`` tells, for the
    cell ``text`` run with ``spec``."""
    out: dict[str, Any] = {}
    rate = learning_rate_of(namespace.get(name) for name in cell_params_names(text))
    if rate is not None:
        out["learning_rate"] = rate
    batch = _global_batch(namespace.get(spec.data)) if spec.data else None
    if batch is not None:
        out["global_batch"] = batch
    return out


def learning_rate_of(objects: Iterable[Any]) -> float | str | None:
    """The learning rate of the first optimizer among ``objects`` (or of a Keras model's
    optimizer): a number, a schedule's name and initial rate, or None."""
    for obj in objects:
        optimizer = obj if _is_optimizer(obj) else getattr(obj, "optimizer", None)
        if not _is_optimizer(optimizer):
            continue
        rate = optimizer.learning_rate
        value = _number(rate)
        if value is not None:
            return value
        config = getattr(rate, "get_config", None)
        try:
            start = _number((config() if callable(config) else {}).get("initial_learning_rate"))
        except Exception:   # a user's schedule: its config is its own business
            start = None
        name = type(rate).__name__
        return f"{name}({start:g})" if start is not None else name
    return None


def _is_optimizer(obj: Any) -> bool:
    return obj is not None and not isinstance(obj, type) and \
        hasattr(obj, "apply_gradients") and hasattr(obj, "learning_rate")


def _number(value: Any) -> float | None:
    if value is None or callable(value) or _elsewhere(value):
        return None
    try:
        number = float(value)
    except Exception:   # not a number; or TensorFlow's error from a variable it cannot read
        try:
            number = float(value.numpy())
        except Exception:
            return None
    return float(f"{number:.6g}") if math.isfinite(number) else None


def _elsewhere(value: Any) -> bool:
    """A variable held by another process (a parameter server): not read for a label, since
    reading it is a remote call that fails when that process died and waits for ever when it
    is stopped."""
    for obj in (value, getattr(value, "value", None)):
        device = getattr(obj, "device", None)
        if isinstance(device, str) and "/job:" in device and "/job:localhost" not in device:
            return True
    return False


def cell_params_names(text: str) -> list[str]:
    """The names ``text`` reads, in order of first use: where its optimizer may be."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    names = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
             and isinstance(n.ctx, ast.Load)]
    return list(dict.fromkeys(names))


def _global_batch(dataset: Any) -> int | None:
    """The static batch size of a ``tf.data.Dataset``'s elements (``drop_remainder=True``
    gives one), else None."""
    spec = getattr(dataset, "element_spec", None)
    if spec is None:
        return None
    stack = [spec]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (tuple, list)):
            stack.extend(item)
        else:
            shape = getattr(item, "shape", None)
            try:
                first = shape[0] if shape is not None and len(shape) else None
            except (TypeError, ValueError):   # an unknown rank
                return None
            return int(first) if first is not None else None
    return None
