"""Private ipyparallel API used by ``--cluster PROFILE`` and isolated local clusters. Checked
with ipyparallel 9.2.

ipyparallel is imported inside the probes only (the hooks work on its objects).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .api import PrivateAPI, first_problem, lacks

CHECKED = "9.2"


def cluster_running(cluster: Any) -> bool:
    """Whether a ``Cluster`` loaded from its file has a running controller or engines
    (``Cluster._is_running``).

    Feature: ``--cluster PROFILE`` picks the profile's running cluster, ignoring stale cluster
    files. Checked with ipyparallel 9.2. Without it the same test is made from the public
    ``controller.state`` and ``engines`` (what ``_is_running`` does in 9.2).
    """
    check = getattr(cluster, "_is_running", None)
    if callable(check):
        return bool(check())
    if cluster.controller is not None and cluster.controller.state != "after":
        return True
    return any(es.state != "after" for es in (cluster.engines or {}).values())


def client_config(client: Any) -> dict[str, Any]:
    """What a ``Client`` read from its connection file (``Client._config``: ``interface``,
    ``location``...), or {}.

    Feature: ``--cluster PROFILE``: the address the workers reach the kernel's telemetry
    channel at. Checked with ipyparallel 9.2. Without it nbdist assumes the controller is on
    127.0.0.1, which engines on other machines cannot reach (local engines still work).
    """
    return dict(getattr(client, "_config", None) or {})


def ipc_aliases(connection_file: str) -> None:
    """Link each ``ipc://`` endpoint of ``connection_file`` as engines and clients name it
    (``<ip>:<port>``) to the file the controller binds (``<ip>-<port>``).

    Feature: isolated local clusters, whose engines reach the controller by ZeroMQ ipc (Unix
    sockets) from their own network namespace. Checked with ipyparallel 9.2, whose
    ``IPController.construct_url`` binds ipc endpoints with "-" while ``IPEngine`` and
    ``Client`` connect with ":": without the links nothing connects over ipc. Where both
    names agree there is nothing to link.
    """
    with open(connection_file) as f:
        info = json.load(f)
    proto, _, base = str(info.get("interface", "")).partition("://")
    if proto != "ipc":
        return
    for value in info.values():
        for port in value if isinstance(value, list) else [value]:
            if isinstance(port, int) and not isinstance(port, bool):
                bound, named = f"{base}-{port}", f"{base}:{port}"
                if not os.path.lexists(named):
                    os.symlink(os.path.basename(bound), named)


def _probe_ipc_names() -> str | None:
    import inspect

    from ipyparallel.controller.app import IPController
    from ipyparallel.engine.app import IPEngine

    if "'-' if" not in inspect.getsource(IPController.construct_url):
        return "IPController.construct_url no longer binds ipc endpoints as <ip>-<port>"
    if "{d['interface']}:{d['registration']}" not in inspect.getsource(IPEngine):
        return "IPEngine no longer connects to ipc endpoints as <ip>:<port>"
    return None


def _probe_is_running() -> str | None:
    import ipyparallel as ipp

    return lacks(ipp.Cluster, "_is_running")


def _probe_client_config() -> str | None:
    import inspect

    import ipyparallel as ipp

    return first_problem(lambda: lacks(ipp.Client, "_config"),
                         lambda: None if "self._config = cfg" in inspect.getsource(
                             ipp.Client.__init__) else "Client.__init__ no longer sets _config")


DECLARED = [
    PrivateAPI("ipyparallel", "Cluster._is_running", "ipyparallel.cluster_running",
               "--cluster PROFILE finds the profile's running cluster", CHECKED,
               "the same test made from public attributes (controller.state, engines)",
               _probe_is_running, ("_is_running",)),
    PrivateAPI("ipyparallel", "Client._config", "ipyparallel.client_config",
               "--cluster PROFILE: the telemetry channel's address toward the engines",
               CHECKED, "the controller is assumed on 127.0.0.1: engines on other machines "
               "cannot send metrics", _probe_client_config, ("_config",)),
    PrivateAPI("ipyparallel", "ipc endpoint names (IPController.construct_url)",
               "ipyparallel.ipc_aliases",
               "isolated local clusters: engines reach the controller over ZeroMQ ipc",
               CHECKED, "links that are not needed are not made; if the names change "
               "otherwise, engines fail to register and the start says so",
               _probe_ipc_names, ("construct_url",)),
]
