"""Private ipyparallel API used by ``--cluster PROFILE``. Checked with ipyparallel 9.2.

ipyparallel is imported inside the probes only (the hooks work on its objects).
"""

from __future__ import annotations

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
]
