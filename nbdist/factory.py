"""``make_backend``: the one place that maps a strategy name to its backend.

A new strategy family is one backend module (implementing ``backends.base.Backend``) and one
entry in ``FAMILIES``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .backends.base import Backend
from .spec import StrategySpec
from .telemetry.run import RunList

#: strategy name -> "module:class" of its backend (imported when first used)
FAMILIES: dict[str, str] = {
    "one_device": "nbdist.backends.local:LocalBackend",
    "mirrored": "nbdist.backends.local:LocalBackend",
    "central_storage": "nbdist.backends.local:LocalBackend",
    "tpu": "nbdist.backends.local:LocalBackend",
    "multiworker": "nbdist.cluster.multiworker.backend:MultiWorkerCluster",
    "parameter_server": "nbdist.cluster.paramserver.backend:ParameterServerCluster",
}


def backend_class(name: str) -> Any:
    module, _, cls = FAMILIES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def make_backend(spec: StrategySpec, runs: RunList, shell: Any,
                 keras: str | None = None) -> Backend:
    """The backend for ``spec``, validated but not started (no process, no strategy yet)."""
    return backend_class(spec.name).create(spec, runs, shell=shell, keras=keras)
