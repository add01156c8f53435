"""Private tf_keras API: the optimizers' gradient aggregation and callbacks that take tensors.

tf_keras is optional (the ``legacy-keras`` extra): every hook here answers "unavailable" when
it is not installed, and is imported inside the functions only. Checked with tf_keras 2.21.
"""

from __future__ import annotations

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
]
