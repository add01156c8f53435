"""Private ipykernel API: seeing a comm message on the shell-channel thread.

Checked with ipykernel 7.4 (the hook appeared in 7.4). ipykernel is not imported here: the
hook works on the comm object a widget already has.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..displayguard import DisplayGuard
from .api import PrivateAPI, first_problem, lacks, used_in

CHECKED = "7.4"
_DISPLAY = DisplayGuard(logging.getLogger(__name__))


def can_watch_comm(comm: Any) -> bool:
    """Whether ``watch_comm`` works on this comm."""
    return comm is not None and callable(getattr(comm, "_reply_subshell_for", None))


def watch_comm(comm: Any, on_data: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``on_data(data)`` for every message to ``comm`` the moment it arrives, on the
    kernel's shell-channel thread, by wrapping ``Comm._reply_subshell_for`` (which ipykernel
    calls there to route widget replies to subshells). The message is still handled as usual.
    Returns the function that removes the wrapper. ``on_data`` must be quick; its exceptions
    are reported (``DisplayGuard``) and go no further (the kernel's message must never be
    dropped).

    Features: the dashboard's Stop button while a cell runs (stop mode ``route``), a reloaded
    page's request for the live dashboard (``lab.comm``). Checked with
    ipykernel 7.4. Without it (``can_watch_comm`` False) Stop falls back to ``uipoll`` or to
    ``off`` (the button then says to interrupt the kernel).
    """
    original = comm._reply_subshell_for

    def route(data: Any, default: Any) -> Any:   # runs on the shell-channel thread
        with _DISPLAY.guard("route", "nbdist: seeing a page's message on the kernel's shell "
                            "channel failed ({error}), a bug in nbdist; the message was "
                            "delivered as usual."):
            on_data(data)
        return original(data, default)

    comm._reply_subshell_for = route

    def unwatch() -> None:
        try:
            del comm._reply_subshell_for   # back to the class's method
        except AttributeError:
            pass

    return unwatch


def _probe_route() -> str | None:
    from ipykernel import kernelbase
    from ipykernel.comm import Comm

    return first_problem(lambda: lacks(Comm, "_reply_subshell_for"),
                         lambda: used_in(kernelbase, "_reply_subshell_for"))


DECLARED = [
    PrivateAPI("ipykernel", "Comm._reply_subshell_for", "ipykernel.watch_comm",
               "the dashboard's Stop button while a cell runs (stop mode 'route'), the "
               "smoothing slider carried into the final figure, and the live dashboard back "
               "on a page reloaded mid-run", CHECKED,
               "Stop uses jupyter-ui-poll if it works, else the button says to interrupt the "
               "kernel; the final figure is drawn unsmoothed; a page reloaded mid-run gets "
               "no live dashboard", _probe_route,
               ("_reply_subshell_for",)),
]
