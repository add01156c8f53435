"""Draw one throwaway dashboard figure in a background thread, once per kernel.

In a fresh kernel the first dashboard figure costs about a second (plotly's modules and its
property validators load on first use), paid when the first cell finishes. Starting a
strategy's worker processes leaves the kernel waiting for seconds, so ``%distribute`` draws a
figure of a tiny made-up Run meanwhile (it belongs to no RunList and is displayed nowhere).
The thread runs at the lowest CPU priority (Linux: a thread's own nice value): on a machine
whose cores the starting workers keep busy (TensorFlow's import, their first trace) it only
uses what they leave idle, instead of delaying their first step.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

log = logging.getLogger("nbdist.widgets")

_started = threading.Event()


def warm_in_background(shell: Any) -> threading.Thread | None:
    """Start the warm-up thread and return it (only the first call in a kernel does, and
    only where figures are drawn: not in a terminal, which prints the summary alone)."""
    from .progress import draws_figures

    if _started.is_set() or not draws_figures(shell):
        return None
    _started.set()
    thread = threading.Thread(target=_draw_once, name="nbdist-warm-dashboard", daemon=True)
    thread.start()
    return thread


def sample_bundle() -> dict[str, Any]:
    """The static dashboard of a made-up 2-worker, 4-step Run (what the warm-up draws)."""
    from ..telemetry.run import Run, RunWriter
    from .static import static_bundle

    run = Run(id=0, mode="step", strategy="warm-up", replicas=1, workers=2)
    for step in range(4):
        RunWriter(run).record_step(
            step, 0, loss=[1.0], grad_norm=[1.0], compute_ms=[1.0], step_ms=1.0, data_ms=0.1,
            worker=step % 2, replica=0, wall_time=float(step))
    RunWriter(run).finish("done")
    return static_bundle(run)


#: The warm-up thread's nice value (the lowest priority).
NICE = 19


def _lower_my_priority() -> None:
    try:   # on Linux PRIO_PROCESS with a thread id sets that thread's nice value only
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError) as err:   # elsewhere: a head start at normal priority
        log.debug("dashboard warm-up keeps its priority: %r", err)


def _draw_once() -> None:
    _lower_my_priority()
    try:
        sample_bundle()
    except Exception as err:  # noqa: BLE001 - only a head start: the real figure reports errors
        log.debug("dashboard warm-up failed: %r", err)
