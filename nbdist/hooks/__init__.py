"""Every use of a private third-party API, in one place, each declared with its versions.

nbdist reaches into TensorFlow, Keras, tf_keras, ipykernel and ipyparallel where no
public API does what a feature needs (a faster call of a traced step, a Stop button while a
cell runs...). Each such use is a small function in this package, one module per library
(``tensorflow``, ``tf_coordinator``, ``tf_data`` and ``tf_gradients`` for TensorFlow), whose
docstring says which feature uses it, the versions it was checked on and what degrades
without it; the code degrades that way (or raises ``PrivateAPIMissing`` with a message) rather
than failing deep inside.

``REGISTRY`` declares them all (``PrivateAPI``); ``check()`` says which the installed versions
lack, and ``tests/test_private_apis.py`` fails naming the feature when one disappears. No
module here imports a library at import time, and this package imports nothing from nbdist
but ``errors``: it is the bottom layer.
"""

from __future__ import annotations

from . import (
    argparse_parser,
    ipykernel,
    ipyparallel,
    keras,
    tensorflow,
    tf_coordinator,
    tf_data,
    tf_gradients,
    tf_keras,
)
from .api import PrivateAPI, PrivateAPIMissing

__all__ = ["REGISTRY", "PrivateAPI", "PrivateAPIMissing", "check"]

REGISTRY: list[PrivateAPI] = [
    *tensorflow.DECLARED, *tf_coordinator.DECLARED, *tf_data.DECLARED,
    *tf_gradients.DECLARED, *keras.DECLARED,
    *tf_keras.DECLARED, *ipykernel.DECLARED, *ipyparallel.DECLARED, *argparse_parser.DECLARED,
]


def check(libraries: tuple[str, ...] | None = None) -> list[tuple[PrivateAPI, str]]:
    """The declared APIs the installed libraries lack, each with why (libraries that are not
    installed are skipped; ``libraries`` limits the check to those import names)."""
    missing = []
    for api in REGISTRY:
        if libraries is not None and api.library not in libraries:
            continue
        if not api.installed():
            continue
        why = api.missing()
        if why is not None:
            missing.append((api, why))
    return missing
