"""Restarting the engines of a user's cluster (``ProfileEngines``), through ipyparallel.

The engines nbdist used are made to exit at once (quicker than ipyparallel's SIGTERM, then
SIGKILL): ``quit_fn`` on each; a worker blocked in TensorFlow never runs it, so those that have
not answered within ``QUIT_WAIT_S`` are killed by their nanny. An engine on a host that cannot
be reached is left to the restart (its launcher). The controller lists killed engines until
their heartbeats are missed: their ids are retired instead (``retired``). Then every engine set
of the cluster is restarted (``Cluster.restart_engines``), after a foreground ipcluster's
early-shutdown window (``earlystop``).
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from .earlystop import outwait
from .retired import retire

log = logging.getLogger("nbdist.cluster")

#: Seconds the engines nbdist used get to run the quit function before they are killed.
QUIT_WAIT_S = 1.0
#: Seconds their nannies get to kill them before their sets are restarted.
KILL_WAIT_S = 0.5


def restart_engines(cluster: Any, client: Any, profile_dir: str, name: str,
                    used: list[int], quit_fn: Any = None) -> None:
    """Restart every engine set of ``cluster``; ``used`` engines first run ``quit_fn``."""
    outwait(cluster, name)
    if quit_fn is not None:
        _quit(client, used, quit_fn)
    retire(client, profile_dir, client.ids)
    cluster.restart_engines_sync()


def _quit(client: Any, ids: list[int], quit_fn: Any) -> None:
    asked = {}
    for eid in ids:
        try:
            asked[eid] = client[eid].apply_async(quit_fn)
        except Exception as err:  # a dead engine: the restart handles it
            log.debug("could not ask engine %s to quit: %s", eid, err)
    deadline = time.monotonic() + QUIT_WAIT_S
    while not all(ar.ready() for ar in asked.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    blocked = [eid for eid, ar in asked.items() if not ar.ready()]
    if blocked:
        try:
            client.send_signal(signal.SIGKILL, targets=blocked, block=False)
        except Exception as err:
            log.debug("could not signal engines %s: %s", blocked, err)
        time.sleep(KILL_WAIT_S)
