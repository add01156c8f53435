"""What the two cluster backends share about their lifetime: every started cluster is known
until it stops (tests check that none is left), and one still running when the interpreter
exits is stopped then, without starting anything (a user's engines are restarted by the
next session instead)."""

from __future__ import annotations

import atexit
import weakref
from typing import Any, TypeVar

import psutil

from .engines.isolation import exposure_line, listening

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
T = TypeVar("T")


class ClusterLifecycle:
    """Mixed into ``MultiWorkerCluster`` and ``ParameterServerCluster``."""

    engines: Any   # engines.base.EngineSet | None

    def stop(self) -> list[int]:
        raise NotImplementedError

    def _starting(self) -> None:
        _LIVE.add(self)
        # the kernel's own listening sockets (Jupyter's): not the cluster's to report
        self._kernel_listening = listening([psutil.Process()])

    def exposure(self) -> str | None:
        """The line saying which ports of this local cluster other hosts can reach, or None
        (none, or the engines are a user's ``--cluster``, secured as the user set it up)."""
        engines = self.engines
        if engines is None or not engines.owned:
            return None
        before = getattr(self, "_kernel_listening", set())
        ports = [port for pid, port in listening([psutil.Process(), *engines.processes()])
                 if (pid, port) not in before]
        return exposure_line(ports, engines.unisolated) if ports else None

    def network_lines(self) -> list[str]:
        """``%distribute status``'s word on who can reach the cluster (none for a user's
        ``--cluster``, whose network is theirs)."""
        engines = self.engines
        if engines is None or not engines.owned:
            return []
        exposed = self.exposure()
        if exposed:
            return [f"network    {exposed.removeprefix('nbdist: ')}"]
        where = ("in a private network namespace" if engines.unisolated is None
                 else "on loopback")
        return [f"network    no port is open to other hosts: the TensorFlow servers run {where}"]

    def _engines_started(self) -> None:
        # registered after ipyparallel's own atexit hook, so this one runs first (quicker)
        atexit.register(self._stop_at_exit)

    def _stopped(self) -> None:
        _LIVE.discard(self)
        atexit.unregister(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        try:
            if self.engines is not None:
                self.engines.exiting = True   # a user's cluster: no engine restart now
            self.stop()
        except Exception:  # interpreter shutdown: best effort, never raise
            pass


def live(kind: type[T]) -> list[T]:
    """Clusters of ``kind`` in this process that are not stopped."""
    return [c for c in list(_LIVE) if isinstance(c, kind)]
