"""``make_backend``: a strategy's backend, the class its family names.

Every family says which backend runs it (``nbdist.families.Family.backend``, imported here when
first used). A new strategy family is one ``Family`` registered in ``nbdist.families`` and, if
no existing backend runs it, one backend module implementing ``backends.base.Backend``.
"""

from __future__ import annotations

from typing import Any

from .backends.base import Backend
from .spec import StrategySpec
from .telemetry.run import RunList


def make_backend(spec: StrategySpec, runs: RunList, shell: Any,
                 keras: str | None = None) -> Backend:
    """The backend for ``spec``, validated but not started (no process, no strategy yet)."""
    if not spec.family.in_kernel and spec.cluster is None:   # processes on this machine
        from .hardware import check_local_processes

        check_local_processes(spec.workers or 0, spec.ps or 0)
    return spec.family.backend_class().create(spec, runs, shell=shell, keras=keras)
