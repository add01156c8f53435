"""Each worker's TF_CONFIG, on free ports. Pure Python: no TensorFlow, no ipyparallel."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now.

    All sockets stay open until every port is chosen, so the ports differ; another process may
    still take one before TensorFlow binds it (TensorFlow then fails with "address already in
    use", which nbdist reports with the fix).
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def cluster_spec(addresses: list[str]) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG for workers at ``addresses`` ("host:port")."""
    return {"worker": list(addresses)}


def tf_config(addresses: list[str], index: int) -> dict[str, Any]:
    """The TF_CONFIG of worker ``index`` (as a dict; ``json.dumps`` it for the environment)."""
    if not 0 <= index < len(addresses):
        raise ValueError(f"worker index {index} is outside 0..{len(addresses) - 1}")
    return {"cluster": cluster_spec(addresses), "task": {"type": "worker", "index": index}}


def local_tf_configs(workers: int, host: str = "127.0.0.1") -> list[dict[str, Any]]:
    """TF_CONFIGs for ``workers`` processes on this machine, on free ports of ``host``."""
    addresses = [f"{host}:{port}" for port in free_ports(workers, host)]
    return [tf_config(addresses, i) for i in range(workers)]


def dumps(config: dict[str, Any]) -> str:
    """TF_CONFIG as the environment variable's text."""
    return json.dumps(config, separators=(",", ":"))
