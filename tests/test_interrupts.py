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
