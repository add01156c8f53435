"""Telling a partitioned host from a slow worker, for workers on other hosts.

A worker on another host whose heartbeats (one a second) stopped for ``SILENT_S`` while it
runs a call is probed: the kernel opens a TCP connection to the worker's TensorFlow server
(its TF_CONFIG address). A host that answers (the connection is accepted, or refused because
the process is gone) is reachable, and the worker is left to the other checks (a stopped or
stuck process keeps its host's network answering). No answer within ``PROBE_TIMEOUT_S``, or no
route, means the host is cut off: the call is ended at once with ``WorkerUnreachable`` naming
the host, the worker and its last step, since the others are blocked in a collective waiting
for it and TensorFlow would only notice at its collective timeout. ``restart`` probes the
hosts lost that way again and refuses quickly while they are still cut off.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from ..engines.base import EngineSet
from ..failures import WorkerUnreachable

#: Seconds without a heartbeat before a remote worker's host is probed.
SILENT_S = 3.0
#: Seconds a probe waits for the host to answer.
PROBE_TIMEOUT_S = 1.0


def unreachable(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``host:port`` got no answer, or None if the host answered (accepted or refused)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as err:
        return err.strerror or str(err)


@dataclass
class RemoteWorker:
    index: int
    hostname: str      # what the host calls itself
    address: str       # its TensorFlow server, host:port

    @property
    def where(self) -> str:
        return f"worker {self.index} on {self.hostname} ({self.address.rsplit(':', 1)[0]})"

    def probe(self) -> str | None:
        host, port = self.address.rsplit(":", 1)
        return unreachable(host, int(port))


class ReachWatch:
    """Probes the hosts of silent remote workers during a call (``Dispatcher``)."""

    def __init__(self, workers: list[RemoteWorker]):
        self.workers = {w.index: w for w in workers}
        self.lost: dict[int, RemoteWorker] = {}
        self._probed: dict[int, float] = {}

    def check(self, monitor: Any, results: dict[int, Any]) -> None:
        """Raise ``WorkerUnreachable`` for a busy remote worker whose host stopped answering."""
        now = time.time()
        for index, remote in self.workers.items():
            silent = monitor.health[index].silent_for(now)
            if (silent is None or silent < SILENT_S or results[index].ready()
                    or now - self._probed.get(index, 0.0) < 1.0):
                continue
            self._probed[index] = now
            why = remote.probe()
            if why is not None:
                self.lost[index] = remote
                raise WorkerUnreachable(self._message(remote, why, silent, monitor, results))

    def _message(self, remote: RemoteWorker, why: str, silent: float, monitor: Any,
                 results: dict[int, Any]) -> str:
        step = monitor.health[remote.index].step
        seen = f"last step seen: {step - 1}" if step else "no step seen yet"
        waiting = sorted(w for w, ar in results.items() if w != remote.index and not ar.ready())
        others = (f" Workers {', '.join(map(str, waiting))} were waiting for it in a collective "
                  "and are stopped with the run." if waiting else "")
        return (f"{remote.where} is unreachable: no heartbeat for {silent:.0f} s ({seen}) and "
                f"its TensorFlow server at {remote.address} does not answer ({why}): a "
                f"network partition, or the host is down. The run was aborted.{others} "
                "`%distribute stop` frees the other engines now; once the host is back, "
                "`%distribute restart` starts fresh workers.")



def refuse_restart_while_lost(watch: ReachWatch | None) -> None:
    """Raise if a host lost during a call still does not answer (re-probed now), rather than
    wait for engines that cannot register."""
    lost = [r.where for r in (watch.lost.values() if watch else []) if r.probe() is not None]
    if lost:
        raise WorkerUnreachable(
            f"{'; '.join(lost)} still does not answer, so no fresh workers were started there "
            "(the other engines were restarted). Run `%distribute restart` again once the "
            "host is back, or `%distribute stop` and start on the reachable hosts with "
            "`--workers N`.")


def watch_remote(engines: EngineSet, info: list[dict[str, Any]]) -> ReachWatch | None:
    """A ``ReachWatch`` over the workers on other hosts, or None when all are local."""
    remote = engines.remote
    if not any(remote):
        return None
    addresses = info[0]["tf_config"]["cluster"]["worker"]
    return ReachWatch([RemoteWorker(i, str(info[i].get("host")), addresses[i])
                       for i, far in enumerate(remote) if far])
