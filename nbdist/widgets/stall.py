"""A pause in training, said in the dashboard's header: the plots cannot show that no step has
come for a while (a slow collective, a worker waiting for another, a long input pipeline).

``StallWatch`` runs a daemon thread that calls ``show(idle_seconds)`` about once a second while
``seen()`` has not been called for ``after_s`` seconds; ``close()`` ends it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["StallWatch", "stall_note"]


def stall_note(idle_s: float) -> str:
    """The header's addition during a pause."""
    return (f"<span style='white-space:nowrap;color:#9a6700'>no new step for "
            f"{idle_s:.0f} s</span>")


class StallWatch:
    def __init__(self, after_s: float, show: Callable[[float], None]):
        self.after_s = after_s
        self._show = show
        self._last = time.monotonic()
        self._closed = threading.Event()
        threading.Thread(target=self._loop, name="nbdist-stall-watch", daemon=True).start()

    def seen(self) -> None:
        """A step (a redraw) just happened."""
        self._last = time.monotonic()

    def idle(self) -> float:
        return time.monotonic() - self._last

    def close(self) -> None:
        self._closed.set()

    def _loop(self) -> None:
        while not self._closed.wait(min(1.0, self.after_s / 2)):
            idle = self.idle()
            if idle >= self.after_s:
                try:
                    self._show(idle)
                except Exception:  # noqa: S110 - a failed note must not kill anything
                    return
