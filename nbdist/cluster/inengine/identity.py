"""Runs on the engines of a user's cluster (``--cluster PROFILE``): who and where each engine
is, and letting go of one that nbdist cannot restart."""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil

from . import ps_server, worker

#: Set on an engine whose process served as an nbdist worker (it cannot serve again).
_SPENT = False


def route_ip(host: str) -> str:
    """The local IP this process would use to reach ``host`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((socket.gethostbyname(host), 9))
            return sock.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def namespaces() -> dict[str, str | None]:
    """This process's kernel instance (Linux boot id) and its network and PID namespaces:
    two processes with equal values share a network stack (loopback reaches the other) or
    see each other's pids. None where the system does not tell (not Linux)."""
    def read(path: str, link: bool = False) -> str | None:
        try:
            if link:
                return os.readlink(path)
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None

    return {"boot_id": read("/proc/sys/kernel/random/boot_id"),
            "netns": read("/proc/self/ns/net", link=True),
            "pidns": read("/proc/self/ns/pid", link=True)}


def link_toward(ip: str) -> dict[str, Any] | None:
    """The network interface holding ``ip`` (this engine's address toward the controller):
    its name, index and the index of the interface it is paired with (``iflink``: a veth
    pair's other end, often in another network namespace). None where Linux does not say."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addresses):
            try:
                with open(f"/sys/class/net/{name}/ifindex") as f:
                    ifindex = int(f.read())
                with open(f"/sys/class/net/{name}/iflink") as f:
                    return {"name": name, "ifindex": ifindex, "iflink": int(f.read())}
            except (OSError, ValueError):
                return None
    return None


def identify(controller_host: str) -> dict[str, Any]:
    """Who and where this engine is, and whether nbdist already used its process."""
    host = socket.gethostname()
    try:
        host_ip = socket.gethostbyname(host)
    except OSError:
        host_ip = None
    ip = route_ip(controller_host)
    return {
        "host": host, "pid": os.getpid(), "started": psutil.Process().create_time(),
        "ip": ip, "host_ip": host_ip, "link": link_toward(ip),
        "used": _SPENT or worker.is_worker() or ps_server.serving(), **namespaces(),
    }


def release_engine() -> None:
    """Stop being a worker and empty the namespace (an engine nbdist cannot restart).

    TensorFlow's MultiWorkerMirroredStrategy (and its gRPC server) stay in the process: it
    is marked spent, and a later nbdist session refuses it.
    """
    global _SPENT
    from IPython import get_ipython

    if worker.release():
        _SPENT = True
    os.environ.pop("TF_CONFIG", None)
    shell = get_ipython()
    if shell is not None:
        shell.reset(new_session=False)
