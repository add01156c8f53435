"""Build TensorFlow graphs for a run's input on a thread of their own, away from the cell's code.

TensorFlow records the Python stack of every op it adds to a graph, and what it keeps for the
code objects on that stack is never freed. Every run of a cell is a new code object (IPython
compiles each execution anew), so every distributed dataset and iterator a step cell built (a
dozen small graph functions: the rebatch and each device's pipeline) kept tens of kB for the
rest of the session. Built on a new thread's stack, whose frames are this module's and
nbdist's functions, not the cell's, an iterator keeps a small fraction of that
(tests/test_memory.py bounds the growth per run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

THREAD_NAME = "nbdist-input-builder"


def on_fresh_stack(build: Callable[..., Any], *args: Any,
                   abandoned: Callable[[Any], Any] | None = None) -> Any:
    """``build(*args)``, run on a new thread; its exception is raised here.

    ``abandoned(result)`` receives what ``build`` returns after an interrupt (Ctrl-C) ended
    the wait here, e.g. ``iterate.release`` for an iterator, whose deletion can block.
    """
    outcome: dict[str, Any] = {}
    lock = threading.Lock()

    def target() -> None:
        try:
            value = build(*args)
        except BaseException as err:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = err
            return
        with lock:
            if outcome.get("gone") and abandoned is not None:
                abandoned(value)
            else:
                outcome["value"] = value

    # Not a daemon: one still inside TensorFlow when the interpreter finalises aborts it.
    thread = threading.Thread(target=target, name=THREAD_NAME)
    thread.start()
    try:
        thread.join()
    except BaseException:
        with lock:
            outcome["gone"] = True
            value = outcome.pop("value", None)
        if value is not None and abandoned is not None:
            abandoned(value)
        raise
    if "error" in outcome:
        error = outcome.pop("error")
        try:
            raise error
        finally:
            del error
    return outcome["value"]
