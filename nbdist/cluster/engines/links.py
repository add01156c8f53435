"""Cutting one worker's network link on purpose (``%distribute inject partition``), and
healing it.

Possible where the worker's engine runs on this machine's Linux kernel (same boot id) in a
network namespace of its own (a container, a host of tests/hostbed.py) joined to this
process's namespace by a veth pair: nbdist takes this side's end of the pair down
(``ip link set dev NAME down``), as a pulled cable would. The engine keeps running and
reaches no one. This needs the right to change this namespace's links (root). Engines on
other machines, and engines that share this process's network stack, cannot be cut off one
by one: refused, saying why.

A link nbdist cut comes back up with ``%distribute inject heal WORKER`` and at
``%distribute stop`` / ``restart`` (before the engines are restarted): nbdist leaves no host of
a user's cluster cut off.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from typing import Any

from ...errors import ConfigError
from .hosts import same_as_here

log = logging.getLogger("nbdist.cluster")


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def _veth_ends() -> dict[int, tuple[str, int]]:
    """This namespace's veth interfaces: {ifindex: (name, ifindex of the other end)}."""
    done = _ip("-j", "-d", "link", "show")
    if done.returncode != 0:
        return {}
    return {d["ifindex"]: (d["ifname"], d.get("link_index", -1)) for d in json.loads(done.stdout)
            if (d.get("linkinfo") or {}).get("info_kind") == "veth"}


class LinkControl:
    """The links of a set of engines (``idents``: what each reported, ``inengine.identity``)
    that nbdist can take down; ``cut``: worker -> this side's interface it took down."""

    def __init__(self, idents: list[dict[str, Any]]):
        self.idents = idents
        self.cut: dict[int, str] = {}

    def peer(self, worker: int) -> str:
        """This side's end of worker ``worker``'s link, or a ConfigError saying why none."""
        d = self.idents[worker]
        why = f"`%distribute inject partition {worker}`: worker {worker} (on {d['host']})"
        if same_as_here(d, "boot_id") is not True:
            raise ConfigError(
                f"{why} runs on another machine, whose links nbdist cannot take down from "
                "here. Cut it on that host (e.g. `ip link set dev IFACE down` there, or a "
                "firewall rule), or use `inject kill` / `inject stop` to take the worker away.")
        if same_as_here(d, "netns") is not False:
            raise ConfigError(
                f"{why} shares this kernel's network stack: taking its link down would cut "
                "every process here. Only engines in network namespaces of their own (a "
                "container, tests/hostbed.py's hosts) can be cut off one by one; use "
                "`inject kill` or `inject stop` instead.")
        if shutil.which("ip") is None:
            raise ConfigError(f"{why}: cutting a link needs the `ip` command (iproute2), "
                              "which is not installed here.")
        link = d.get("link") or {}
        ends = _veth_ends()
        end = ends.get(link.get("iflink", -1))
        if not link or end is None or end[1] != link["ifindex"]:
            raise ConfigError(
                f"{why} reaches the others through {link.get('name', 'an interface')} at "
                f"{d['ip']}, which is not one end of a veth pair whose other end is in this "
                "process's network namespace (a macvlan, or a pair ending in another "
                "namespace), so nbdist cannot take it down from here. Take it down by hand "
                "on that host, or use `inject kill` / `inject stop`.")
        return end[0]

    def partition(self, worker: int) -> str:
        """Take worker ``worker``'s link down; returns the interface's name."""
        name = self.cut.get(worker) or self.peer(worker)
        done = _ip("link", "set", "dev", name, "down")
        if done.returncode != 0:
            raise ConfigError(
                f"`%distribute inject partition {worker}`: `ip link set dev {name} down` "
                f"failed: {done.stderr.strip()} (it needs root, or CAP_NET_ADMIN). Nothing "
                "was cut.")
        self.cut[worker] = name
        return name

    def heal(self, worker: int) -> str:
        """Bring back up the link nbdist took down for worker ``worker``."""
        name = self.cut.get(worker)
        if name is None:
            cut = ", ".join(map(str, sorted(self.cut))) or "none"
            raise ConfigError(f"`%distribute inject heal {worker}`: nbdist did not cut worker "
                              f"{worker}'s link (cut now: {cut}); nothing to heal.")
        done = _ip("link", "set", "dev", name, "up")
        if done.returncode != 0:
            raise ConfigError(f"`%distribute inject heal {worker}`: `ip link set dev {name} "
                              f"up` failed: {done.stderr.strip()}. Bring it up by hand.")
        del self.cut[worker]
        return name

    def heal_all(self) -> None:
        """Every link nbdist cut back up (stop, restart); a failure is logged, not raised."""
        for worker in list(self.cut):
            try:
                self.heal(worker)
            except ConfigError as err:
                log.warning("%s", err)
