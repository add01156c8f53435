"""Kernel interrupts (SIGINT) held while a loop is somewhere an interrupt is not safe
(nbdist.interrupts): raised at the loop's next safe point, or at once on a second SIGINT."""

import os
import signal
import time

import pytest

from nbdist.interrupts import HeldInterrupts


def sigint() -> None:
    """Send this process SIGINT and give Python's handler the next bytecodes to run."""
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(100):
        time.sleep(0.001)


def test_an_interrupt_while_holding_is_raised_at_the_next_check():
    with HeldInterrupts() as held:
        held.hold()
        sigint()                       # e.g. inside TensorFlow's code, or a checkpoint's save
        with pytest.raises(KeyboardInterrupt):
            held.check()
        held.check()                   # raised once
        with pytest.raises(KeyboardInterrupt):
            sigint()                   # the same loop, interrupted again: held too...
            held.release()             # ...until the hold ends


def test_a_second_interrupt_while_one_is_held_is_raised_at_once():
    """A loop stuck where it holds interrupts (a blocked wait) still ends: press it twice."""
    with HeldInterrupts() as held:
        held.hold()
        sigint()
        with pytest.raises(KeyboardInterrupt):
            sigint()
        held.check()                   # the first was not kept for later


def test_outside_a_hold_an_interrupt_is_raised_at_once_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with HeldInterrupts(), pytest.raises(KeyboardInterrupt):
        sigint()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_build_on_a_fresh_stack_returns_raises_and_hands_over_what_an_interrupt_left():
    """``data.freshstack``: the caller gets the value or the exception; interrupted while it
    waits, what the build returns afterwards goes to ``abandoned`` (an iterator's release)."""
    import threading

    from nbdist.data.freshstack import THREAD_NAME, on_fresh_stack

    assert on_fresh_stack(lambda: threading.current_thread().name) == THREAD_NAME
    with pytest.raises(ValueError, match="bad dataset"):
        on_fresh_stack(lambda: (_ for _ in ()).throw(ValueError("bad dataset")))
    handed, started = [], threading.Event()

    def slow_build() -> str:
        started.set()
        time.sleep(0.5)
        return "iterator"

    threading.Timer(0.1, lambda: started.wait() and os.kill(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        on_fresh_stack(slow_build, abandoned=handed.append)
    deadline = time.monotonic() + 5
    while not handed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert handed == ["iterator"]
