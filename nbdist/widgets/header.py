"""The live dashboard's header: what the run is, where it is, how it ended.

Pure formatting (no widgets): ``header_html`` builds the header from the same ``RunSeries``
the plots are drawn from, so both show the same step. Two short lines: who (run, strategy,
replicas) and where (step, epoch, rate, time left, bus bandwidth, other collectives), each
item in a ``nowrap`` span so a narrow output breaks between items, never inside one. Epochs
are counted from 1 wherever a user reads them ("epoch 1/3"); the rows keep Keras' 0-based
``epoch`` column.
"""

from __future__ import annotations

import html
import math

from ..telemetry.run import Run
from ..words import count
from .series import RunSeries

__all__ = ["OUTCOMES", "epoch_text", "format_bandwidth", "format_duration", "header_html"]

_BANDWIDTH_UNITS = (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3))

#: A finished step run longer than this many steps (its first ones compile) is offered its
#: explanation (``Run.explain``, ``%distribute explain N``).
EXPLAINED_AFTER = 5

#: How a finished run's outcome reads in the header: (text, colour).
OUTCOMES = {
    "done": ("✓ finished", "#1a7f37"),
    "stopped": ("■ stopped", "#9a6700"),
    "interrupted": ("■ interrupted", "#9a6700"),
    "failed": ("✗ failed", "#cf222e"),
}


def format_bandwidth(bytes_per_s: float) -> str:
    """``"3.76 GB/s"``, ``"37.6 KB/s"``: decimal units (nccl-tests' GB/s are 1e9 B/s), the
    largest that keeps the number at 1 or more, three significant digits."""
    for unit, scale in _BANDWIDTH_UNITS:
        if bytes_per_s >= scale * 0.9995:      # 999.6 MB/s reads "1 GB/s", not "1e+03 MB/s"
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def format_duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"2 h 07 min"``."""
    seconds = max(0.0, seconds)
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    seconds = round(seconds)
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def epoch_text(epoch: int, epochs: int | None) -> str:
    """``"epoch 1/3"`` for the 0-based ``epoch`` of a row (``epochs``: how many, if known)."""
    return f"epoch {epoch + 1}" + (f"/{epochs}" if epochs else "")


def _item(text: str) -> str:
    return f"<span style='white-space:nowrap'>{text}</span>"


def header_html(run: Run, series: RunSeries, final: bool) -> str:
    """The header as HTML (two lines; see the module docstring)."""
    done, total = series.last_step + 1, run.total_steps
    who = [f"<b>Run {run.id}</b>", html.escape(run.strategy),
           count(run.replicas, "replica")
           + (f" × {run.workers} workers" if run.workers > 1 else "")]
    where = [f"step {done}{f'/{total}' if total else ''}",
             epoch_text(series.last_epoch, run.epochs)]
    if final:
        text, colour = OUTCOMES.get(run.status, (html.escape(run.status), "#57606a"))
        who.append(f"<b style='color:{colour}'>{text}</b>")
        if run.duration > 0 and done > 0:
            where.append(f"{done / run.duration:.1f} steps/s overall")
            where.append(f"took {format_duration(run.duration)}")
        if run.mode == "step" and done > EXPLAINED_AFTER:
            where.append(f"why this speed? <code>%distribute explain {run.id}</code>")
    else:
        rate = series.steps_per_second()
        if math.isfinite(rate):
            where.append(f"{rate:.1f} steps/s")
            if total and rate > 0 and total > done:
                where.append(f"{format_duration((total - done) / rate)} left")
    bw = series.bus_bandwidth(run.allreduce_bytes)
    if math.isfinite(bw):
        where.append(f"bus bw {format_bandwidth(bw)}")
    other = series.other_collective_ms()
    if series.other_collectives and math.isfinite(other):
        where.append(f"other collectives {other:.3g} ms")
    return (" · ".join(_item(x) for x in who) + "<br>"
            + " · ".join(_item(x) for x in where))
