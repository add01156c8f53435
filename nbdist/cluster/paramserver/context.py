"""The kernel as ParameterServerStrategy's coordinator: connecting, and disconnecting again.

``connect`` builds ParameterServerStrategy and its ClusterCoordinator *in this process*.
That changes the kernel's TensorFlow eager context for good: TensorFlow starts a gRPC
server in the kernel (job ``chief``, a port it picks; like every TensorFlow server it
listens on all interfaces, without authentication) and renames the local devices
``/job:chief/replica:0/task:0/device:CPU:i``. It works whether or not the kernel already
created tensors or logical CPU devices.

``disconnect`` undoes what can be undone: it stops the coordinator's threads and replaces the
context's cluster by the kernel's own task alone (``update_server_def``), so later functions
are no longer registered on the (soon gone) servers and local strategies work again. It
cannot when a worker died during the session: the coordinator's recovery thread then waits
inside TensorFlow, holding the cluster, for that worker to come back, and touching the
context could block the kernel. The kernel is then marked unusable for other strategies
(``check_kernel_usable``) and the user is told to restart it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ...errors import ConfigError

log = logging.getLogger("nbdist.cluster")

#: Why this kernel's TensorFlow context cannot host another strategy (None: it can).
_TAINTED: str | None = None

RESTART_KERNEL = (
    "This kernel's TensorFlow context is still bound to the parameter-server cluster that "
    "was stopped ({why}), and TensorFlow cannot detach it safely. Restart the kernel "
    "(Kernel > Restart), then choose the strategy again."
)


def check_kernel_usable() -> None:
    """Raise a ConfigError if an earlier parameter-server session left the kernel unusable."""
    if _TAINTED is not None:
        raise ConfigError(RESTART_KERNEL.format(why=_TAINTED))


def taint(why: str) -> None:
    global _TAINTED
    _TAINTED = why


def connect(cluster: dict[str, list[str]]) -> tuple[Any, Any]:
    """ParameterServerStrategy over ``cluster`` (worker and ps jobs) and its coordinator."""
    check_kernel_usable()
    import tensorflow as tf

    tf.get_logger().setLevel("WARNING")   # the coordinator logs every closure at INFO
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator


def recovery_blocked(coordinator: Any) -> bool:
    """True while the coordinator waits for a failed worker to come back (TensorFlow's
    recovery thread holds its cluster lock meanwhile)."""
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    lock = getattr(handler, "_cluster_update_lock", None)
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
    cluster = getattr(coordinator, "_cluster", None)
    blocked = worker_died or recovery_blocked(coordinator)
    if cluster is not None:
        _stop_threads(cluster, blocked)
    if blocked:
        taint("a worker died while it was in use, and TensorFlow's coordinator still waits "
              "for it to come back")
        return
    try:
        _detach_context()
    except Exception as err:  # the context is in an unknown state: do not reuse it
        taint(f"detaching failed: {type(err).__name__}: {str(err)[:200]}")


def _stop_threads(cluster: Any, blocked: bool) -> None:
    """``Cluster.stop`` without blocking: its failure handler's ``stop`` takes the lock a
    waiting recovery holds, so then only the flag is cleared (its thread is a daemon)."""
    handler = cluster.failure_handler
    if blocked:
        handler._should_preemption_thread_run = False
    else:
        stopper = threading.Thread(target=handler.stop, daemon=True)
        stopper.start()
        stopper.join(2.0)
    for worker in cluster.workers:
        worker.stop()
    cluster.closure_queue.stop()
    cluster.resource_cancellation_mgr.start_cancel()


def _detach_context() -> None:
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context

    current = context.get_server_def()
    if current is None:
        return
    local = tensorflow_server_pb2.ServerDef()
    local.CopyFrom(current)
    del local.cluster.job[:]
    for job in current.cluster.job:
        if job.name == current.job_name:
            local.cluster.job.add().CopyFrom(job)
    context.context().update_server_def(local)
