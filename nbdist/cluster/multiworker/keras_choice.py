"""Which Keras the workers run as ``tf.keras`` (``%distribute multiworker --keras``)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

from ...errors import ConfigError
from ...install_tf_keras import INSTALL_HINT

KERAS_CHOICES = ("auto", "legacy", "keras3")
KERAS_ISSUE = ("Keras 3 model.fit fails under MultiWorkerMirroredStrategy "
               "(keras-team/keras#20585)")


def resolve_keras(choice: str) -> tuple[str, str]:
    """The Keras workers run as tf.keras (``"legacy"``: tf_keras, or ``"keras3"``), and why."""
    if choice not in KERAS_CHOICES:
        raise ConfigError(f"--keras {choice!r}: choose one of {', '.join(KERAS_CHOICES)}.")
    importlib.invalidate_caches()   # tf_keras may have been installed since the kernel started
    have_tf_keras = importlib.util.find_spec("tf_keras") is not None
    if choice == "legacy" and not have_tf_keras:
        raise ConfigError(
            "--keras legacy runs tf_keras on the workers, but tf_keras is not installed. "
            f"Run `{INSTALL_HINT}` in a terminal (the tf-keras of your TensorFlow's version), "
            "then this line again."
        )
    if choice == "keras3":
        return "keras3", f"asked with --keras keras3; {KERAS_ISSUE}: train in step mode"
    if have_tf_keras:
        why = "asked with --keras legacy" if choice == "legacy" else KERAS_ISSUE
        return "legacy", f"TF_USE_LEGACY_KERAS=1, because {why}"
    return "keras3", (f"tf_keras is not installed and {KERAS_ISSUE}: `{INSTALL_HINT}` "
                      "for fit, or train in step mode")


#: Said when the workers run tf_keras and this kernel Keras 3: how a trained model comes here.
MIXED_KERAS = (
    "To bring a model trained on the workers here, run `%distribute pull model` (its name): "
    "it comes as a Keras 3 model with the workers' weights. What the workers save "
    "(model.save, tf.train.Checkpoint of a model) is tf_keras's and does not load into this "
    "kernel's Keras 3 models: load it with `import tf_keras` (tf_keras.models.load_model)."
)


def kernel_runs_keras3() -> bool:
    """Whether ``tf.keras`` in this kernel is Keras 3 (read without importing TensorFlow)."""
    if os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true"):
        return False
    try:
        return int(importlib.metadata.version("keras").split(".")[0]) >= 3
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False
