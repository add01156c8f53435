"""Getting a Stop click to the training loop while the cell is still running.

A kernel runs comm messages (a button click) on its main thread, which is busy running the
cell. Three ways, picked by ``StopSignal(mode="auto")`` in this order:

* ``route`` (ipykernel >= 7.4): every comm message passes, on the kernel's shell-channel thread,
  through a private routing method of the comm (ipykernel uses it to route widget replies to
  subshells). ``hooks.ipykernel.watch_comm`` wraps it on the Stop button's comm, so we see the
  click the moment it arrives and set a ``threading.Event``; the message itself is still
  handled normally when the cell ends. Cost per step: one ``Event.is_set()``.
* ``uipoll``: ``jupyter_ui_poll.ui_events()`` processes pending kernel messages between steps,
  at most every ``poll_interval`` seconds. It needs ``kernel.do_one_iteration``, which
  ipykernel 7.4 removed (jupyter-ui-poll 1.1.0 then silently does nothing).
* ``off``: no live Stop; the button says to interrupt the kernel instead.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..hooks.ipykernel import can_watch_comm, watch_comm

MODES = ("auto", "route", "uipoll", "off")


def _is_click(data: Any) -> bool:
    if not isinstance(data, dict) or data.get("method") != "custom":
        return False
    content = data.get("content")
    return isinstance(content, dict) and content.get("event") == "click"


class StopSignal:
    """A stop request from ``button``, readable between training steps."""

    def __init__(self, button: Any, kernel: Any, mode: str = "auto", poll_interval: float = 0.2):
        if mode not in MODES:
            raise ValueError(f"unknown stop mode {mode!r}; expected one of {MODES}")
        self.event = threading.Event()
        self.poll_interval = poll_interval
        self.polls = 0
        self._button = button
        self._comm = getattr(button, "comm", None)
        self._unwatch: Any = None
        self._unwatch_more: list[Any] = []     # buttons of views added later (``watch``)
        self._ui: Any = None
        self._poll: Any = None
        self._next_poll = 0.0
        button.on_click(self._clicked)
        self.mode = self._choose(mode, kernel)
        if self.mode == "route":
            self._install_route()

    def _choose(self, mode: str, kernel: Any) -> str:
        routable = (can_watch_comm(self._comm)
                    and getattr(kernel, "shell_channel_thread", None) is not None)
        pollable = kernel is not None and hasattr(kernel, "do_one_iteration")
        if mode == "auto":
            return "route" if routable else "uipoll" if pollable else "off"
        if mode == "route" and not routable:
            raise ValueError("stop mode 'route' needs ipykernel >= 7.4 (comm routing hook)")
        return mode

    # -- route -----------------------------------------------------------------------------
    def _install_route(self) -> None:
        self._unwatch = self._watch_clicks(self._comm)

    def _watch_clicks(self, comm: Any) -> Any:
        event = self.event

        def seen(data: Any) -> None:   # runs on the shell-channel thread
            if _is_click(data):
                event.set()

        return watch_comm(comm, seen)

    def watch(self, button: Any) -> None:
        """Another Stop button for the same run (a view for a page that connected mid-run):
        its click stops the run too, seen the same way as the first button's."""
        button.on_click(self._clicked)
        comm = getattr(button, "comm", None)
        if self.mode == "route" and can_watch_comm(comm):
            self._unwatch_more.append(self._watch_clicks(comm))

    # -- uipoll ----------------------------------------------------------------------------
    def _poll_ui(self) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.poll_interval
        if self._poll is None:
            from jupyter_ui_poll import ui_events

            self._ui = ui_events()
            self._poll = self._ui.__enter__()
        self._poll(10)
        self.polls += 1

    # -- public ----------------------------------------------------------------------------
    def _clicked(self, _button: Any = None) -> None:
        self.event.set()

    def requested(self) -> bool:
        """True once Stop was clicked (called between steps, on the kernel's main thread)."""
        if self.event.is_set():
            return True
        if self.mode == "uipoll":
            self._poll_ui()
        return self.event.is_set()

    def close(self) -> None:
        """Undo the hook / leave the polling context (the cell is ending)."""
        if self._unwatch is not None:
            unwatch, self._unwatch = self._unwatch, None
            unwatch()
        while self._unwatch_more:
            self._unwatch_more.pop()()
        if self._ui is not None:
            ui, self._ui, self._poll = self._ui, None, None
            ui.__exit__(None, None, None)
