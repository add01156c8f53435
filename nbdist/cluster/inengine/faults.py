"""Faults injected on purpose into a worker (``%distribute inject``): the worker's half.

The kernel sends ``protocol.INJECT``; the worker applies it at once (from the channel's reader
thread) or, with ``at_step``, at the first step boundary where it has done that many steps of
its run (from the training loop, so the step is exact). Before applying it tells the kernel
(``protocol.INJECTED``), which shows it in ``%distribute status``. The faults are real
(``protocol.FAULT_KINDS``): the process sends itself the kind's signal (SIGKILL, SIGSTOP); a
kind with a delay (``slow``) sleeps after every step from then on; for a kind that changes a
link (``partition``) the worker only says it got there: the kernel takes its link down.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import protocol


class FaultPlan:
    """Injections waiting for their step, and the per-step delay of ``slow``."""

    def __init__(self, send: Callable[[dict[str, Any]], None], flush: Callable[[], None]):
        self._send, self._flush = send, flush
        self._lock = threading.Lock()
        self.pending: list[dict[str, Any]] = []
        self.delay_s = 0.0

    def on_control(self, message: dict[str, Any], steps_done: int) -> None:
        """A ``protocol.INJECT`` (channel reader thread)."""
        kind = protocol.FAULT_KINDS.get(str(message.get("fault")))
        if kind is None or not kind.to_engine:
            return
        at = message.get("at_step")
        if isinstance(at, int) and steps_done < at:
            with self._lock:
                self.pending.append(message)
            return
        self._apply(message, steps_done)

    def due(self, steps_done: int) -> bool:
        """Whether a fault is applied at this step boundary (the rows go first)."""
        return any(steps_done >= m["at_step"] for m in self.pending)

    def on_step(self, steps_done: int) -> None:
        """At a step boundary of a run (main thread): apply what is due, then be slow."""
        if self.pending:
            with self._lock:
                due = [m for m in self.pending if steps_done >= m["at_step"]]
                self.pending = [m for m in self.pending if m not in due]
            for message in due:
                self._apply(message, steps_done)
        if self.delay_s:
            time.sleep(self.delay_s)

    def _apply(self, message: dict[str, Any], steps_done: int) -> None:
        kind = protocol.FAULT_KINDS[message["fault"]]
        self._send({"type": protocol.INJECTED, "fault": kind.name, "step": steps_done})
        self._flush()   # the kernel hears of it before the process dies or stops
        if kind.signal is not None:
            os.kill(os.getpid(), signal.Signals[kind.signal])
        elif kind.delay is not None:
            delay = message.get("delay")
            self.delay_s = float(delay) if isinstance(delay, (int, float)) else 0.0
