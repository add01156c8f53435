"""Private tf_keras API: the optimizers' gradient aggregation, their loss scaling, and
callbacks that take tensors.

tf_keras is optional (the ``legacy-keras`` extra): every hook here answers "unavailable" when
it is not installed, and is imported inside the functions only. Checked with tf_keras 2.21.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .api import PrivateAPI, first_problem, lacks, used_in

CHECKED = "2.21"


def gradient_aggregators() -> list[tuple[type, str]] | str:
    """The tf_keras optimizer methods that all-reduce gradients, as ``(class, name)``, or why
    they cannot be hooked: ``Optimizer.aggregate_gradients`` (the default optimizers) and the
    private ``OptimizerV2._aggregate_gradients`` (``tf_keras.optimizers.legacy``).

    Feature: allreduce_ms in tf_keras ``model.fit`` (multiworker workers) and for tf_keras
    optimizers in step mode. Checked with tf_keras 2.21. Without them fit still runs and
    records; allreduce_ms stays empty and the Run's note says why (this string).
    """
    try:
        import tf_keras
    except ImportError:
        return "tf_keras is not installed"
    try:
        optimizer, legacy = tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer
    except AttributeError as err:
        return f"tf_keras's optimizer classes moved ({err})"
    if not (callable(getattr(optimizer, "aggregate_gradients", None))
            and callable(getattr(legacy, "_aggregate_gradients", None))):
        return "tf_keras's optimizers no longer have aggregate_gradients/_aggregate_gradients"
    return [(optimizer, "aggregate_gradients"), (legacy, "_aggregate_gradients")]


def loss_scalers() -> list[tuple[type, str, Callable[[Any], Any]]] | str:
    """The tf_keras methods that scale a loss for mixed precision, as ``(class, name,
    factor)`` (``factor(optimizer)``: what the loss is multiplied by), or why there are none:
    ``get_scaled_loss`` of the ``LossScaleOptimizer`` classes (the legacy one and
    ``LossScaleOptimizerV3``, which ``tf_keras.mixed_precision.LossScaleOptimizer`` makes for
    the default optimizers: both in the private ``mixed_precision.loss_scale_optimizer``
    module), which multiply by the public ``loss_scale``.

    Feature: step mode's gradient norm under mixed precision (tf_keras). Checked with tf_keras
    2.21. Without them a norm of scaled gradients is left scaled.
    """
    try:
        from tf_keras.src.mixed_precision import loss_scale_optimizer as module
    except ImportError as err:
        return f"tf_keras's loss scale optimizers cannot be imported ({err})"
    classes = [getattr(module, name, None) for name in ("LossScaleOptimizer",
                                                        "LossScaleOptimizerV3")]
    if not all(callable(getattr(cls, "get_scaled_loss", None)) for cls in classes):
        return "tf_keras's LossScaleOptimizer classes moved or lost get_scaled_loss"
    return [(cls, "get_scaled_loss", lambda optimizer: optimizer.loss_scale) for cls in classes]


def accept_tensor_logs(callback: Any) -> bool:
    """Make a tf_keras callback receive each batch's logs as they are (under
    ParameterServerStrategy: RemoteValues) instead of numbers (``Callback._supports_tf_logs``,
    which tf_keras's own progress and history callbacks set).

    Feature: parameter_server fit records every step without syncing the coordinator per
    step. Checked with tf_keras 2.21. Without it (returns False) tf_keras converts the logs,
    which waits for every step, and the steps' workers and times cannot be recorded.
    """
    if not hasattr(callback, "_supports_tf_logs"):   # set to False by Callback.__init__
        return False
    callback._supports_tf_logs = True
    return True


def replica_scaling_site() -> tuple[Any, str] | None:
    """Where tf_keras divides a loss by the replicas in sync (``compute_loss`` and its
    regularization losses under a strategy): ``tf_keras.src.utils.losses_utils`` and
    ``scale_loss_for_distribution``, or None (tf_keras not installed or changed).

    Feature: step mode on multiworker workers reports a tf_keras loss's global value as one
    device computes it. Checked with tf_keras 2.21. Without it such a loss falls back to the
    cell's text.
    """
    try:
        from tf_keras.src.utils import losses_utils
    except ImportError:
        return None
    if not callable(getattr(losses_utils, "scale_loss_for_distribution", None)):
        return None
    return losses_utils, "scale_loss_for_distribution"


def _probe_replica_scaling() -> str | None:
    return None if replica_scaling_site() else (
        "tf_keras.src.utils.losses_utils.scale_loss_for_distribution is gone")


def _probe_aggregators() -> str | None:
    found = gradient_aggregators()
    return found if isinstance(found, str) else None


def _probe_loss_scalers() -> str | None:
    found = loss_scalers()
    if isinstance(found, str):
        return found
    return first_problem(*(lambda cls=cls: used_in(cls.get_scaled_loss, "loss_scale")
                           for cls, _, _ in found))


def _probe_tensor_logs() -> str | None:
    import tf_keras

    return first_problem(lambda: lacks(tf_keras.callbacks.Callback(), "_supports_tf_logs"),
                         lambda: used_in(tf_keras.callbacks.CallbackList,
                                             "_supports_tf_logs"))


DECLARED = [
    PrivateAPI("tf_keras", "tf_keras.src.utils.losses_utils.scale_loss_for_distribution",
               "tf_keras.replica_scaling_site",
               "step mode: a tf_keras loss's global value is the sum of its replicas' values",
               CHECKED, "a tf_keras loss's global value falls back to the cell's text",
               _probe_replica_scaling, ("scale_loss_for_distribution",), optional=True),
    PrivateAPI("tf_keras", "OptimizerV2._aggregate_gradients (and Optimizer.aggregate_gradients)",
               "tf_keras.gradient_aggregators",
               "allreduce_ms in tf_keras model.fit (multiworker) and tf_keras optimizers in "
               "step mode", CHECKED, "allreduce_ms stays empty and the Run's note says why",
               _probe_aggregators, ("_aggregate_gradients",), optional=True),
    PrivateAPI("tf_keras", "Callback._supports_tf_logs", "tf_keras.accept_tensor_logs",
               "parameter_server tf_keras fit recording each step without a sync per step",
               CHECKED, "the fit trains but its steps are not recorded (the Run says so)",
               _probe_tensor_logs, ("_supports_tf_logs",), optional=True),
    PrivateAPI("tf_keras", "src.mixed_precision.loss_scale_optimizer (LossScaleOptimizer, "
               "LossScaleOptimizerV3).get_scaled_loss", "tf_keras.loss_scalers",
               "step mode's gradient norm under mixed precision (tf_keras)", CHECKED,
               "the gradient norm of a scaled loss's gradients is left scaled",
               _probe_loss_scalers, ("loss_scale_optimizer", "LossScaleOptimizerV3"),
               optional=True),
]
