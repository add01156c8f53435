"""Replacing a class attribute for the duration of a ``with`` block.

nbdist hooks into TensorFlow and Keras by replacing methods on their classes (``Model.fit``,
``Optimizer.build``, ``ReplicaContext.all_reduce``...) only while a cell runs. Restoring must
leave each class exactly as it was: an attribute the class only inherited is deleted again
(a copy left on the subclass would shadow later changes to its base class).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

_ABSENT = object()


@contextlib.contextmanager
def patched(changes: Iterable[tuple[type, str, Any]]) -> Iterator[None]:
    """Set ``cls.name = value`` for each ``(cls, name, value)`` while the block runs.

    Compute replacement values that wrap the original (``getattr(cls, name)``) before the
    block: all are read before any is set, so a subclass never wraps its base's replacement.
    """
    changes = list(changes)
    saved = [(cls, name, cls.__dict__.get(name, _ABSENT)) for cls, name, _ in changes]
    try:
        for cls, name, value in changes:
            setattr(cls, name, value)
        yield
    finally:
        for cls, name, own in reversed(saved):
            if own is not _ABSENT:
                setattr(cls, name, own)
            elif name in cls.__dict__:
                delattr(cls, name)
