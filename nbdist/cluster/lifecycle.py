"""What the two cluster backends share about their lifetime: every started cluster is known
until it stops (tests check that none is left), and one still running when the interpreter
exits is stopped then, without starting anything (a user's engines are restarted by the
next session instead)."""

from __future__ import annotations

import atexit
import weakref
from typing import Any, TypeVar

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
T = TypeVar("T")


class ClusterLifecycle:
    """Mixed into ``MultiWorkerCluster`` and ``ParameterServerCluster``."""

    engines: Any   # engines.base.EngineSet | None

    def stop(self) -> list[int]:
        raise NotImplementedError

    def _starting(self) -> None:
        _LIVE.add(self)

    def _engines_started(self) -> None:
        # registered after ipyparallel's own atexit hook, so this one runs first (quicker)
        atexit.register(self._stop_at_exit)

    def _stopped(self) -> None:
        _LIVE.discard(self)
        atexit.unregister(self._stop_at_exit)

    def _stop_at_exit(self) -> None:
        try:
            if self.engines is not None:
                self.engines.exiting = True   # a user's cluster: no engine restart now
            self.stop()
        except Exception:  # interpreter shutdown: best effort, never raise
            pass


def live(kind: type[T]) -> list[T]:
    """Clusters of ``kind`` in this process that are not stopped."""
    return [c for c in list(_LIVE) if isinstance(c, kind)]
