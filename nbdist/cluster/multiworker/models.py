"""``%distribute pull MODEL``: a Keras model trained on the workers, as a model of this kernel's
Keras.

The workers may run tf_keras as ``tf.keras`` while this kernel runs Keras 3
(``keras_choice``), so a model object cannot cross: every worker reads its weights
(``inengine.transfer.model_state``, a read every worker joins), and the worker pulled from
sends them with the model's JSON config. Here they go into the kernel's model of the same name
when its weights have the same shapes (the same object, its weights set in place); otherwise
the model is rebuilt from the config (Sequential and functional models: Keras 3 reads tf_keras
configs with ``keras.legacy.saving``, after ``_KERAS3_CONFIG`` fixes) and given the weights. A
subclassed model has no config to rebuild from: it is built here by the user's own code first.
The optimizer's state is not moved: a pulled model is for evaluating, predicting or saving;
compile it to train it here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError
from ...kerasmodel import is_keras_model
from ...words import count
from .keras_choice import kernel_runs_keras3

if TYPE_CHECKING:
    import numpy as np

#: Models rebuilt from their config: the others are subclassed (their code is not in it).
_REBUILDABLE = ("Sequential", "Functional", "Model")
#: Layer config keys of tf_keras that Keras 3 layers refuse and that change nothing in the
#: layer they describe (checked with TF 2.21, tf_keras 2.21, Keras 3.15), by layer class; a
#: layer's ``batch_input_shape`` is also its model's (an InputLayer, or Sequential's
#: ``build_input_shape``), so it goes too, but an InputLayer's.
_KERAS3_DROP = {"Embedding": ("input_length",), "LSTM": ("time_major",),
                "GRU": ("time_major",), "SimpleRNN": ("time_major",)}
#: An error of Keras is cut here: it may print the whole config.
_MAX_ERROR = 200


@dataclass
class WorkerModel:
    """What ``model_state`` sends from worker ``worker``: the model's weights (NumPy arrays),
    its JSON config (None when it has none, ``why``), its Keras (``tf_keras`` or ``keras``) and
    class."""

    name: str
    worker: int
    weights: list[np.ndarray]
    config: str | None
    why: str | None
    keras: str
    cls: str
    type: str


def weight_shapes(model: Any) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in w.shape) for w in model.weights]


def into_kernel(pulled: WorkerModel, into: Any) -> Any:
    """The kernel's model for ``pulled``: ``into`` (a Keras model of this kernel) with its
    weights set in place when they have the same shapes, else one rebuilt from the config."""
    shapes = [tuple(w.shape) for w in pulled.weights]
    if into is not None and is_keras_model(into) and weight_shapes(into) == shapes:
        into.set_weights(pulled.weights)
        return into
    return _rebuilt(pulled, into)


def _rebuilt(pulled: WorkerModel, into: Any) -> Any:
    """A model of this kernel's Keras built from ``pulled``'s config, with its weights, or
    the refusal."""
    config = json.loads(pulled.config) if pulled.config is not None else None
    if config is None or config.get("class_name") not in _REBUILDABLE:
        raise ConfigError(_build_here(pulled, into, "it is a subclassed model: its code, which "
                                      "makes its layers, is not in a config"))
    try:
        model = _from_config(pulled, config)
        model.set_weights(pulled.weights)
        return model
    except Exception as err:
        text = " ".join(str(err).split())
        text = text if len(text) <= _MAX_ERROR else text[:_MAX_ERROR] + "..."
        raise ConfigError(_build_here(pulled, into, "this kernel's Keras could not rebuild it "
                                      f"with its weights ({type(err).__name__}: {text})")
                          ) from None


def _from_config(pulled: WorkerModel, config: dict[str, Any]) -> Any:
    if not kernel_runs_keras3():   # tf_keras here too: the config is its own
        import tf_keras

        return tf_keras.models.model_from_json(pulled.config)
    import keras

    if pulled.keras == "keras":
        return keras.models.model_from_json(pulled.config)
    objects = {**vars(keras.layers), "Sequential": keras.Sequential,
               "Functional": keras.Model, "Model": keras.Model}
    return keras.legacy.saving.deserialize_keras_object(_keras3_config(config),
                                                        module_objects=objects)


def _keras3_config(config: Any) -> Any:
    """A tf_keras config as Keras 3 reads it: keys its layers refuse dropped, a single
    ``axis`` in a list (BatchNormalization once built) as the number, a functional model's
    single input or output as itself, not a list of one (Keras 3 then warns at every call)."""
    if isinstance(config, list):
        return [_keras3_config(c) for c in config]
    if not isinstance(config, dict):
        return config
    fixed = {k: _keras3_config(v) for k, v in config.items()}
    inner = fixed.get("config")
    if isinstance(inner, dict) and isinstance(fixed.get("class_name"), str):
        for key in _KERAS3_DROP.get(fixed["class_name"], ()):
            inner.pop(key, None)
        if fixed["class_name"] != "InputLayer":
            inner.pop("batch_input_shape", None)
        axis = inner.get("axis")
        if fixed["class_name"] == "BatchNormalization" and isinstance(axis, list) \
                and len(axis) == 1:
            inner["axis"] = axis[0]
        for ends in ("input_layers", "output_layers"):   # tf_keras lists a single one
            one = inner.get(ends)
            if fixed["class_name"] in ("Functional", "Model") and isinstance(one, list) \
                    and len(one) == 1 and isinstance(one[0], list):
                inner[ends] = one[0]
    return fixed


def _build_here(pulled: WorkerModel, into: Any, why: str) -> str:
    """The refusal: build the model here with the user's code, then pull again."""
    name, worker = pulled.name, pulled.worker
    if into is not None and is_keras_model(into):
        theirs, ours = len(pulled.weights), len(into.weights)
        had = (f"This kernel's `{name}` has no weights yet (build it: call it once on a batch)"
               if not ours else
               f"This kernel's `{name}` has {count(ours, 'weight')} whose shapes differ from "
               f"the {count(theirs, 'weight')} of worker {worker}'s")
        had += ", so they could not be set into it. "
    else:
        had = ""
    return (f"`%distribute pull {name}` refused: `{name}` on worker {worker} is a Keras model "
            f"({pulled.type}) that this kernel cannot make, because {why}. {had}Build the model "
            f"in this kernel first: run the code that makes it in a plain cell (no "
            f"%%distribute), as `{name} = ...`, and call it once on a batch so that it has its "
            f"weights; then run `%distribute pull {name}` again: it sets worker {worker}'s "
            "weights into that model. Nothing was changed here; the workers are unchanged.")
