"""The status of a multi-worker cluster (``%distribute status`` and the lab extension).

Called by ``backend.MultiWorkerCluster.status`` with itself (typed ``Any`` here: this module
does not import the backend it describes)."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil

from ...backends.base import BackendStatus
from ...installed import installed_version
from ...words import count
from ..injection import status_lines
from .monitor import HUNG_AFTER_S


def worker_alive(cluster: Any, index: int) -> bool:
    pid = cluster.info[index].get("pid") if index < len(cluster.info) else None
    if pid is None:
        return False
    local = cluster.engines.local if cluster.engines is not None else []   # [] once stopped
    if index < len(local) and not local[index]:
        # an engine on another machine: judge by its heartbeats
        silent = cluster.monitor.health[index].silent_for()
        return silent is not None and silent < HUNG_AFTER_S
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def backend_status(cluster: Any) -> BackendStatus:
    """What ``%distribute status`` and the lab extension show of a multi-worker cluster."""
    spec = cluster.spec
    info0 = cluster.info[0] if cluster.info else {}
    keras = info0.get("keras", "?")
    lines = [
        f"workers    {_engines_text(cluster)}"
        + (f"  BROKEN: {cluster.broken} Run `%distribute restart`." if cluster.broken else ""),
        f"replicas   {cluster.replicas_local * cluster.n} ({cluster.replicas_local} per worker)",
        f"keras      workers run {keras} as tf.keras; this kernel has keras "
        f"{installed_version('keras')}",
        f"           ({cluster.keras_note})",
        "timeout    " + (f"collectives time out after {cluster.collective_timeout:g} s"
                          if cluster.collective_timeout else
                          "none on collectives; nbdist ends a cell whose workers fail, die, "
                          "hang or stall"),
        f"cluster    {json.dumps(info0.get('tf_config', {}).get('cluster', {}))}",
        f"journal    {journal_text(cluster.journal)}",
        *cluster.network_lines(),
    ]
    now = time.time()
    alive = [worker_alive(cluster, i) for i in range(len(cluster.info))]
    for i, info in enumerate(cluster.info):
        health = cluster.monitor.health[i]
        silent = health.silent_for(now)
        beat = "no heartbeat yet" if silent is None else f"heartbeat {silent:.1f} s ago"
        step = "idle" if health.in_run is None else f"step {health.step}"
        lines += [
            f"worker {i}   {'alive' if alive[i] else 'DEAD'}, pid {info.get('pid')} on "
            f"{info.get('host')}, {beat}, {step}",
            f"           devices   {', '.join(info.get('devices', []))}",
            f"           TF_CONFIG {json.dumps(info.get('tf_config'))}",
        ]
    lines += status_lines(cluster.monitor.injections)
    channel = cluster.channel
    if channel is not None:
        host, port = channel.address
        dropped = sum(channel.dropped.values())
        lines.append(f"channel    {host}:{port} (HMAC-SHA256, JSON), {channel.received} "
                     f"messages, {dropped} dropped" + (f" {dict(channel.dropped)}"
                                                       if dropped else ""))
    return BackendStatus(
        spec=spec, headline=f"{spec.name} ({spec.tf_class})",
        replicas=cluster.replicas_local * cluster.n, devices=cluster.devices,
        details=tuple(lines), workers_total=cluster.n,
        workers_alive=sum(alive),
        dead_workers=tuple(i for i in range(cluster.n) if i >= len(alive) or not alive[i]),
        magic_flags="" if cluster.keras_choice == "auto" else f"--keras {cluster.keras_choice}",
        code_title="Equivalent TensorFlow, in worker i's process:",
        code=equivalent_code(cluster),
    )


def journal_text(journal: Any) -> str:
    """What ``--elastic`` would replay on fresh workers (``journal.Journal``), in one line."""
    entries = journal.entries
    text = (f"{count(len(entries), 'cell or push', 'cells and pushes')} built the workers' "
            "state; --elastic replays them on fresh workers")
    why = journal.refusal([])
    return text + (f" (it cannot: {why})" if why else "")


def _engines_text(cluster: Any) -> str:
    if cluster.engines is not None:
        return cluster.engines.describe()
    return f"{cluster.n} local ipyparallel engines (controller on 127.0.0.1)"


def equivalent_code(cluster: Any) -> str:
    """What each worker process runs, written by hand."""
    info0 = cluster.info[0] if cluster.info else {}
    spec = json.dumps(info0.get("tf_config", {}).get("cluster", {}))
    lines = ["import json, os"]
    if cluster.keras == "legacy":
        lines.append('os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before importing tensorflow')
    lines += [
        "import tensorflow as tf",
        f"cluster = {spec}",
        'os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, '
        '"task": {"type": "worker", "index": i}})',
    ]
    if cluster.collective_timeout:
        lines += [
            "strategy = tf.distribute.MultiWorkerMirroredStrategy(",
            "    communication_options=tf.distribute.experimental.CommunicationOptions(",
            f"        timeout_seconds={cluster.collective_timeout:g}))",
        ]
    else:
        lines.append("strategy = tf.distribute.MultiWorkerMirroredStrategy()")
    return "\n".join(lines)
