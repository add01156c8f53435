"""Draw one throwaway dashboard figure in a background thread, once per kernel.

In a fresh kernel the first dashboard figure costs about a second (plotly's modules and its
property validators load on first use), paid when the first cell finishes. Starting a
strategy's worker processes leaves the kernel waiting for seconds, so ``%distribute`` draws a
figure of a tiny made-up Run meanwhile (it belongs to no RunList and is displayed nowhere).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger("nbdist.widgets")

_started = threading.Event()


def warm_in_background() -> threading.Thread | None:
    """Start the warm-up thread and return it (only the first call in a kernel does)."""
    if _started.is_set():
        return None
    _started.set()
    thread = threading.Thread(target=_draw_once, name="nbdist-warm-dashboard", daemon=True)
    thread.start()
    return thread


def sample_bundle() -> dict[str, Any]:
    """The static dashboard of a made-up 2-worker, 4-step Run (what the warm-up draws)."""
    from ..telemetry.run import Run
    from .static import static_bundle

    run = Run(id=0, mode="step", strategy="warm-up", replicas=1, workers=2)
    for step in range(4):
        run.record_step(step, 0, loss=[1.0], grad_norm=[1.0], compute_ms=[1.0], step_ms=1.0,
                        data_ms=0.1, worker=step % 2, replica=0, wall_time=float(step))
    run.finish("done")
    return static_bundle(run)


def _draw_once() -> None:
    try:
        sample_bundle()
    except Exception as err:  # noqa: BLE001 - only a head start: the real figure reports errors
        log.debug("dashboard warm-up failed: %r", err)
