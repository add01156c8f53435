"""The kernel side of nbdist's JupyterLab extension: session state over a Jupyter comm.

The kernel opens a comm with target ``"nbdist"`` (through the ``comm`` package, which
ipykernel wires to its own comm manager) and sends::

    {"type": "state", "state": STATE}          # on open, then whenever STATE changes

where STATE is a ``LabState`` as JSON (``LabState.to_json``). The frontend may send requests (for
the state, or the text of ``%distribute status``: ``requests``). A frontend that reloads (and
so lost the kernel's comm) opens its own comm to the same target with the ``"state"`` request
as its open data; the kernel keeps every open comm and sends to each. The kernel handles
frontend messages only while it is idle (the shell channel).

While a cell runs, a page that connected since (a reload, a second tab) learns the comm's id
from the state messages it sees and asks on it for a view of the live dashboard::

    {"type": "request", "what": "dashboard", "token": T}

That request is seen the moment it arrives, on the kernel's shell-channel thread
(``hooks.ipykernel.watch_comm``), and handed to the dashboard ``serve_views`` registered; the
dashboard answers through the ``reply`` it is given (``widgets.dashboard.view_message``), or
``{"type": "dashboard", "token": T, "run": None}`` comes back at once when none is live.

State messages are throttled to one per ``min_interval`` seconds (5 per second by default):
a change that comes sooner is kept and sent by the next :meth:`LabChannel.publish` or
:meth:`LabChannel.flush` call, or by a one-shot timer, so the latest state always arrives.

Without a frontend (terminal IPython) the ``comm`` package hands out a dummy comm and all of
this is a no-op. Nothing here raises into its caller. A lost connection (what the comm
machinery raises without one: ``COMM_ERRORS``) is logged once as a warning and the channel
carries on; anything else is a bug in nbdist (in the state or status it reads, or in the
channel), logged once as a warning with its traceback.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import zmq

from ..displayguard import DisplayGuard
from ..hooks.ipykernel import can_watch_comm, watch_comm
from .requests import answer_request
from .state import RUN_STATUSES, LabState

__all__ = [
    "COMM_ERRORS",
    "RUN_STATUSES",
    "TARGET_NAME",
    "LabChannel",
    "LabState",
]

#: The comm target the JupyterLab extension registers on every kernel.
TARGET_NAME = "nbdist"
#: Delays (seconds) before re-opening a comm that a frontend closed; then give up until open().
REOPEN_DELAYS = (0.0, 5.0, 30.0)
#: What the comm machinery raises when there is no connection to send on: ``comm.create_comm``
#: with no comm manager (RuntimeError), iopub's socket closed or its context terminated while
#: the kernel shuts down (zmq.ZMQError), a failed write (OSError).
COMM_ERRORS: tuple[type[Exception], ...] = (OSError, RuntimeError, zmq.ZMQError)

_log = logging.getLogger(__name__)
_Method = TypeVar("_Method", bound=Callable[..., None])
#: Sends one message to the page that asked (on the comm it asked on).
Reply = Callable[[dict[str, Any]], None]
#: Where requests for a view of the live dashboard go: ``source(token, reply)``.
ViewSource = Callable[[str, Reply], None]


def _never_raises(method: _Method) -> _Method:
    """Run a public method of LabChannel so that no exception reaches its caller.

    Its callers are the training loop (through the session's listeners, which drop what a
    listener raises without a word), `%load_ext nbdist` and IPython's post_run_cell event: a
    status bar that raised there would stop training or the extension from loading, or fail
    unseen. A lost connection is handled where the comm is used, so what arrives here is a bug;
    it is logged once with its traceback (a kernel shows it in the cell's output) rather than
    on every step, and the channel carries on. KeyboardInterrupt (a kernel interrupt) passes.
    """

    @functools.wraps(method)
    def guarded(self: LabChannel, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:
            self._bug(method.__name__, exc)

    return guarded  # type: ignore[return-value]


def _default_comm_factory(**kwargs: Any) -> Any:
    import comm

    # Looked up at call time: ipykernel replaces comm.create_comm when it starts.
    return comm.create_comm(**kwargs)


def _default_comm_manager() -> Any:
    import comm

    return comm.get_comm_manager()


class LabChannel:
    """Sends nbdist's state to the JupyterLab extension and answers its requests.

    ``state_provider()`` returns the current ``LabState``; ``status_text()`` returns the text
    of ``%distribute status``. Call :meth:`open` when the extension loads, :meth:`publish`
    whenever the state may have changed (cheap when it has not), :meth:`flush` at the end of
    a run, and :meth:`close` on unload. Safe to call from any thread.
    """

    def __init__(
        self,
        state_provider: Callable[[], LabState],
        status_text: Callable[[], str],
        *,
        min_interval: float = 0.2,
        auto_flush: bool = True,
        clock: Callable[[], float] = time.monotonic,
        comm_factory: Callable[..., Any] | None = None,
        comm_manager: Callable[[], Any] | None = None,
    ) -> None:
        self._state_provider = state_provider
        self._status_text = status_text
        self._min_interval = min_interval
        self._auto_flush = auto_flush
        self._clock = clock
        self._comm_factory = comm_factory or _default_comm_factory
        self._comm_manager = comm_manager or _default_comm_manager
        self._lock = threading.RLock()
        self._comms: list[Any] = []
        self._opened = False
        self._last_sent: dict[str, Any] | None = None
        self._last_send_time = -float("inf")
        self._pending: dict[str, Any] | None = None
        self._timer: threading.Timer | None = None
        self._reopens = 0
        self._last_close_time = -float("inf")
        self._display = DisplayGuard(_log)   # each kind of failure: warned once, then debug
        self._views: ViewSource | None = None
        self._watched: dict[int, Callable[[], None]] = {}   # id(comm) -> remove its hook
        self._replies: dict[int, Reply] = {}                # id(comm) -> its reply function

    # -- public API --------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether at least one comm to a frontend is open."""
        return bool(self._comms)

    @_never_raises
    def open(self) -> None:
        """Open the comm (sending the current state) and accept frontend-opened comms."""
        with self._lock:
            self._opened = True
            self._reopens = 0
            self._comm_manager().register_target(TARGET_NAME, self._on_frontend_open)
            if not self._comms:
                self._open_comm(self._read_state() or LabState.empty().to_json())
                return
        self.publish()

    @_never_raises
    def publish(self) -> None:
        """Read the state; send it if it changed (throttled, the latest always delivered)."""
        state = self._read_state()
        if state is None:
            return
        with self._lock:
            if not self._opened:
                return
            if not self._comms:
                self._maybe_reopen(state)
                return
            if state == self._last_sent:
                self._pending = None
                return
            wait = self._last_send_time + self._min_interval - self._clock()
            if wait <= 0:
                self._send_state(state)
            else:
                self._pending = state
                self._schedule(wait)

    @_never_raises
    def flush(self) -> None:
        """Send the current state now if the frontend does not have it, ignoring throttling."""
        state = self._read_state()
        with self._lock:
            self._cancel_timer()
            if state is None:
                state, self._pending = self._pending, None
            if state is None or not self._opened:
                return
            if not self._comms:
                self._maybe_reopen(state)
            elif state != self._last_sent:
                self._send_state(state)
            else:
                self._pending = None

    def serve_views(self, source: ViewSource | None) -> None:
        """While a cell runs, send pages' requests for a view of its live dashboard to
        ``source(token, reply)``, called on the kernel's shell-channel thread (it must only
        take note); None when the cell ends. ``reply(message)`` may be called from any thread,
        as often as needed (the final figure goes the same way), and never raises."""
        with self._lock:
            self._views = source

    @_never_raises
    def close(self) -> None:
        """Close every comm and stop accepting new ones. ``open()`` starts again."""
        with self._lock:
            self._opened = False
            self._cancel_timer()
            self._pending = None
            comms, self._comms = self._comms, []
            for c in comms:
                self._unwatch(c)
                try:
                    c.close()
                except (*COMM_ERRORS, KeyError) as exc:   # KeyError: no longer registered
                    self._lost("close", exc)
            with contextlib.suppress(KeyError):   # never registered: open() failed first
                self._comm_manager().unregister_target(TARGET_NAME, self._on_frontend_open)

    # -- sending -----------------------------------------------------------------------------

    def _read_state(self) -> dict[str, Any] | None:
        """The provider's state as JSON; None (and a warning) on error.

        The provider is the session's code: whatever it raises is a bug there, reported, and
        the frontend keeps the last state it had (or gets the empty state on open)."""
        try:
            return self._state_provider().to_json()
        except Exception as exc:
            self._bug("state provider", exc)
            return None

    def _open_comm(self, state: dict[str, Any]) -> None:
        try:
            c = self._comm_factory(target_name=TARGET_NAME, data={"type": "state", "state": state})
        except COMM_ERRORS as exc:
            self._lost("open a comm", exc)
            return
        self._attach(c)
        self._mark_sent(state)

    def _attach(self, c: Any) -> None:
        c.on_msg(lambda msg, c=c: self._on_msg(c, msg))
        c.on_close(lambda msg, c=c: self._on_close(c))
        self._comms.append(c)
        if can_watch_comm(c):
            self._watched[id(c)] = watch_comm(c, lambda data, c=c: self._on_arrival(c, data))

    def _unwatch(self, c: Any) -> None:
        unwatch = self._watched.pop(id(c), None)
        if unwatch is not None:
            unwatch()
        self._replies.pop(id(c), None)

    def _mark_sent(self, state: dict[str, Any]) -> None:
        self._last_sent = state
        self._last_send_time = self._clock()
        self._pending = None
        self._cancel_timer()

    def _send(self, data: dict[str, Any], comms: list[Any] | None = None) -> None:
        for c in list(self._comms if comms is None else comms):
            try:
                c.send(data)
            except COMM_ERRORS as exc:
                self._lost("send", exc)

    def _send_state(self, state: dict[str, Any], comms: list[Any] | None = None) -> None:
        self._send({"type": "state", "state": state}, comms)
        if comms is None:
            self._mark_sent(state)

    def _maybe_reopen(self, state: dict[str, Any]) -> None:
        """Re-open after every frontend closed our comm, a few times with growing delays."""
        if self._reopens >= len(REOPEN_DELAYS):
            return
        if self._clock() - self._last_close_time < REOPEN_DELAYS[self._reopens]:
            return
        self._reopens += 1
        self._open_comm(state)

    # -- the timer that delivers a throttled state -------------------------------------------

    def _schedule(self, wait: float) -> None:
        if not self._auto_flush or self._timer is not None:
            return
        self._timer = threading.Timer(wait, self._on_timer)
        self._timer.daemon = True
        self._timer.start()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        # On the timer's thread: what escapes is a bug, which threading reports with its
        # traceback; it stops nothing but this one delivery.
        with self._lock:
            self._timer = None
            if self._pending is not None and self._comms:
                self._send_state(self._pending)

    # -- messages from the frontend ----------------------------------------------------------

    def _on_frontend_open(self, c: Any, msg: dict[str, Any]) -> None:
        with self._lock:
            self._attach(c)
            self._reopens = 0
        self._on_msg(c, msg)

    def _on_arrival(self, c: Any, data: Any) -> None:
        """A message to comm ``c``, seen on the shell-channel thread as it arrives (the main
        thread may be busy running a cell for a long time): a request for a view."""
        if isinstance(data, dict) and data.get("type") == "request" and (
                data.get("what") == "dashboard"):
            self._view_request(c, data)

    def _view_request(self, c: Any, data: dict[str, Any]) -> None:
        token = data.get("token")
        if not isinstance(token, str):
            _log.debug("nbdist: ignoring a dashboard request without a token")
            return
        with self._lock:
            source = self._views
            reply = self._replies.get(id(c))
            if reply is None:
                reply = self._replies[id(c)] = functools.partial(self._reply, c)
        if source is None:
            reply({"type": "dashboard", "token": token, "run": None})
        else:
            source(token, reply)

    def _reply(self, c: Any, data: dict[str, Any]) -> None:
        with self._lock:
            if c in self._comms:
                self._send(data, [c])

    def _on_msg(self, c: Any, msg: dict[str, Any]) -> None:
        # Called by the comm manager, which logs what escapes with its traceback (a bug).
        data = msg.get("content", {}).get("data") or {}
        if data.get("type") != "request":
            return
        with self._lock:
            self._reopens = 0  # a frontend is listening
        if data.get("what") == "dashboard":
            if id(c) not in self._watched:     # else seen as it arrived (_on_arrival)
                self._view_request(c, data)
            return
        reply = answer_request(data.get("what"), self._safe_status_text, self._read_state)
        if reply is not None:
            with self._lock:
                self._send(reply, [c])

    def _safe_status_text(self) -> str:
        """The status text; on a bug in the session's code, a line naming it, reported."""
        try:
            return str(self._status_text())
        except Exception as exc:
            self._bug("status text", exc)
            return f"nbdist could not produce its status: {type(exc).__name__}: {exc}"

    def _on_close(self, c: Any) -> None:
        with self._lock:
            self._unwatch(c)
            if c in self._comms:
                self._comms.remove(c)
            self._last_close_time = self._clock()

    # -- reporting: once each, as a status bar that fails on every step must not flood -----

    def _lost(self, what: str, exc: BaseException) -> None:
        """The connection to the frontend failed (no kernel, iopub closed): expected as a
        kernel shuts down, so one line without a traceback."""
        self._display.report("lost", exc, traceback=False, text=(
            f"nbdist: the JupyterLab status channel lost its connection ({what}: {{error}}); "
            "the extension may show stale state."))

    def _bug(self, what: str, exc: BaseException) -> None:
        """A bug in nbdist's code behind the status bar: the traceback, to be reported."""
        self._display.report("bug", exc, (
            f"nbdist: the JupyterLab status bar failed in {what} ({{error}}), a bug in nbdist; "
            "the extension may show stale state, training is not affected."))
