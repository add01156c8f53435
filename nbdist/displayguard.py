"""A display must not stop training: the one policy for code that shows something while a cell
trains (the dashboard, the JupyterLab status bar and its verdict, the session's listeners, the
kernel hook that sees the page's messages).

What such code raises is caught by its owner's ``DisplayGuard`` and reported once per kind of
failure: a warning (in a notebook, a line in the cell's output) that names what failed and
says that training goes on, with the traceback when it is a bug in nbdist; later failures of
the same kind are logged at debug level, so that a display failing at every step does not
flood the output. KeyboardInterrupt (a kernel interrupt) is not caught.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

__all__ = ["DisplayGuard"]


class DisplayGuard:
    """Reports the failures of one display (one dashboard, one status channel...): the first
    of each kind as a warning on ``logger``, the later ones at debug level."""

    def __init__(self, logger: logging.Logger):
        self._log = logger
        self._reported: set[str] = set()
        self._lock = threading.Lock()

    def report(self, kind: str, exc: BaseException, text: str, *,
               traceback: bool = True) -> None:
        """``exc`` made the display fail; ``text`` says what failed and what still works,
        with a ``{error}`` where the error goes. ``traceback``: False for an expected failure
        (a lost connection), which needs one line."""
        error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            first = kind not in self._reported
            self._reported.add(kind)
        if first:
            self._log.warning("%s Further failures of this kind are logged at debug level.",
                              text.format(error=error), exc_info=exc if traceback else None)
        else:
            self._log.debug("nbdist: %s failed again (%s)", kind, error, exc_info=exc)

    @contextlib.contextmanager
    def guard(self, kind: str, text: str) -> Iterator[None]:
        """Run the block; what it raises is reported (``report``) and goes no further."""
        try:
            yield
        except Exception as exc:
            self.report(kind, exc, text)
