"""Where the workers of an existing ipyparallel cluster are, and how they reach each other.

Used by ``profile`` (``%distribute multiworker --cluster PROFILE``): engines that share this
process's network stack get 127.0.0.1 in TF_CONFIG; otherwise every worker gets an address the
others can reach, and the telemetry channel binds this machine's address toward them.

Locality is decided by what the kernel of the operating system says, never by host names
alone: an engine shares the network stack when it runs on the same kernel instance (Linux
boot id) in the same network namespace (a container or a network namespace keeps the host
name but not the loopback interface), and its pids are this machine's when it is in the same
PID namespace too. Without that information (not Linux) the host name, pid and process start
time decide.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import psutil

from ..inengine.identity import namespaces, route_ip
from .base import ClusterStartError


def same_as_here(ident: dict[str, Any], *keys: str) -> bool | None:
    """Whether ``ident`` has this process's values of ``keys`` (None: unknown on a side)."""
    mine = namespaces()
    if any(mine[k] is None or ident.get(k) is None for k in keys):
        return None
    return all(mine[k] == ident[k] for k in keys)


def shares_network(ident: dict[str, Any]) -> bool:
    """True if the engine described by ``ident`` reaches this process over loopback."""
    same = same_as_here(ident, "boot_id", "netns")
    return is_local(ident) if same is None else same


def is_local(ident: dict[str, Any]) -> bool:
    """True if the engine described by ``ident`` is a process this one can see by its pid."""
    if same_as_here(ident, "boot_id", "pidns") is False:
        return False
    if ident["host"] != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(ident["pid"]).create_time() - ident["started"]) < 0.05
    except psutil.Error:
        return False


def is_loopback(ip: str | None) -> bool:
    """True for a loopback address, a missing one, or one that is not an IP address."""
    try:
        return ip is None or ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return True


def worker_hosts(idents: list[dict[str, Any]], local: list[bool]) -> tuple[list[str], str]:
    """Each worker's TF_CONFIG host, and the address the telemetry channel binds (``local``:
    which engines share this process's network stack)."""
    if all(local):
        return ["127.0.0.1"] * len(idents), "127.0.0.1"
    remote_ips = [d["ip"] for d, here in zip(idents, local, strict=True)
                  if not here and not is_loopback(d["ip"])]
    if not remote_ips:
        raise ClusterStartError(
            "The remote engines reach the controller through 127.0.0.1 (an SSH tunnel?), so "
            "nbdist cannot tell at which address the other workers can reach them. "
            "MultiWorkerMirroredStrategy needs direct TCP connections between workers: start "
            "the engines so that they connect to the controller's network address."
        )
    mine = route_ip(remote_ips[0])   # this machine's address toward the remote engines
    hosts = []
    for d, here in zip(idents, local, strict=True):
        if here:
            hosts.append(mine)
        elif not is_loopback(d["ip"]):
            hosts.append(d["ip"])
        elif not is_loopback(d.get("host_ip")):
            hosts.append(d["host_ip"])
        else:
            raise ClusterStartError(
                f"The engine on {d['host']} (pid {d['pid']}) reports no address other than "
                "127.0.0.1, so the other workers cannot reach it. Give that host a resolvable "
                "network address, or start its engine so that it reaches the controller over "
                "the network rather than a tunnel."
            )
    return hosts, mine
