"""Private TensorFlow API used in the kernel: compiled calls, strategies, the eager context.

Checked with TensorFlow 2.21 (``tensorflow-cpu``). TensorFlow is imported inside the functions
only, never when this module is imported. The parameter-server coordinator's internals are in
``tf_coordinator`` (same library, kept apart so each file stays readable).
"""

from __future__ import annotations

import sys
from typing import Any

from .api import PrivateAPI, PrivateAPIMissing, first_problem, lacks, used_in

CHECKED = "2.21"


# -- step mode ------------------------------------------------------------------------------
def can_call_flat(concrete: Any) -> bool:
    """Whether ``call_flat`` works on this concrete function."""
    return callable(getattr(concrete, "_call_flat", None))


def call_flat(concrete: Any, flat_inputs: list[Any]) -> Any:
    """Call a traced ``ConcreteFunction`` with its flattened inputs, skipping the argument
    binding of ``tf.function`` (``ConcreteFunction._call_flat``).

    Feature: step mode's ``FastCall`` (~0.3 ms less per step). Checked with TensorFlow 2.21.
    Without it (``can_call_flat`` is False) every step goes through the ``tf.function``.
    """
    return concrete._call_flat(flat_inputs, concrete.captured_inputs)


def quiet_retracing_warning(tf_function: Any) -> bool:
    """Tell a ``tf.function`` not to warn about "frequent retracing"
    (``Function._omit_frequent_tracing_warning``, what TensorFlow sets on restored functions).

    Feature: step mode, where every cell compiles a fresh ``tf.function`` of the same code.
    Checked with TensorFlow 2.21. Without it TensorFlow may log that warning after a few
    cells; training is unchanged. Returns whether the flag could be set.
    """
    if not hasattr(tf_function, "_omit_frequent_tracing_warning"):
        return False
    tf_function._omit_frequent_tracing_warning = True
    return True


# -- strategies -----------------------------------------------------------------------------
def set_collective_key_base(strategy_class: Any, base: int) -> bool:
    """Number the collectives of MirroredStrategies built from now on from ``base``
    (``MirroredStrategy._collective_key_base``, which TensorFlow's own tests use).

    Feature: a second mirrored strategy in the same kernel (after ``%distribute stop`` or with
    another device count). Checked with TensorFlow 2.21. Without it that second strategy's
    first collective can fail ("Shape mismatch in the collective instance"); returns False.
    """
    if not hasattr(strategy_class, "_collective_key_base"):
        return False
    strategy_class._collective_key_base = base
    return True


# -- the eager context ----------------------------------------------------------------------
def eager_context_initialized() -> bool:
    """Whether this process's TensorFlow eager context exists already (without importing
    TensorFlow): ``context.context_safe()._context_handle``.

    Feature: multiworker preflight says "restart the engine" before MultiWorkerMirroredStrategy
    fails ("Collective ops must be configured at program startup"). Checked with TensorFlow
    2.21. Without it this answers False and TensorFlow's own error is what the user sees.
    """
    context = sys.modules.get("tensorflow.python.eager.context")
    safe = getattr(context, "context_safe", None)
    ctx = safe() if callable(safe) else None
    return ctx is not None and getattr(ctx, "_context_handle", None) is not None


def server_def() -> Any:
    """The kernel's TensorFlow ``ServerDef`` (its cluster and own task), None when the kernel
    is not part of a cluster (``tensorflow.python.eager.context.get_server_def``).

    Feature: ``%distribute status`` under parameter_server (the coordinator's address) and
    ``detach_from_cluster``. Checked with TensorFlow 2.21. Without it: raises
    ``PrivateAPIMissing``; status shows the address as unknown.
    """
    try:
        from tensorflow.python.eager import context
    except ImportError as err:
        raise PrivateAPIMissing(f"tensorflow.python.eager.context is gone ({err})") from None
    if not hasattr(context, "get_server_def"):
        raise PrivateAPIMissing("TensorFlow has no context.get_server_def")
    return context.get_server_def()


def detach_from_cluster() -> None:
    """Shrink the kernel's cluster to its own task (``context.update_server_def``), so later
    functions are no longer registered on the parameter-server cluster's servers.

    Feature: ``%distribute stop`` after parameter_server, then another strategy in the same
    kernel. Checked with TensorFlow 2.21. Without it: raises ``PrivateAPIMissing``; nbdist then
    asks for a kernel restart before another strategy.
    """
    current = server_def()
    if current is None:
        return
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    local = tensorflow_server_pb2.ServerDef()
    local.CopyFrom(current)
    del local.cluster.job[:]
    for job in current.cluster.job:
        if job.name == current.job_name:
            local.cluster.job.add().CopyFrom(job)
    context.context().update_server_def(local)


# -- checkpoints ----------------------------------------------------------------------------
def trackable_class() -> type:
    """TensorFlow's base class of everything a ``tf.train.Checkpoint`` can save
    (``tf.__internal__.tracking.Trackable``).

    Feature: ``--checkpoint`` in step mode finds the objects a cell names. Checked with
    TensorFlow 2.21. Without it: raises ``PrivateAPIMissing``, which says so.
    """
    import tensorflow as tf

    found = getattr(getattr(getattr(tf, "__internal__", None), "tracking", None), "Trackable",
                    None)
    if not isinstance(found, type):
        raise PrivateAPIMissing(
            f"--checkpoint needs tf.__internal__.tracking.Trackable, which TensorFlow "
            f"{tf.__version__} lacks (nbdist was checked with TensorFlow {CHECKED}); drop "
            "--checkpoint or use that TensorFlow version.")
    return found


def is_sharded_variable(value: Any) -> bool:
    """Whether ``value`` is a ``tf.__internal__.distribute.ShardedVariable`` (what
    ParameterServerStrategy with a ``variable_partitioner`` makes of a large variable).

    Feature: a step cell training a Keras 3 model with sharded variables is refused before
    it runs. Checked with TensorFlow 2.21. Without it (False): such a step fails at its
    ``tape.gradient`` line with TensorFlow's AttributeError instead.
    """
    import tensorflow as tf

    found = getattr(getattr(getattr(tf, "__internal__", None), "distribute", None),
                    "ShardedVariable", None)
    return isinstance(found, type) and isinstance(value, found)


# -- distributed input ----------------------------------------------------------------------
def distributed_dataset_strategy(dataset: Any) -> Any:
    """The strategy a ``tf.distribute.DistributedDataset`` was made with
    (``DistributedDataset._strategy``, also on ``DistributedDatasetsFromFunction``), or None.

    Feature: step mode refuses ``--data`` distributed by another strategy than the session's.
    Checked with TensorFlow 2.21. Without it (None) such a dataset is not refused by nbdist and
    TensorFlow fails at the first step with its own error.
    """
    return getattr(dataset, "_strategy", None)


def distributed_from_function(dataset: Any) -> bool:
    """Whether a distributed dataset came from ``distribute_datasets_from_function`` (its
    elements are per-replica batches) rather than ``experimental_distribute_dataset`` (global
    batches): ``tensorflow.python.distribute.input_lib.DistributedDatasetsFromFunction``.

    Feature: step mode's steps per epoch (progress, ETA) for such a ``--data``. Checked with
    TensorFlow 2.21. Without it (False) the progress bar may count the per-replica batches
    as steps; the epoch itself still ends when the data does.
    """
    module = sys.modules.get("tensorflow.python.distribute.input_lib")
    cls = getattr(module, "DistributedDatasetsFromFunction", None)
    return isinstance(cls, type) and isinstance(dataset, cls)


# -- probes ---------------------------------------------------------------------------------
def _probe_call_flat() -> str | None:
    import tensorflow as tf

    concrete = tf.function(lambda: tf.constant(1)).get_concrete_function()
    return first_problem(lambda: lacks(concrete, "_call_flat", "captured_inputs"),
                         lambda: None if call_flat(concrete, []).numpy() == 1 else "wrong value")


def _probe_retracing() -> str | None:
    import tensorflow as tf

    fn = tf.function(lambda: 1)
    return first_problem(lambda: lacks(fn, "_omit_frequent_tracing_warning"),
                         lambda: used_in(type(fn), "_omit_frequent_tracing_warning"))


def _probe_collective_keys() -> str | None:
    import tensorflow as tf
    from tensorflow.python.distribute import mirrored_strategy

    return first_problem(lambda: lacks(tf.distribute.MirroredStrategy, "_collective_key_base"),
                         lambda: used_in(mirrored_strategy.MirroredExtended,
                                             "_collective_key_base"))


def _probe_context_handle() -> str | None:
    import tensorflow  # noqa: F401 - loads tensorflow.python.eager.context
    from tensorflow.python.eager import context

    return first_problem(lambda: lacks(context, "context_safe"),
                         lambda: used_in(context.Context, "_context_handle"))


def _probe_server_def() -> str | None:
    import tensorflow  # noqa: F401
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    return first_problem(lambda: lacks(context, "get_server_def", "context"),
                         lambda: lacks(context.Context, "update_server_def"),
                         lambda: lacks(tensorflow_server_pb2, "ServerDef"))


def _probe_trackable() -> str | None:
    trackable_class()
    return None


def _probe_sharded_variable() -> str | None:
    import tensorflow as tf

    sharded = tf.__internal__.distribute.ShardedVariable([tf.Variable([1.0]),
                                                          tf.Variable([2.0])])
    return None if is_sharded_variable(sharded) else "ShardedVariable is not a class"


def _probe_distributed_dataset() -> str | None:
    from tensorflow.python.distribute import input_lib

    return first_problem(
        lambda: lacks(input_lib, "DistributedDataset", "DistributedDatasetsFromFunction"),
        lambda: used_in(input_lib.DistributedDataset.__init__, "_strategy"),
        lambda: used_in(input_lib.DistributedDatasetsFromFunction.__init__, "_strategy"))


DECLARED = [
    PrivateAPI("tensorflow", "ConcreteFunction._call_flat", "tensorflow.call_flat",
               "step mode's FastCall (calling the traced step without argument binding)",
               CHECKED, "every step goes through tf.function (~0.3 ms more per step)",
               _probe_call_flat, ("_call_flat",)),
    PrivateAPI("tensorflow", "Function._omit_frequent_tracing_warning",
               "tensorflow.quiet_retracing_warning",
               "step mode without TensorFlow's 'frequent retracing' warning", CHECKED,
               "TensorFlow may warn about retracing after a few step cells (training is "
               "unchanged)", _probe_retracing, ("_omit_frequent_tracing_warning",)),
    PrivateAPI("tensorflow", "MirroredStrategy._collective_key_base",
               "tensorflow.set_collective_key_base",
               "a new mirrored strategy in a kernel that already ran one", CHECKED,
               "the second strategy's collectives can clash with the first's ('Shape mismatch "
               "in the collective instance'): restart the kernel between strategies",
               _probe_collective_keys, ("_collective_key_base",)),
    PrivateAPI("tensorflow", "tensorflow.python.eager.context.context_safe()._context_handle",
               "tensorflow.eager_context_initialized",
               "multiworker preflight (an engine that already used TensorFlow is refused)",
               CHECKED, "such an engine fails later with TensorFlow's own 'Collective ops must "
               "be configured at program startup'", _probe_context_handle,
               ("context_safe", "_context_handle")),
    PrivateAPI("tensorflow", "tensorflow.python.eager.context.get_server_def / "
               "Context.update_server_def", "tensorflow.server_def, detach_from_cluster",
               "parameter_server: the coordinator's address in status, and another strategy "
               "after stop",
               CHECKED, "status shows the coordinator address as unknown and after stop the "
               "kernel must be restarted before another strategy", _probe_server_def,
               ("get_server_def", "update_server_def", "tensorflow_server_pb2")),
    PrivateAPI("tensorflow", "input_lib.DistributedDataset._strategy / "
               "DistributedDatasetsFromFunction", "tensorflow.distributed_dataset_strategy, "
               "distributed_from_function",
               "step mode with a tf.distribute.DistributedDataset as --data", CHECKED,
               "a dataset distributed by another strategy is not refused up front (TensorFlow "
               "fails at the first step), and the progress bar may miscount the steps of one "
               "from distribute_datasets_from_function", _probe_distributed_dataset,
               ("_strategy",)),
    PrivateAPI("tensorflow", "tf.__internal__.tracking.Trackable", "tensorflow.trackable_class",
               "--checkpoint in step mode (finding the objects a cell trains)", CHECKED,
               "--checkpoint on a step cell fails with a message naming this API",
               _probe_trackable, ("__internal__",)),
    PrivateAPI("tensorflow", "tf.__internal__.distribute.ShardedVariable",
               "tensorflow.is_sharded_variable",
               "a step training Keras 3 sharded variables (--partitioner) refused up front",
               CHECKED, "such a step fails at tape.gradient with TensorFlow's AttributeError",
               _probe_sharded_variable, ("__internal__",)),
]
