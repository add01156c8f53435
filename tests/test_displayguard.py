"""nbdist.displayguard: what a display raises is reported once per kind, then logged at debug
level, and never reaches training."""

from __future__ import annotations

import logging

import pytest

from nbdist.displayguard import DisplayGuard

LOGGER = "nbdist.test.display"


def test_each_kind_is_warned_once_with_its_traceback_then_logged_at_debug(caplog) -> None:
    guard = DisplayGuard(logging.getLogger(LOGGER))
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        for _ in range(3):
            with guard.guard("drawing", "nbdist: the plot failed ({error}); training goes on."):
                raise ValueError("no axis")
        guard.report("lost", OSError("iopub closed"), "nbdist: lost ({error}).",
                     traceback=False)
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels[0] == (logging.WARNING, "nbdist: the plot failed (ValueError: no axis); "
                         "training goes on. Further failures of this kind are logged at "
                         "debug level.")
    assert caplog.records[0].exc_info[0] is ValueError
    assert [lv for lv, _ in levels[1:3]] == [logging.DEBUG, logging.DEBUG]
    assert levels[3][0] == logging.WARNING and caplog.records[3].exc_info is None


def test_a_kernel_interrupt_is_not_caught() -> None:
    guard = DisplayGuard(logging.getLogger(LOGGER))
    with pytest.raises(KeyboardInterrupt), guard.guard("drawing", "{error}"):
        raise KeyboardInterrupt


def test_a_listener_that_raises_does_not_stop_the_session_or_the_others(caplog) -> None:
    from nbdist.session import Session

    session = Session(None)
    heard: list[str] = []

    def broken() -> None:
        raise RuntimeError("status bar bug")

    session.listeners[:] = [broken, lambda: heard.append("after")]
    with caplog.at_level(logging.WARNING, logger="nbdist.session"):
        session._changed()
        session._changed()
    assert heard == ["after", "after"]
    [warned] = caplog.records
    assert "a status display failed (RuntimeError: status bar bug)" in warned.getMessage()
