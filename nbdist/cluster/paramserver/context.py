"""The kernel as ParameterServerStrategy's coordinator: connecting, and disconnecting again.

``connect`` builds ParameterServerStrategy and its ClusterCoordinator *in this process*.
That changes the kernel's TensorFlow eager context for good: TensorFlow starts a gRPC
server in the kernel (job ``chief``, a port it picks; like every TensorFlow server it
listens on all interfaces, without authentication) and renames the local devices
``/job:chief/replica:0/task:0/device:CPU:i``. It works whether or not the kernel already
created tensors or logical CPU devices.

``disconnect`` undoes what can be undone: it stops the coordinator's threads and replaces the
context's cluster by the kernel's own task alone, so later functions
are no longer registered on the (soon gone) servers and local strategies work again. It
cannot when a worker died during the session: the coordinator's recovery thread then waits
inside TensorFlow, holding the cluster, for that worker to come back, and touching the
context could block the kernel. The kernel is then marked unusable for other strategies
(``check_kernel_usable``) and the user is told to restart it.

TensorFlow has no public API for any of this: the private calls are in ``nbdist.hooks``
(``tf_coordinator`` for the coordinator's threads, ``tensorflow.detach_from_cluster``); when
one is gone the kernel is marked unusable rather than left in an unknown state.
"""

from __future__ import annotations

import logging
from typing import Any

from ...backends.kernelstate import check_kernel_usable, taint
from ...hooks.tensorflow import detach_from_cluster
from ...hooks.tf_coordinator import recovery_lock, stop_threads
from ...spec import PARTITIONERS, partitioner_parts

log = logging.getLogger("nbdist.cluster")

def partitioner_code(partitioner: str | None, n_ps: int) -> str | None:
    """``--partitioner`` as the TensorFlow expression it stands for (None: no partitioner)."""
    if partitioner is None:
        return None
    kind, number = partitioner_parts(partitioner)
    call = PARTITIONERS[kind]
    return ("tf.distribute.experimental.partitioners."
            + call.replace("NUMBER", str(number)).replace("PS", str(n_ps)))


def make_partitioner(partitioner: str | None, n_ps: int) -> Any:
    """The ``variable_partitioner`` ``--partitioner`` asks for, or None."""
    if partitioner is None:
        return None
    import tensorflow as tf

    kind, number = partitioner_parts(partitioner)
    partitioners = tf.distribute.experimental.partitioners
    if kind == "min_size":   # the parameter-server tutorial's choice: <= one shard per ps
        return partitioners.MinSizePartitioner(min_shard_bytes=number, max_shards=n_ps)
    if kind == "max_size":
        return partitioners.MaxSizePartitioner(max_shard_bytes=number)
    return partitioners.FixedShardsPartitioner(num_shards=number)


def connect(cluster: dict[str, list[str]], partitioner: str | None = None) -> tuple[Any, Any]:
    """ParameterServerStrategy over ``cluster`` (worker and ps jobs) and its coordinator;
    ``partitioner``: ``--partitioner`` (see ``make_partitioner``)."""
    check_kernel_usable()
    import tensorflow as tf

    tf.get_logger().setLevel("WARNING")   # the coordinator logs every closure at INFO
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=make_partitioner(partitioner, len(cluster["ps"])))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator


def recovery_blocked(coordinator: Any) -> bool:
    """True while the coordinator waits for a failed worker to come back (TensorFlow's
    recovery thread holds its cluster lock meanwhile)."""
    lock = recovery_lock(coordinator)
    if lock is None:
        return False
    if lock.acquire(timeout=0.5):
        lock.release()
        return False
    return True


def disconnect(coordinator: Any, worker_died: bool) -> None:
    """Stop ``coordinator``'s threads and detach the kernel's context from its cluster.

    Call it while the servers are still running (detaching from dead servers logs an error
    per remote function). Marks the kernel unusable (see module doc) when it cannot detach.
    """
    blocked = worker_died or recovery_blocked(coordinator)
    if not stop_threads(coordinator, blocked):
        log.debug("this TensorFlow's coordinator cannot be stopped: its threads stay")
    if blocked:
        taint("a worker died while it was in use, and TensorFlow's coordinator still waits "
              "for it to come back")
        return
    try:
        detach_from_cluster()
    except Exception as err:  # the context is in an unknown state: do not reuse it
        taint(f"detaching failed: {type(err).__name__}: {str(err)[:200]}")
