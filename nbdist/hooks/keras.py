"""Private Keras 3 API: the epoch BackupAndRestore resumes from, a variable's tf.Variable, and
the factor an optimizer's ``scale_loss`` multiplies a loss by.

Checked with keras 3.15 on the TensorFlow backend. Keras is imported inside the probes only.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from .api import PrivateAPI, first_problem, lacks, used_in

CHECKED = "3.15"


def clear_initial_epoch(model: Any) -> bool:
    """Forget the epoch a restored backup told ``fit`` to start from
    (``Trainer._initial_epoch``: Keras 3's ``BackupAndRestore`` sets it and never clears it).

    Feature: ``--checkpoint`` on a scope-mode ``fit`` in the kernel: a later plain ``fit`` of
    the same model starts at epoch 0. Checked with keras 3.15. Without the attribute there is
    nothing to clear (returns False): if Keras keeps the epoch elsewhere, a later plain
    ``fit`` of that model may skip epochs.
    """
    if not hasattr(model, "_initial_epoch"):
        return False
    model._initial_epoch = None
    return True


def wrapped_variable(variable: Any) -> Any:
    """The backend variable a Keras 3 ``Variable`` wraps (``KerasVariable._value``: on the
    TensorFlow backend a ``tf.Variable``), or None for anything else.

    Feature: ``--checkpoint`` in step mode names the trainable variables a step uses that the
    checkpoint leaves out. Checked with keras 3.15. Without it that note may also name
    variables that are saved (the checkpoint itself is unchanged).
    """
    return getattr(variable, "_value", None)


def on_parameter_server(variable: Any) -> bool:
    """True for a TensorFlow variable placed on a parameter-server task (``/job:ps/``)."""
    return "/job:ps/" in str(getattr(variable, "device", "") or "")


def atomic_variable_updates() -> contextlib.AbstractContextManager[None]:
    """While active, a Keras 3 ``Variable``'s ``assign_add``/``assign_sub`` are the atomic
    ops of the tf.Variable it wraps (``KerasVariable._value``), instead of Keras' ``assign(self
    + value)``: a read, then a write, between which another worker's update to the same
    parameter-server variable is lost (Keras 3 metrics updated by several workers lost
    steps: an accuracy of 0.5 where 1.0 was right). Inside Keras' stateless scopes
    (``stateless_scope.in_stateless_scope``) Keras' own method runs.

    Only variables that live on a parameter server (``on_parameter_server``: the only ones
    several processes update at once) change; every other Keras variable of the kernel keeps
    Keras' own method. The patch is on the class, for the cluster's lifetime: a metric or
    optimizer variable may be created in any later cell, and its updates are traced into the
    workers' functions wherever that happens, so no narrower place catches them all.

    Feature: ``%distribute parameter_server`` (active while the cluster is). Checked with
    keras 3.15. Without ``_value`` the method is Keras' own (updates may be lost).
    """
    import keras
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    from ..patching import patched

    cls = keras.Variable

    def atomic(name: str) -> Any:
        keras_own = getattr(cls, name)

        def update(self: Any, value: Any) -> Any:
            inner = wrapped_variable(self)
            if inner is None or in_stateless_scope() or not on_parameter_server(inner):
                return keras_own(self, value)
            import tensorflow as tf

            return getattr(inner, name)(tf.cast(value, inner.dtype))

        return update

    return patched([(cls, name, atomic(name)) for name in ("assign_add", "assign_sub")])


def replica_scaling_site() -> tuple[Any, str] | None:
    """Where Keras 3 divides a loss by the replicas in sync inside ``strategy.run``: the
    module and name of ``keras.src.losses.loss.scale_loss_for_distribution``, which loss
    objects (mean reductions) and ``Model.compute_loss`` call through the module, or None.

    Feature: step mode reports a Keras loss's global value as one device computes it (the
    replicas' values summed). Checked with keras 3.15. Without it a Keras loss is read as
    undivided: its global loss would be shown at 1/N of its value, so the caller falls back to
    the cell's text and says so.
    """
    try:
        from keras.src.losses import loss as loss_module
    except ImportError:
        return None
    if not callable(getattr(loss_module, "scale_loss_for_distribution", None)):
        return None
    return loss_module, "scale_loss_for_distribution"


def loss_scalers() -> list[tuple[type, str, Callable[[Any], Any]]]:
    """The Keras 3 optimizer methods that scale a loss before its gradients are taken, as
    ``(class, name, factor)``: ``factor(optimizer)`` is what the method multiplies the loss
    by (a tensor, a number, or None: left unscaled). ``LossScaleOptimizer.scale_loss``
    multiplies by its ``dynamic_scale`` variable (``initial_scale`` before it is built);
    ``Optimizer.scale_loss`` by ``loss_scale_factor``.

    Feature: step mode's gradient norm under mixed precision (the norm of gradients of a
    scaled loss is divided by the scale) and the ``loss_scale_factor`` column. Checked with
    keras 3.15. Without these attributes the factor is None: the norm is left as the cell's
    gradients give it (scaled).
    """
    import keras

    def dynamic(optimizer: Any) -> Any:
        if not getattr(optimizer, "built", False):
            return getattr(optimizer, "initial_scale", None)
        scale = getattr(optimizer, "dynamic_scale", None)
        return getattr(scale, "value", scale)   # the tf.Variable a keras.Variable holds

    return [(keras.optimizers.LossScaleOptimizer, "scale_loss", dynamic),
            (keras.optimizers.Optimizer, "scale_loss",
             lambda optimizer: getattr(optimizer, "loss_scale_factor", None))]


def _probe_loss_scalers() -> str | None:
    import keras

    return first_problem(
        lambda: used_in(keras.optimizers.LossScaleOptimizer.scale_loss, "dynamic_scale",
                        "initial_scale"),
        lambda: used_in(keras.optimizers.Optimizer.scale_loss, "loss_scale_factor"))


def _probe_initial_epoch() -> str | None:
    import keras
    from keras.src.trainers import trainer

    return first_problem(lambda: used_in(trainer.Trainer.__init__, "_initial_epoch"),
                         lambda: used_in(keras.callbacks.BackupAndRestore,
                                             "_initial_epoch"))


def _probe_wrapped_variable() -> str | None:
    import keras
    import tensorflow as tf

    variable = keras.Variable(1.0)
    return first_problem(lambda: lacks(variable, "_value"),
                         lambda: None if isinstance(wrapped_variable(variable), tf.Variable)
                         else f"it is a {type(wrapped_variable(variable)).__name__}")


def _probe_atomic_updates() -> str | None:
    import keras
    from keras.src.backend.common import stateless_scope

    return first_problem(lambda: lacks(stateless_scope, "in_stateless_scope"),
                         lambda: lacks(keras.Variable(1.0), "_value"),
                         lambda: used_in(keras.Variable.assign_add, "assign"))


def _probe_replica_scaling() -> str | None:
    import keras
    from keras.src.losses import loss as loss_module

    def calls(function: Any, name: str) -> str | None:   # looked up in the module, by name
        source = inspect.getsource(function)
        return None if f"{name}(" in source else f"{function.__qualname__} no longer calls {name}"

    return first_problem(lambda: lacks(loss_module, "scale_loss_for_distribution"),
                         lambda: calls(keras.losses.Loss.__call__, "reduce_weighted_values"),
                         lambda: calls(loss_module.reduce_values,
                                       "scale_loss_for_distribution"))


DECLARED = [
    PrivateAPI("keras", "keras.src.losses.loss.scale_loss_for_distribution",
               "keras.replica_scaling_site",
               "step mode: a Keras loss's global value is the sum of its replicas' values",
               CHECKED, "a Keras loss's global value falls back to the cell's text",
               _probe_replica_scaling, ("scale_loss_for_distribution",)),
    PrivateAPI("keras", "Trainer._initial_epoch", "keras.clear_initial_epoch",
               "--checkpoint on Keras 3 fit: a later plain fit starts at epoch 0", CHECKED,
               "a later plain fit of a resumed model may skip epochs",
               _probe_initial_epoch, ("_initial_epoch",)),
    PrivateAPI("keras", "KerasVariable._value", "keras.wrapped_variable",
               "--checkpoint in step mode: the note naming variables left out", CHECKED,
               "that note may also name variables that are saved",
               _probe_wrapped_variable, ("_value",)),
    PrivateAPI("keras", "KerasVariable._value, keras.src stateless_scope.in_stateless_scope",
               "keras.atomic_variable_updates",
               "parameter_server: Keras 3 metrics updated by several workers lose no update",
               CHECKED, "Keras 3 assign_add/assign_sub read then write: concurrent workers' "
               "updates to one variable can be lost", _probe_atomic_updates,
               ("_value", "in_stateless_scope")),
    PrivateAPI("keras", "LossScaleOptimizer.scale_loss multiplying by dynamic_scale "
               "(Optimizer.scale_loss by loss_scale_factor)", "keras.loss_scalers",
               "step mode's gradient norm under mixed precision, and loss_scale_factor",
               CHECKED, "the gradient norm of a scaled loss's gradients is left scaled",
               _probe_loss_scalers, ("dynamic_scale", "initial_scale", "loss_scale_factor")),
]
