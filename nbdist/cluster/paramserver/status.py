"""The status of a parameter-server cluster (``%distribute status`` and the lab extension).

Called by ``backend.ParameterServerCluster.status`` with itself (typed ``Any`` here: this
module does not import the backend it describes)."""

from __future__ import annotations

import json
import os
from typing import Any

from ...backends.base import BackendStatus
from ...hooks import tensorflow as hooks_tf
from ...words import count
from ..injection import status_lines
from .context import partitioner_code
from .health import job_name


def backend_status(cluster: Any) -> BackendStatus:
    """What ``%distribute status`` and the lab extension show of a parameter-server cluster."""
    spec = cluster.spec
    lines = [
        f"roles      coordinator: this kernel (pid {os.getpid()}); "
        f"{count(cluster.n, 'worker')} and "
        f"{count(cluster.n_ps, 'parameter server')}: tf.distribute.Server processes on "
        f"{_engines(cluster)}"
        + (f"  BROKEN: {cluster.broken} Run `%distribute restart`." if cluster.broken else ""),
        f"cluster    {json.dumps(cluster.cluster_spec)}",
        f"kernel     TensorFlow gRPC server of the coordinator: {_coordinator_address()} "
        + ("(in the tasks' private network namespace)" if isolated(cluster) else
           "(all interfaces, no authentication: see docs/guide/security.md)"),
        *cluster.network_lines(),
    ]
    code = partitioner_code(spec.partitioner, cluster.n_ps)
    lines.append(f"variables  sharded by {code} (--partitioner)" if code else
                 "variables  each on one parameter server, round robin (no --partitioner)")
    for job, index in cluster.tasks:
        info = cluster.info.get((job, index), {})
        alive = "alive" if cluster.alive(job, index) else "DEAD"
        role = ("runs the steps the coordinator schedules" if job == "worker"
                else "holds variables; workers pull them and push updates")
        steps = (f", {cluster.steps_by_worker.get(index, 0)} steps run"
                 if job == "worker" else "")
        lines.append(f"{job_name(job):<16} {index}  {alive}, pid {info.get('pid')} on "
                     f"{info.get('host')}, {cluster.cluster_spec[job][index]}{steps}: {role}")
    if cluster.dead_workers:
        lines.append("note       a worker died during a run: ClusterCoordinator re-ran its steps "
                     "on the others; restart the kernel before using another strategy")
    lines += status_lines(cluster.faults.log)
    dead = cluster.dead()["worker"]
    return BackendStatus(
        spec=spec, headline=f"{spec.name} ({spec.tf_class}), asynchronous",
        replicas=cluster.n, devices=cluster.devices, details=tuple(lines),
        workers_total=cluster.n, workers_alive=cluster.n - len(dead),
        dead_workers=tuple(dead), code=equivalent_code(cluster),
    )


def equivalent_code(cluster: Any) -> str:
    """What the processes and the kernel run, written by hand."""
    code = partitioner_code(cluster.spec.partitioner, cluster.n_ps)
    return "\n".join([
        "import tensorflow as tf",
        f"cluster = tf.train.ClusterSpec({json.dumps(cluster.cluster_spec)})",
        "# in the process of each task (job 'worker' or 'ps', index i):",
        "tf.distribute.Server(cluster, job_name=job, task_index=i, protocol='grpc').join()",
        "# in the coordinator (this kernel):",
        "resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, "
        "rpc_layer='grpc')",
        "strategy = tf.distribute.ParameterServerStrategy(resolver"
        + (f", variable_partitioner={code}" if code else "") + ")",
        "coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)",
    ])


def isolated(cluster: Any) -> bool:
    engines = cluster.engines
    return engines is not None and engines.owned and engines.unisolated is None


def _engines(cluster: Any) -> str:
    engines = cluster.engines
    if engines is not None:
        return str(engines.describe())
    return "local ipyparallel engines (controller on 127.0.0.1)"


def _coordinator_address() -> str:
    """The kernel's own task in TensorFlow's cluster (the coordinator's gRPC server)."""
    try:
        server_def = hooks_tf.server_def()
    except Exception:  # not connected, or a TensorFlow without it
        return "unknown"
    if server_def is None:
        return "none"
    return ", ".join(address for job in server_def.cluster.job
                     if job.name == server_def.job_name for address in job.tasks.values())
