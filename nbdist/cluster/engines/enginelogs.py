"""What ipyparallel logs when an engine or the controller exits, kept out of the cell's stderr.

When an engine process ends with a non-zero code (a worker killed, or ended by ``%distribute
restart`` / ``stop``), ipyparallel's launcher logs a warning "Output for N:" followed by up to
100 lines of that engine's own log (its start-up, TensorFlow's banner, each request it
handled), then "engine set stopped {...}". Printed as they come, they fill the cell with red
lines that bury nbdist's own one-paragraph error. ``ENGINE_LOG`` is the logger nbdist gives
ipyparallel's ``Cluster``: those records are kept here (``LOGS``, the last ``KEEP``) and shown
once at the end of the cell they arrive in, as one collapsed "worker logs" block (an HTML
``<details>``; one summary line where only text is shown). Other records pass on to the
``nbdist.cluster`` logger as before. ``keep`` adds other libraries' logs of a failing cluster
to the same block (TensorFlow's coordinator: ``paramserver.steps``).
"""

from __future__ import annotations

import collections
import html
import logging
import threading
from typing import Any

from ...words import count

__all__ = ["ENGINE_LOG", "LOGS", "WorkerLogs", "keep", "show_pending"]

#: How many exit records are kept for ``LOGS`` (each holds up to 100 lines of an engine's log).
KEEP = 20

# What ipyparallel (8.x, 9.x) logs when a launched process or an engine set ends.
_EXIT_MESSAGES = ("Output for ", "engine set stopped ", "Controller stopped")


class WorkerLogs(logging.Filter):
    """Keeps ipyparallel's exit records (``LOGS``) instead of letting them print."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: collections.deque[str] = collections.deque(maxlen=KEEP)
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._shell: Any = None        # the shell whose next post_run_cell shows them

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str) or not record.msg.startswith(_EXIT_MESSAGES):
            return True
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format itself: let logging report it
            return True
        with self._lock:
            self.kept.append(text)
            self._pending.append(text)
            self._show_after_cell()
        return False

    def keep(self, text: str) -> None:
        """Keep ``text`` (another library's log of a failing cluster, e.g. TensorFlow's
        coordinator) for the collapsed block, as the exit records are."""
        with self._lock:
            self.kept.append(text)
            self._pending.append(text)
            self._show_after_cell()

    def _show_after_cell(self) -> None:
        """Show what is pending when the running (or next) cell ends, in that cell."""
        if self._shell is not None:
            return
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is not None:
            self._shell = shell
            shell.events.register("post_run_cell", self._after_cell)

    def _after_cell(self, *_: Any) -> None:
        with self._lock:
            shell, self._shell = self._shell, None
            if shell is not None:
                shell.events.unregister("post_run_cell", self._after_cell)
        self.show_pending()

    def show_pending(self) -> None:
        """Display the records kept since the last call as one collapsed block."""
        with self._lock:
            texts, self._pending = self._pending, []
        if not texts:
            return
        from IPython.display import display

        display(_bundle(texts), raw=True)


def _bundle(texts: list[str]) -> dict[str, str]:
    lines = sum(t.count("\n") + 1 for t in texts)
    exited = [t.split(":", 1)[0].removeprefix("Output for ") for t in texts
              if t.startswith("Output for ")]
    stopped = any(t.startswith(_EXIT_MESSAGES) for t in texts)
    sources = " and ".join(name for name, has in (
        ("ipyparallel", stopped),
        ("TensorFlow", not all(t.startswith(_EXIT_MESSAGES) for t in texts))) if has)
    who = (f"engine process{'es' if len(exited) > 1 else ''} {', '.join(exited)} exited"
           if exited else "engines stopped" if stopped else "the cluster's failure")
    title = f"worker logs: {who} ({count(lines, 'line')} from {sources})"
    body = "\n\n".join(texts)
    return {
        "text/plain": f"nbdist: {title}; nbdist.cluster.engines.enginelogs.LOGS keeps them.",
        "text/html": (f"<details class='nbdist-worker-logs'><summary>{html.escape(title)}"
                      f"</summary><pre style='max-height:24em;overflow:auto'>"
                      f"{html.escape(body)}</pre></details>"),
    }


_filter = WorkerLogs()
#: The logger given to ipyparallel's ``Cluster``: a child of ``nbdist.cluster``.
ENGINE_LOG = logging.getLogger("nbdist.cluster.ipyparallel")
ENGINE_LOG.addFilter(_filter)
#: The exit records kept (newest last), each an engine's last lines of output.
LOGS = _filter.kept
show_pending = _filter.show_pending
keep = _filter.keep
