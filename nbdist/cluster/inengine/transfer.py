"""``check_pull``: runs on the worker a value is pulled from, before ipyparallel pickles
anything there. It finds the value by its name and walks it, by type only, for TensorFlow and
Keras objects (``cluster.sendable``): pickling one could run a collective on this worker alone.
``model_state``: runs on every worker when the value is a Keras model, so that reading its
weights is joined by all (``multiworker.models`` rebuilds it in the kernel).
"""

from __future__ import annotations

import inspect
from typing import Any

from ...tflogs import quiet_tensorflow
from ..failures import describe_exception
from ..protocol import Outcome
from ..sendable import _MISSING, find_unsendable, framework_of, parse_name
from .worker import user_namespace


def _own_attribute(obj: Any, key: str) -> Any:
    """``obj.key`` when it is a plain attribute in the object's own ``__dict__`` (reading it
    runs no code), else ``_MISSING``: a property or a ``__getattr__`` of a TensorFlow object
    may read its variables."""
    try:
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return _MISSING
    if type(own) is not dict or key not in own:
        return _MISSING
    found = inspect.getattr_static(obj, key, _MISSING)   # a data descriptor on the type wins
    return found if found is own[key] else _MISSING


def check_pull(name: str) -> dict[str, Any] | None:
    """Runs on the worker before ``%distribute pull NAME``: None when the value may be pickled,
    else why not, as a plain dict ``{"problem": ...}``:

    - ``syntax``: NAME is not a variable with ``.attribute`` and ``[literal]`` parts;
    - ``missing``: no such variable; ``lookup``: a part of NAME failed (``text``);
    - ``computed``: ``expr`` is not a plain attribute of a TensorFlow object (``type``): reading
      it would run TensorFlow or Keras code on this worker alone;
    - ``unsendable``: the value is or holds a TensorFlow or Keras object (``find_unsendable``).
    """
    try:
        value, problem = _lookup(name)
        if problem is not None:
            return problem
        found = find_unsendable(value, name.strip())
        return None if found is None else {"problem": "unsendable", **found}
    except Exception as err:   # returned, as every function the kernel calls here does
        return {"problem": "lookup", "text": f"{type(err).__name__}: {err}"}


def _lookup(name: str) -> tuple[Any, dict[str, Any] | None]:
    """The value NAME names in this worker's namespace, or (None, why not) as ``check_pull``
    returns it; the parts of a TensorFlow or Keras object read are plain attributes only."""
    try:
        steps = parse_name(name)
    except ValueError:
        return None, {"problem": "syntax"}
    namespace = user_namespace()
    root = steps[0][1]
    if root not in namespace:
        return None, {"problem": "missing", "name": root}
    value, where = namespace[root], root
    for kind, key in steps[1:]:
        step = f".{key}" if kind == "attr" else f"[{key!r}]"
        cls = type(value)
        if framework_of(cls) is not None:
            found = _own_attribute(value, key) if kind == "attr" else _MISSING
            if found is _MISSING:
                return None, {"problem": "computed", "expr": where + step,
                              "type": f"{cls.__module__}.{cls.__qualname__}"}
            value = found
        else:   # the user's own objects: read as ipyparallel will, to check what it sends
            value = getattr(value, key) if kind == "attr" else value[key]
        where += step
    return value, None


def model_state(name: str, send: bool) -> dict[str, Any]:
    """Runs on every worker for ``%distribute pull MODEL``, once ``check_pull`` found that NAME
    is a Keras model: every worker reads its weights, so a read that is a collective (a
    SyncOnRead variable, such as BatchNormalization's moving statistics) is joined by all.
    ``send``: this is the worker pulled from, which returns the weights (NumPy arrays), the
    model's JSON config (None, with ``why``, when it has none) and its Keras and class."""
    try:
        with quiet_tensorflow():
            value, problem = _lookup(name)
            if problem is not None:
                raise LookupError(f"`{name}` is not there on this worker ({problem})")
            weights = value.get_weights()
            if not send:
                return Outcome(ok=True, value=None).to_dict()
            config, why = None, None
            try:
                config = value.to_json()
            except Exception as err:   # a subclassed model without get_config
                why = f"{type(err).__name__}: {err}"
            cls = type(value)
            return Outcome(ok=True, value={
                "weights": weights, "config": config, "why": why, "keras": framework_of(cls),
                "class": cls.__name__, "type": f"{cls.__module__}.{cls.__qualname__}"}
            ).to_dict()
    except BaseException as err:
        return Outcome(ok=False, error=describe_exception(err)).to_dict()
