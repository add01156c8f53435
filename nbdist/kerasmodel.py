"""Whether a value is a Keras model, of Keras 3 or of tf_keras, without importing either: the
kernel's question before it moves or keeps a model (``%distribute pull``)."""

from __future__ import annotations

import sys
from typing import Any


def is_keras_model(value: Any) -> bool:
    """Whether ``value`` is a model of Keras 3 or of tf_keras (libraries not imported yet
    cannot have made it)."""
    for name in ("keras", "tf_keras"):
        module = sys.modules.get(name)
        model = getattr(module, "Model", None)
        if isinstance(model, type) and isinstance(value, model):
            return True
    return False
