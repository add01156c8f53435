"""Finding the cluster ``--cluster NAME[@CLUSTER_ID]`` names: its profile directory, and its
running ipyparallel ``Cluster`` (from the profile's cluster files) or a hand-started
controller's connection file."""

from __future__ import annotations

import glob
import logging
import os
from typing import Any

from ...errors import ConfigError
from ...hooks.ipyparallel import cluster_running

log = logging.getLogger("nbdist.cluster")


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
        try:   # by profile dir: its ipcluster_config.py (launcher settings) is loaded too
            cluster = ipp.Cluster.from_file(profile_dir=profile_dir, cluster_id=found_id,
                                            log=log)
        except Exception as err:  # a stale or unreadable cluster file
            log.debug("skipping cluster file %s: %s", path, err)
            continue
        if cluster.controller is not None and cluster_running(cluster):
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
