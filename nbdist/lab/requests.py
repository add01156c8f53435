"""What the JupyterLab extension may ask the kernel over the ``"nbdist"`` comm, and the replies.

The frontend sends::

    {"type": "request", "what": "status"}      # reply: {"type": "status_text", "text": ...}
    {"type": "request", "what": "state"}       # reply: {"type": "state", "state": STATE}

(labextension/src/comm.ts). Unknown requests get no reply. A request for a view of the live
dashboard (``"what": "dashboard"``) is not answered here: ``comm.LabChannel`` hands it to the
running cell's dashboard the moment it arrives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

_log = logging.getLogger(__name__)


def answer_request(what: Any, status_text: Callable[[], str],
                   read_state: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
    """The reply to request ``what`` (None: nothing to send). ``read_state`` returns the
    validated state, or None when it cannot be read."""
    if what == "status":
        return {"type": "status_text", "text": status_text()}
    if what == "state":
        state = read_state()
        return None if state is None else {"type": "state", "state": state}
    _log.debug("nbdist: ignoring unknown frontend request %r", what)
    return None
