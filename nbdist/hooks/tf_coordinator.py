"""Private TensorFlow API of ``ClusterCoordinator``, used by ``%distribute parameter_server``.

The coordinator has no public way to stop its threads, to tell whether it is waiting for a
failed worker, or to tell whether a ``RemoteValue`` is ready without blocking. These hooks
reach into ``tensorflow.python.distribute.coordinator`` (checked with TensorFlow 2.21) and
degrade as each docstring says when an attribute is gone. TensorFlow is imported inside the
probes only.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from .api import PrivateAPI, first_problem, lacks, used_in

CHECKED = "2.21"

#: The file whose log records are the coordinator's own (``logging.LogRecord.pathname`` ends
#: with it): ``tensorflow/python/distribute/coordinator/cluster_coordinator.py``.
COORDINATOR_LOG_FILE = os.path.join("coordinator", "cluster_coordinator.py")


def _failure_handler(coordinator: Any) -> Any:
    return getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)


def recovery_lock(coordinator: Any) -> Any:
    """The lock the coordinator's recovery thread holds while it waits for a failed worker
    (``ClusterCoordinator._cluster.failure_handler._cluster_update_lock``), or None.

    Feature: ``%distribute stop`` after a worker died does not block the kernel. Checked with
    TensorFlow 2.21. Without it (None) nbdist cannot tell that the coordinator waits, and
    stopping detaches the context anyway (which may block if it does).
    """
    return getattr(_failure_handler(coordinator), "_cluster_update_lock", None)


def stop_threads(coordinator: Any, blocked: bool, timeout: float = 2.0) -> bool:
    """Stop the coordinator's threads without blocking (``Cluster.stop`` would wait for the
    lock a waiting recovery holds): then only its preemption flag is cleared
    (``_should_preemption_thread_run``; the thread is a daemon). Stops the worker threads,
    the closure queue and cancels pending resources.

    Feature: ``%distribute stop`` / ``restart`` under parameter_server. Checked with TensorFlow
    2.21. Without it (returns False) the coordinator's daemon threads stay until the kernel
    exits; nothing else changes.
    """
    cluster = getattr(coordinator, "_cluster", None)
    handler = getattr(cluster, "failure_handler", None)
    if cluster is None or handler is None:
        return False
    if blocked:
        handler._should_preemption_thread_run = False
    else:
        stopper = threading.Thread(target=handler.stop, daemon=True)
        stopper.start()
        stopper.join(timeout)
    for worker in getattr(cluster, "workers", ()):
        worker.stop()
    cluster.closure_queue.stop()
    cluster.resource_cancellation_mgr.start_cancel()
    return True


def remote_value_ready(remote: Any) -> bool:
    """Whether a ``RemoteValue`` has its result (or error), without blocking
    (``RemoteValueImpl._status``).

    Feature: parameter_server fit and step recording go on scheduling while earlier steps
    finish. Checked with TensorFlow 2.21. Without it every value counts as ready, so recording
    fetches (and waits for) each step in turn: correct rows, slower scheduling.
    """
    status = getattr(remote, "_status", None)
    if status is None:
        return True
    return getattr(status, "name", None) != "NOT_READY"


def per_worker_dataset_coordinator(value: Any) -> Any:
    """The ``ClusterCoordinator`` of a per-worker dataset (what
    ``coordinator.create_per_worker_dataset`` returns:
    ``coordinator.values.PerWorkerDatasetFromDatasetFunction``, its ``_coordinator``), or None
    when ``value`` is not one.

    Feature: a per-worker dataset as step mode's ``--data`` under parameter_server (and a clear
    refusal elsewhere). Checked with TensorFlow 2.21. Without it such a value is refused as not
    a dataset; a ``tf.data.Dataset`` or a dataset function still work.
    """
    module = sys.modules.get("tensorflow.python.distribute.coordinator.values")
    cls = getattr(module, "PerWorkerDatasetFromDatasetFunction", None)
    if not isinstance(cls, type) or not isinstance(value, cls):
        return None
    return getattr(value, "_coordinator", None)


def per_worker_variable_values(variable: Any) -> list[Any] | None:
    """The per-worker parts of a ``tf.Variable(..., per_worker_variable=True)``
    (``PerWorkerVariable._per_worker_vars._values``: one ``RemoteValue`` per worker, in worker
    order), or None (not created yet, or the attribute is gone).

    Feature: parameter_server step rows are read from each worker on its own, so a dead
    worker's rows are counted as lost while the others' are kept. Checked with TensorFlow
    2.21. Without it the rows are read with the public ``read_all()``: all workers or none, so
    a run in which a worker dies ends with an error instead of going on.
    """
    if not hasattr(variable, "_per_worker_vars"):
        return None
    created = variable._per_worker_vars   # None until a traced function first uses it
    values = getattr(created, "_values", None) if created is not None else ()
    return list(values) if values is not None else None


# -- probes ---------------------------------------------------------------------------------
def _cc() -> Any:
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    return cluster_coordinator


def _probe_cluster() -> str | None:
    cc = _cc()
    return first_problem(
        lambda: used_in(cc.ClusterCoordinator.__init__, "_cluster"),
        lambda: used_in(cc.Cluster.__init__, "failure_handler", "workers", "closure_queue",
                            "resource_cancellation_mgr"),
        lambda: lacks(cc.Worker, "stop"), lambda: lacks(cc._CoordinatedClosureQueue, "stop"))


def _probe_handlers() -> str | None:
    cc = _cc()
    checks = [lambda h=h: first_problem(  # noqa: B023 - bound by the default
                  lambda: lacks(h, "stop"),
                  lambda: used_in(h.__init__, "_cluster_update_lock",
                                      "_should_preemption_thread_run"))
              for h in (cc.CoordinationServicePreemptionHandler, cc.WorkerPreemptionHandler)]
    return first_problem(*checks)


def _probe_remote_status() -> str | None:
    from tensorflow.python.distribute.coordinator import remote_value, values

    return first_problem(lambda: used_in(values.RemoteValueImpl.__init__, "_status"),
                         lambda: lacks(remote_value.RemoteValueStatus, "NOT_READY"))


def _probe_log_file() -> str | None:
    path = _cc().__file__
    return None if path.endswith(COORDINATOR_LOG_FILE) else f"the coordinator is now {path}"


def _probe_per_worker_dataset() -> str | None:
    from tensorflow.python.distribute.coordinator import values

    return first_problem(lambda: lacks(values, "PerWorkerDatasetFromDatasetFunction"),
                         lambda: used_in(values.PerWorkerDatasetFromDatasetFunction.__init__,
                                         "_coordinator"))


def _probe_per_worker_variable() -> str | None:
    from tensorflow.python.distribute import ps_values

    return first_problem(lambda: lacks(ps_values.PerWorkerVariable, "read_all"),
                         lambda: used_in(ps_values.PerWorkerVariable.read_all,
                                         "_per_worker_vars", "_values"))


DECLARED = [
    PrivateAPI("tensorflow", "ClusterCoordinator._cluster (.failure_handler, .workers, "
               ".closure_queue, .resource_cancellation_mgr)", "tf_coordinator.stop_threads",
               "parameter_server: stop/restart ends the coordinator's threads", CHECKED,
               "the coordinator's daemon threads stay until the kernel exits",
               _probe_cluster, ("_cluster",)),
    PrivateAPI("tensorflow", "PreemptionHandler._cluster_update_lock / "
               "_should_preemption_thread_run",
               "tf_coordinator.recovery_lock, stop_threads",
               "parameter_server: stop after a worker died does not block the kernel", CHECKED,
               "nbdist cannot see the coordinator waiting for a dead worker, and stop may "
               "block the kernel", _probe_handlers,
               ("_cluster_update_lock", "_should_preemption_thread_run")),
    PrivateAPI("tensorflow", "RemoteValueImpl._status", "tf_coordinator.remote_value_ready",
               "parameter_server: recording steps without waiting for each", CHECKED,
               "each step's result is fetched in turn (rows are right, scheduling slower)",
               _probe_remote_status, ("_status",)),
    PrivateAPI("tensorflow", "the module path coordinator/cluster_coordinator.py",
               "tf_coordinator.COORDINATOR_LOG_FILE",
               "parameter_server: the coordinator's per-closure failure logs are replaced by "
               "one note",
               CHECKED, "those logs (dozens of lines with gRPC dumps) reach the cell output",
               _probe_log_file, ("cluster_coordinator.py",)),
    PrivateAPI("tensorflow", "coordinator.values.PerWorkerDatasetFromDatasetFunction"
               "._coordinator", "tf_coordinator.per_worker_dataset_coordinator",
               "parameter_server: a per-worker dataset (coordinator.create_per_worker_dataset) "
               "as --data",
               CHECKED, "such a --data is refused as not a dataset (a tf.data.Dataset or a "
               "dataset function still work)", _probe_per_worker_dataset, ("_coordinator",)),
]
