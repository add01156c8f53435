"""The processes that host workers: ipyparallel engines started here (``local``) or those of a
cluster the user runs (``profile``, found by ``lookup``), where they are (``hosts``), all
behind one interface (``base.EngineSet``). ``make`` picks one."""

from __future__ import annotations

from .base import EngineSet


def make(profile: str | None, n: int | None, environment: dict[str, str],
         asked: str | None = None, kernel_connects: bool = False) -> EngineSet:
    """The engines for ``--cluster PROFILE`` (``n``: how many of them, None for all), or
    ``n`` local engines started with ``environment``, isolated from other hosts where this
    machine allows it (``isolation``; ``kernel_connects``: this kernel opens TCP connections
    to the engines' TensorFlow servers)."""
    if profile:
        from .profile import ProfileEngines

        return ProfileEngines(profile, n, asked=asked)
    from .local import LocalEngines

    return LocalEngines(n or 1, environment=environment, kernel_connects=kernel_connects)
