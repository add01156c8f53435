"""``check_pull``: runs on the worker a value is pulled from, before ipyparallel pickles
anything there. It finds the value by its name and walks it, by type only, for TensorFlow and
Keras objects (``cluster.sendable``): pickling one could run a collective on this worker alone.
"""

from __future__ import annotations

import inspect
from typing import Any

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
        steps = parse_name(name)
    except ValueError:
        return {"problem": "syntax"}
    try:
        namespace = user_namespace()
        root = steps[0][1]
        if root not in namespace:
            return {"problem": "missing", "name": root}
        value, where = namespace[root], root
        for kind, key in steps[1:]:
            step = f".{key}" if kind == "attr" else f"[{key!r}]"
            cls = type(value)
            if framework_of(cls) is not None:
                found = _own_attribute(value, key) if kind == "attr" else _MISSING
                if found is _MISSING:
                    return {"problem": "computed", "expr": where + step,
                            "type": f"{cls.__module__}.{cls.__qualname__}"}
                value = found
            else:   # the user's own objects: read as ipyparallel will, to check what it sends
                value = getattr(value, key) if kind == "attr" else value[key]
            where += step
        found = find_unsendable(value, name.strip())
        return None if found is None else {"problem": "unsendable", **found}
    except Exception as err:   # returned, as every function the kernel calls here does
        return {"problem": "lookup", "text": f"{type(err).__name__}: {err}"}
