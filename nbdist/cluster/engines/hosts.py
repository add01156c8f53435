"""Where the workers of an existing ipyparallel cluster are, and how they reach each other.

Used by ``profile`` (``%distribute multiworker --cluster PROFILE``): engines on this machine
get 127.0.0.1 in TF_CONFIG; with remote engines every worker gets an address the others can
reach, and the telemetry channel binds this machine's address toward them.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import psutil

from ..inengine.identity import route_ip
from .base import ClusterStartError


def is_local(ident: dict[str, Any]) -> bool:
    """True if the engine described by ``ident`` is a process of this machine."""
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
    """Each worker's TF_CONFIG host, and the address the telemetry channel binds."""
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
