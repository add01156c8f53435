"""Restarting engines that a foreground ``ipcluster start`` still watches.

``ipcluster start`` in the foreground takes engines that stop within
``IPClusterEngines.early_shutdown`` seconds (30 by default) of their start for engines that
failed to connect, and shuts the whole cluster down, controller included (ipyparallel 9.2,
``IPClusterEngines.engines_stopped_early``). nbdist's stop restarts the engines it used, so a
``%distribute stop`` within that window after ``ipcluster start`` used to end the user's
cluster: the next ``--cluster`` line found "no running ipyparallel cluster". The window is
waited out first. It counts from the engine set's start, which ipyparallel writes into the set
id (``int(time.time())``, kept by ``restart_engines``), and only the set ipcluster started is
watched, so a later restart never waits. A cluster not watched by ipcluster (``--daemonize``, or
started from Python) is recognized by its local controller's parent process and never waits.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

import psutil

#: Seconds added to the window: ipcluster starts its timer once every engine was launched.
MARGIN_S = 2.0


def _early_shutdown(cluster: Any) -> float:
    """``early_shutdown`` as the profile's ipcluster_config.py sets it, or ipcluster's default."""
    from ipyparallel.cluster.app import IPClusterStart

    config = getattr(cluster, "profile_config", None) or {}
    for section in ("IPClusterStart", "IPClusterEngines"):
        value = config.get(section, {}).get("early_shutdown")
        if isinstance(value, (int, float)):
            return float(value)
    return float(IPClusterStart.class_traits()["early_shutdown"].default_value)


def _watched_by_ipcluster(cluster: Any) -> bool:
    """Whether a foreground ``ipcluster start`` may watch the engines (its controller's
    parent). A controller on another machine cannot be checked: assumed watched."""
    process = getattr(cluster.controller, "process", None)
    if process is None:
        return True
    try:
        parent = process.parent()
        command = " ".join(parent.cmdline()) if parent is not None else ""
    except psutil.Error:
        return False   # the controller is gone: nothing to protect
    return "ipcluster" in command or "ipyparallel.cluster" in command


def seconds_to_wait(cluster: Any, now: float | None = None) -> float:
    """Seconds before the engines can be stopped without ipcluster ending the cluster."""
    if cluster is None or cluster.controller is None or not cluster.engines:
        return 0.0
    started = [int(m.group(1)) for set_id in cluster.engines
               if (m := re.fullmatch(r"(\d{9,})(?:-\d+)?", str(set_id)))]
    window = _early_shutdown(cluster)
    if not started or window <= 0 or not _watched_by_ipcluster(cluster):
        return 0.0
    now = time.time() if now is None else now
    return max(0.0, max(started) + window + MARGIN_S - now)


def outwait(cluster: Any, profile: str) -> None:
    """Wait until the engines can be restarted, saying why."""
    wait = seconds_to_wait(cluster)
    if wait <= 0:
        return
    print(f"nbdist: waiting {wait:.0f} s before restarting the engines of profile "
          f"{profile!r}: its `ipcluster start` shuts the whole cluster down if its engines "
          f"stop within {_early_shutdown(cluster):.0f} s of starting (it takes that for a "
          "failed start; `c.IPClusterEngines.early_shutdown` in ipcluster_config.py).",
          file=sys.stderr)
    time.sleep(wait)
