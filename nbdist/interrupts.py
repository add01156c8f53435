"""A kernel interrupt during a compiled call lands after the call's rows are recorded.

Python runs its SIGINT handler at the first bytecode after TensorFlow's compiled call returns,
so the ``KeyboardInterrupt`` of Kernel > Interrupt is raised between a call that has already
changed the weights and the recording of its rows: those steps would be lost from the Run (a
whole group of steps with ``--steps-per-call``). ``HeldInterrupts`` holds a SIGINT that arrives
while a call and its recording are under way and raises it once they are done; at any other
time it does what the handler it replaced does (Python's raises at once).

A ``KeyboardInterrupt`` raised anywhere else can land inside TensorFlow's code, which is not
written for it: C++ that calls back into Python may then append the failed call's NULL to a list
and raise ``SystemError: ... bad argument to internal function`` instead (seen under
parameter_server), or leave a checkpoint half-written. Loops that can say where an interrupt is
safe hold it for their whole length and ``check()`` at those points. A second SIGINT while one is
held raises at once: the user asked twice, the loop may be stuck.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class HeldInterrupts:
    """``with HeldInterrupts() as held:`` ... ``held.hold()`` before a call, ``held.release()``
    after its rows are recorded (raises the ``KeyboardInterrupt`` held meanwhile)."""

    def __init__(self) -> None:
        self._holding = False
        self._held = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> HeldInterrupts:
        # Handlers can be set only from the main thread, and one set outside Python (None)
        # could not be put back: then nothing is held.
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is not None):
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
        self._holding = self._held = False   # an error ended the loop: it is reported instead

    def hold(self) -> None:
        self._holding = True

    def release(self) -> None:
        self._holding = False
        self.check()

    def check(self) -> None:
        """At a point where an interrupt is safe: raise the one held, if any (still holding
        later ones)."""
        if self._held:
            self._held = False
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._holding and not self._held:
            self._held = True
        elif self._holding:   # the second: at once
            self._held = False
            raise KeyboardInterrupt
        elif callable(self._previous):
            self._previous(signum, frame)
        elif self._previous != signal.SIG_IGN:
            raise KeyboardInterrupt
