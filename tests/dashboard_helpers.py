"""Shared by the dashboard's test files: a recording comm, a movable clock, made-up Runs.

Widget messages are checked through a recording comm (no frontend).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets import dashboard as dashboard_mod
from nbdist.widgets.dashboard import Dashboard

STATIC = "application/vnd.nbdist.figure.v1+json"   # the final figure's plotly JSON


class Recorder:
    """Stands in for the kernel's comm layer: keeps every widget message."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, dict, list]] = []   # (type, comm id, data, buffers)
        self.displayed: list[Any] = []
        self.replaced: list[Any] = []       # what display handles were updated with

    def display(self, *objs: Any, **kw: Any) -> Any:
        self.displayed.extend(objs)
        return SimpleNamespace(update=lambda obj, **_: self.replaced.append(obj))

    def state(self, comm_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for _kind, cid, data, _ in self.messages:
            if cid == comm_id and "state" in (data or {}):
                out.update(data["state"])
        return out

    def updates(self, comm_id: str) -> list[tuple[dict, list]]:
        return [(d, b) for kind, cid, d, b in self.messages
                if cid == comm_id and kind == "comm_msg" and (d or {}).get("method") == "update"]


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    import comm
    import IPython.display

    rec = Recorder()

    class RecordingComm(comm.base_comm.BaseComm):
        def publish_msg(self, msg_type: str, data: Any = None, metadata: Any = None,
                        buffers: Any = None, **keys: Any) -> None:
            rec.messages.append((msg_type, self.comm_id, data, list(buffers or [])))

    monkeypatch.setattr(comm, "create_comm", lambda *a, **k: RecordingComm(*a, **k))
    monkeypatch.setattr(IPython.display, "display", rec.display)
    return rec


class Clock:
    """The dashboard's ``time.monotonic``, moved by the test (redraw pacing without sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(dashboard_mod, "time",
                        SimpleNamespace(monotonic=fake.monotonic, perf_counter=time.perf_counter))
    return fake


def make_run(steps: int = 50, replicas: int = 4, *, every: int = 10, slow: int | None = None,
             ar_ms: float = 2.0, run_id: int = 1, total: int | None = None,
             other_ms: float = 0.0) -> Run:
    run = Run(id=run_id, mode="step", strategy="mirrored", replicas=replicas,
              total_steps=total if total is not None else steps)
    feed(run, 0, steps, every=every, slow=slow, ar_ms=ar_ms, other_ms=other_ms)
    return run


def feed(run: Run, start: int, stop: int, *, every: int = 10, slow: int | None = None,
         ar_ms: float = 2.0, on_step: Any = None, other_ms: float = 0.0) -> None:
    n = run.replicas
    for s in range(start, stop):
        timed = every > 0 and s % every == 0
        compute = [3.0 if r == slow else 1.0 for r in range(n)]
        RunWriter(run).record_step(
            s, s // 100, loss=[1.0 / (s + 1) + 0.1 * r for r in range(n)], step_ms=4.0,
            grad_norm=[2.0 + r for r in range(n)],
            allreduce_ms=[ar_ms] * n if timed else None,
            wait_ms=[max(compute) - c for c in compute] if timed else None,
            compute_ms=compute if timed else None, data_ms=0.2,
            other_collective_ms=[other_ms * (r + 1) for r in range(n)] if timed else None,
        )
        if on_step is not None:
            on_step(run)


def traces(dash: Dashboard, run_id: int = 1) -> list[Any]:
    """What the live figure shows now (``LiveFigure.current``), as attribute objects."""
    return [SimpleNamespace(**{k: SimpleNamespace(**v) if isinstance(v, dict) else v
                               for k, v in t.items()})
            for t in dash.views[run_id].fig.current["data"]]


def by_panel(dash: Dashboard, panel: str, run_id: int = 1) -> dict[str, Any]:
    """The lines of one panel ("loss", "grad_norm", "allreduce_ms", "time") by name."""
    axis = dash.views[run_id].model.axes[panel]
    return {t.name: t for t in traces(dash, run_id) if t.yaxis == axis and t.mode == "lines"}


def live_dashboard(run: Run, **settings: Any) -> Dashboard:
    dash = Dashboard(None, live=True, stop_mode="off", **settings)
    dash.on_step(run)
    return dash
