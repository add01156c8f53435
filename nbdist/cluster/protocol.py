"""The messages between the kernel and its workers on the telemetry channel.

Every message is a JSON object with a ``"type"`` (one of the names below), HMAC-signed by
``telemetry.channel``. Metric rows travel in ``ROWS`` messages with the Run store's columns.
This module is shared by the kernel (``multiworker.monitor``) and the engines
(``inengine.worker``, ``inengine.cells``) and imports neither. So are what a function run on a
worker's engine answers (``Outcome``) and the table of the faults ``%distribute inject`` puts
into workers (``FAULT_KINDS``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# worker -> kernel
HEARTBEAT = "hb"             # {"step": int | None}: alive, and the step it is on
RUN_START = "run_start"      # {"run": key, "mode": "step" | "fit", "total_steps": int | None}
ROWS = "rows"                # {"run": key, "columns": [names], "n": rows, "data": base64,
#                              "total_steps": int | None, "epochs": int | None} (a fit's
#                              length is known only once it starts)
RUN_END = "run_end"          # {"run": key, "status": str, "notes": [str], "epochs": [{...}]}
PAUSED = "paused"            # {"step": int}: stopped at a step boundary, waiting for orders
STACKS = "stacks"            # {"step": int, "phase": str, "threads": [...]}: inengine.stacks
INJECTED = "injected"        # {"fault": str, "step": int}: about to apply an injected fault
ROWS_FLUSHED = "rows_flushed"  # {}: every row recorded so far was sent (after FLUSH_ROWS)
INPUT_DIGEST = "input_digest"  # {"run": key, "digest": str}: its first batch's fingerprint
#                                (data.fingerprint; the kernel compares the workers')
# kernel -> worker
STOP = "stop"                # stop at a step boundary that every worker reaches
HALT = "halt"                # stop here
RESUME_UNTIL = "resume_until"  # {"step": int}: go on until that step, then pause again
DUMP_STACKS = "dump_stacks"  # answer with STACKS (from the channel's thread: works while the
                             # worker's main thread is blocked)
INJECT = "inject"            # {"fault": a FAULT_KINDS name with to_engine, "at_step":
                             #  int|None, "delay": float|None}: inengine.faults
FLUSH_ROWS = "flush_rows"    # send the rows not sent yet, then ROWS_FLUSHED (channel thread:
                             # the kernel asks before it kills a worker blocked in a collective)

#: A paused worker waits this long for the kernel's decision, then stops on its own.
STOP_DECISION_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    """What a call on a worker's engine came to, as the kernel reads it (``dispatch``).

    It crosses ipyparallel as plain data: a function run on an engine returns ``to_dict()``,
    the kernel reads what came back with ``Outcome.of``. ``ok``: the function returned
    ``value``. Else ``error`` is ``failures.describe_exception``'s dict (type, message,
    traceback...), or ``abandoned``: the kernel ended the worker while it was still blocked
    waiting for a failed one, so it has no answer of its own."""

    ok: bool
    value: Any = None
    error: dict[str, Any] | None = None
    abandoned: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "value": self.value, "error": self.error,
                "abandoned": self.abandoned}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        return cls(ok=bool(data["ok"]), value=data.get("value"), error=data.get("error"),
                   abandoned=bool(data.get("abandoned", False)))

    @classmethod
    def of(cls, returned: Any) -> Outcome:
        """What an engine function returned: an outcome's dict, or a plain value (a function
        that cannot fail in nbdist's terms, such as ``compat.preflight``, answers with it)."""
        if isinstance(returned, dict) and "ok" in returned:
            return cls.from_dict(returned)
        return cls(ok=True, value=returned)

    def failed(self) -> bool:
        """Its function raised something other than an interrupt (the user's KeyboardInterrupt,
        or nbdist's stop at a step boundary)."""
        return self.error is not None and self.error.get("type") not in (
            "KeyboardInterrupt", "RunInterrupted")


@dataclass(frozen=True)
class FaultKind:
    """A fault ``%distribute inject NAME WORKER [--at-step N] [--delay S]`` puts into a worker
    on purpose. Everything that handles faults reads ``FAULT_KINDS``: the kernel's checks and
    log (``injection``), the worker's half (``inengine.faults``), the magic's help, and the
    parameter-server backend, which signals the workers itself (``paramserver.faults``).

    A new kind that is a signal is one entry here; one that does something else needs that
    something in ``inengine.faults`` (on the worker) or ``injection`` (in the kernel)."""

    name: str
    help: str                    # what it does to the worker, one line for the usage error
    signal: str | None = None    # the name of the signal the worker's process gets
    delay: float | None = None   # takes --delay S (seconds after every step); its default
    link: str | None = None      # "down" / "up": the kernel changes the worker's network link
    at_step: bool = True         # takes --at-step N: once the worker has done N steps of a run
    to_engine: bool = True       # sent as INJECT, applied by the worker (a link kind: the
                                 # worker only says when it reached --at-step, then the kernel
                                 # acts)


FAULT_KINDS: dict[str, FaultKind] = {k.name: k for k in (
    FaultKind("kill", "SIGKILL: the process dies (a crash, the OOM killer)", signal="SIGKILL"),
    FaultKind("stop", "SIGSTOP: the process freezes (a hung machine, a debugger)",
              signal="SIGSTOP"),
    FaultKind("slow", "sleep --delay S after every step (a straggler; --delay 0 ends it)",
              delay=0.5),
    FaultKind("partition", "take the worker's network link down: it runs on and reaches no "
              "one (until heal)", link="down"),
    FaultKind("heal", "bring a link that partition took down back up (at once)", link="up",
              at_step=False, to_engine=False),
)}


def fault_usage() -> str:
    """``kill|stop|slow|partition|heal WORKER [--at-step N] [--delay S]``."""
    return f"{'|'.join(FAULT_KINDS)} WORKER [--at-step N] [--delay S]"


def fault_help() -> str:
    """One line per fault kind: its name and what it does."""
    width = max(map(len, FAULT_KINDS))
    return "\n".join(f"  {k.name:<{width}}  {k.help}" for k in FAULT_KINDS.values())


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
