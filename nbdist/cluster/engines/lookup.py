"""Finding the cluster ``--cluster NAME[@CLUSTER_ID]`` names: its profile directory, and its
running ipyparallel ``Cluster`` (from the profile's cluster files) or a hand-started
controller's connection file.

Engines that died. ``Cluster.from_file`` lowers an engine set's ``n`` to the engines still
running and rewrites the file with it, so an engine that died (e.g. one started while its host
was cut off, which gave up registering) would be forgotten, and restarting the set would not
bring it back. The number each set was started with is read from the file first and put back
(``missing_engines`` says how many are gone).

One ``Cluster`` per cluster file. A ``Cluster`` loaded from its file watches every process in
it (a thread per engine; for ssh engines an ssh poll per engine every few seconds) and, when one
ends, fetches and removes the engine's log file. A second ``Cluster`` for the same file, as each
``%distribute --cluster`` session used to load, watches the same engines: when they stopped,
both removed the same log file at once, and the one that lost the race failed `%distribute
stop` with ssh's "returned non-zero exit status 1". The ``Cluster`` a session used is kept and
used again while the file still names the processes it knows and those of them on this
machine still run (``_still_current``: where no event loop delivers a launcher's end, as in a
terminal IPython, the ``Cluster`` never learns of it); else the file is loaded afresh, which
checks each process.

Handing back. The engines a session's stop restarts belong to the user's cluster again, whose
`ipcluster stop` fetches and removes their log files too. A Jupyter kernel's ``Cluster`` would
still watch them (ipyparallel runs it on a loop that lives on in a thread) and race that
command for each file, failing it with ssh's exit status 1 (a test process counted as inside
a running loop does so): ``hand_back`` stops watching the engines on other hosts and forgets
the ``Cluster``; the next session loads the file afresh."""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any

from ...errors import ConfigError
from ...hooks.ipyparallel import cluster_running
from .enginelogs import ENGINE_LOG

log = logging.getLogger("nbdist.cluster")

#: cluster file -> the Cluster loaded from it (and since restarted through it, if it was)
_loaded: dict[str, Any] = {}


def resolve_profile(name: str) -> tuple[str, str | None]:
    """``(profile_dir, cluster_id)`` for ``--cluster NAME[@CLUSTER_ID]`` (a profile name or a
    profile directory)."""
    base, _, cluster_id = name.partition("@") if not os.path.isdir(name) else (name, "", "")
    if os.path.isdir(base):
        return os.path.abspath(base), cluster_id or None
    from IPython.core.profiledir import ProfileDir, ProfileDirError
    from IPython.paths import get_ipython_dir

    try:
        found = ProfileDir.find_profile_dir_by_name(get_ipython_dir(), base)
    except ProfileDirError:
        raise ConfigError(
            f"--cluster {name}: there is no IPython profile {base!r} (looked in "
            f"{get_ipython_dir()}) and no directory of that name. Start a cluster first, e.g. "
            f"`ipcluster start --profile {base} --n 2`, or give its profile directory."
        ) from None
    return found.location, cluster_id or None


def find_cluster(profile_dir: str, cluster_id: str | None, label: str) -> Any:
    """The running ipyparallel ``Cluster`` of the profile, or None for a hand-started
    controller (only its ``ipcontroller[-ID]-client.json``)."""
    import ipyparallel as ipp

    pattern = f"cluster-{cluster_id}.json" if cluster_id is not None else "cluster-*.json"
    running = {}
    for path in sorted(glob.glob(os.path.join(profile_dir, "security", pattern))):
        found_id = os.path.basename(path)[len("cluster-"):-len(".json")]
        started = _started(path)
        cluster = _loaded.get(path)
        if cluster is None or not _still_current(cluster, _read(path)):
            try:   # by profile dir: its ipcluster_config.py (launcher settings) is loaded too
                cluster = ipp.Cluster.from_file(profile_dir=profile_dir, cluster_id=found_id,
                                                log=ENGINE_LOG)
            except Exception as err:  # a stale or unreadable cluster file
                log.debug("skipping cluster file %s: %s", path, err)
                continue
            _loaded[path] = cluster
        if cluster.controller is not None and cluster_running(cluster):
            for set_id, engine_set in cluster.engines.items():
                engine_set.n = max(engine_set.n or 0, started.get(set_id, 0))
            running[cluster.cluster_id] = cluster
    if len(running) == 1:
        return next(iter(running.values()))
    if len(running) > 1:
        ids = ", ".join(f"{label}@{cid}" for cid in sorted(running))
        raise ConfigError(f"--cluster {label}: the profile has {len(running)} running clusters "
                          f"({ids}); name one, e.g. `--cluster {label}@{sorted(running)[0]}`.")
    client_file = "ipcontroller-client.json" if not cluster_id else \
        f"ipcontroller-{cluster_id}-client.json"
    if os.path.exists(os.path.join(profile_dir, "security", client_file)):
        return None
    raise ConfigError(
        f"--cluster {label}: no running ipyparallel cluster in {profile_dir} (no live cluster "
        f"file, no {client_file}). Start one, e.g. `ipcluster start --profile-dir "
        f"{profile_dir} --n 2 --daemonize`, or drop --cluster to let nbdist start local "
        "workers."
    )


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _still_current(cluster: Any, on_disk: dict[str, Any]) -> bool:
    """Whether a ``Cluster`` loaded earlier is still what its file describes."""
    import psutil

    sets = list(cluster.engines.values())
    launchers = [cluster.controller, *sets,
                 *(la for es in sets for la in (getattr(es, "launchers", None) or {}).values())]
    for launcher in filter(None, launchers):
        process = getattr(launcher, "process", None)   # local processes only
        try:
            if launcher.state == "after" or process is not None and (
                    not process.is_running() or process.status() == psutil.STATUS_ZOMBIE):
                return False
        except psutil.Error:
            return False
    return _same_processes(cluster.to_dict(), on_disk)


def _same_processes(ours: dict[str, Any], on_disk: dict[str, Any]) -> bool:
    """Whether two cluster-file states name the same controller and engine processes."""
    def processes(state: dict[str, Any]) -> Any:
        controller = (state.get("controller") or {}).get("state") or {}
        sets = (state.get("engines") or {}).get("sets") or {}
        return (controller.get("pid"),
                {set_id: sorted((str(i), e.get("pid")) for i, e in
                                (s.get("engines") or {}).items()) or s.get("pid")
                 for set_id, s in sets.items()})
    try:
        return bool(on_disk) and processes(ours) == processes(on_disk)
    except (AttributeError, TypeError):
        return False


def _started(path: str) -> dict[str, int]:
    """How many engines each set of a cluster file was started with (its ``n``)."""
    try:
        with open(path) as f:
            sets = json.load(f)["engines"]["sets"]
        return {set_id: int(state.get("n") or 0) for set_id, state in sets.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def hand_back(cluster: Any) -> None:
    """Forget ``cluster`` and stop watching its engines on other hosts (ipyparallel's ssh
    launcher threads end at their next poll, having fetched and removed nothing). Engines on
    this machine are still watched: removing a local log file twice only logs an error, and
    their launcher threads must see their process end."""
    from ipyparallel.cluster.launcher import SSHLauncher

    for path in [p for p, loaded in _loaded.items() if loaded is cluster]:
        del _loaded[path]
    for engine_set in cluster.engines.values():
        for launcher in [engine_set, *(getattr(engine_set, "launchers", None) or {}).values()]:
            if isinstance(launcher, SSHLauncher):
                launcher.state = "after"   # told it ended, it does nothing when it ends


def missing_engines(cluster: Any) -> int:
    """Engines of the cluster's sets whose process is gone (sets that track each engine)."""
    return sum(max(0, (engine_set.n or 0) - len(engine_set.launchers))
               for engine_set in cluster.engines.values()
               if isinstance(getattr(engine_set, "launchers", None), dict))
