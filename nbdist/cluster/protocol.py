"""The messages between the kernel and its workers on the telemetry channel.

Every message is a JSON object with a ``"type"`` (one of the names below), HMAC-signed by
``telemetry.channel``. Metric rows travel in ``ROWS`` messages with the Run store's columns.
This module is shared by the kernel (``multiworker.monitor``) and the engines
(``inengine.worker``, ``inengine.cells``) and imports neither.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# worker -> kernel
HEARTBEAT = "hb"             # {"step": int | None}: alive, and the step it is on
RUN_START = "run_start"      # {"run": key, "mode": "step" | "fit", "total_steps": int | None}
ROWS = "rows"                # {"run": key, "columns": [names], "n": rows, "data": base64,
#                              "total_steps": int | None, "epochs": int | None} (a fit's
#                              length is known only once it starts)
RUN_END = "run_end"          # {"run": key, "status": str, "notes": [str]}
PAUSED = "paused"            # {"step": int}: stopped at a step boundary, waiting for orders
STACKS = "stacks"            # {"step": int, "phase": str, "threads": [...]}: inengine.stacks
INJECTED = "injected"        # {"fault": str, "step": int}: about to apply an injected fault
ROWS_FLUSHED = "rows_flushed"  # {}: every row recorded so far was sent (after FLUSH_ROWS)
# kernel -> worker
STOP = "stop"                # stop at a step boundary that every worker reaches
HALT = "halt"                # stop here
RESUME_UNTIL = "resume_until"  # {"step": int}: go on until that step, then pause again
DUMP_STACKS = "dump_stacks"  # answer with STACKS (from the channel's thread: works while the
                             # worker's main thread is blocked)
INJECT = "inject"            # {"fault": "kill"|"stop"|"slow", "at_step": int|None,
                             #  "delay": float}: inengine.faults
FLUSH_ROWS = "flush_rows"    # send the rows not sent yet, then ROWS_FLUSHED (channel thread:
                             # the kernel asks before it kills a worker blocked in a collective)

#: A paused worker waits this long for the kernel's decision, then stops on its own.
STOP_DECISION_TIMEOUT_S = 60.0


class StopGate:
    """The worker's half of the stop protocol (the kernel's is
    ``multiworker.monitor.StopCoordinator``): at a step boundary after a ``STOP``, say
    ``PAUSED`` and wait for ``HALT`` or ``RESUME_UNTIL``."""

    def __init__(self, send: Callable[[dict[str, Any]], None]):
        self._send = send
        self._cond = threading.Condition()
        self._requested = False
        self._until: int | None = None
        self._decision: dict[str, Any] | None = None

    def on_control(self, message: dict[str, Any]) -> None:
        """Kernel messages (channel reader thread)."""
        with self._cond:
            if message["type"] == STOP:
                self._requested = True
            elif message["type"] in (HALT, RESUME_UNTIL):
                self._decision = message
                self._cond.notify_all()

    def reset(self) -> None:
        with self._cond:
            self._requested, self._until, self._decision = False, None, None

    def should_stop(self, steps_done: int) -> bool:
        """At a step boundary: True to stop here (all workers stop after the same step)."""
        with self._cond:
            if not self._requested:
                return False
            if self._until is not None and steps_done < self._until:
                return False
            self._decision = None
        self._send({"type": PAUSED, "step": steps_done})
        with self._cond:
            self._cond.wait_for(lambda: self._decision is not None, STOP_DECISION_TIMEOUT_S)
            decision = self._decision
        if decision is None or decision["type"] == HALT:
            return True
        self._until = int(decision["step"])
        return steps_done >= self._until
