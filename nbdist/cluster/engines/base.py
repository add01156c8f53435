"""What every set of worker engines offers: ``local.LocalEngines`` (started by nbdist on this
machine, stopped with it) and ``profile.ProfileEngines`` (a cluster the user runs: used,
restarted at stop, never killed). The families' backends use only this interface;
``engines.make`` picks the class. Where a capability is not offered (links nbdist can cut,
pids known from the start) the set says so with None or an empty value, so that callers never
probe for an attribute."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol

import psutil

from ..failures import ClusterStartError as ClusterStartError  # what starting engines raises

#: Seconds to wait for engines to register with the controller.
START_TIMEOUT_S = 120.0


class EngineSet(Protocol):
    """ipyparallel engines that host one worker (or TensorFlow task) each."""

    #: True if nbdist started these engines (and kills them at stop); False for a user's
    #: cluster, whose engines outlive the kernel and are restarted instead.
    owned: bool
    client: Any                 # the ipyparallel Client
    ids: list[int]              # engine id of worker i
    local: list[bool]           # worker i's engine runs on this machine
    remote: list[bool]          # worker i's engine does not share this process's network stack
    channel_host: str           # where the telemetry channel binds so that engines reach it
    exiting: bool               # set at interpreter exit: no engine is started then
    #: Why these engines share this machine's network (``isolation``), None if they do not
    #: or are not nbdist's to isolate (a user's cluster).
    unisolated: str | None
    #: The workers' network links nbdist can cut and heal (``links.LinkControl``, for
    #: ``%distribute inject partition``), or None where none can be cut one by one.
    links: Any

    @property
    def pids(self) -> dict[int, int]:
        """{engine id: pid} of the engines watched and signalled by pid from their start
        (before their workers report themselves); empty where nbdist does not know them."""

    def start(self) -> None: ...
    def mark_used(self) -> None:
        """nbdist code has run on the engines: stop must clean them up."""
    def kernel_server_network(self) -> contextlib.AbstractContextManager[None]:
        """Where the kernel starts a TensorFlow server of its own (the coordinator's) so
        that the engines reach it: in their network namespace when they have one."""
    def task_addresses(self) -> list[str]:
        """``host:port`` for each engine's TensorFlow server (a port free on its host)."""
    def describe(self) -> str: ...
    def kill_blocked(self, pids: list[int]) -> None:
        """End engine processes stuck in TensorFlow's start-up (they cannot quit by
        themselves, and SIGTERM waits seconds)."""
    def restart_advice(self, family: str) -> str:
        """How the user gets engines with the kernel's environment again (``family``: the
        strategy name of the ``%distribute`` line)."""
    def controller_gone(self) -> int | None:
        """The pid of the ipyparallel controller once its process is gone (it carries every
        call to the engines and their results back: without it the engines cannot be
        reached), else None: alive, or not watched (a user's cluster, whose controller
        nbdist did not start and may run on another machine)."""
    def remember_processes(self) -> None: ...
    def processes(self) -> list[psutil.Process]: ...
    def send_signal(self, sig: int, engine_ids: list[int]) -> None: ...
    def stop(self, timeout: float = 1.0, quit_fn: Any = None) -> list[int]: ...


def nbdist_pythonpath() -> str:
    """PYTHONPATH for engines: the directory holding this nbdist first, then the current one."""
    here = str(Path(__file__).resolve().parents[3])   # engines/ cluster/ nbdist/ -> its parent
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join(p for p in (here, rest) if p)
