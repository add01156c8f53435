"""The live dashboard, run.plot() and run.to_tensorboard().

Widget messages are checked through a recording comm (no frontend); one test executes a real
notebook with nbclient and reads the saved widget state; one drives a real kernel and clicks
Stop through the comm while the cell runs.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from nbdist.telemetry.run import Run
from nbdist.widgets import dashboard as dashboard_mod
from nbdist.widgets.dashboard import Dashboard
from nbdist.widgets.decimator import Decimator
from nbdist.widgets.figure import FigureModel, static_figure
from nbdist.widgets.series import RunSeries, bus_bandwidth
from nbdist.widgets.stopper import StopSignal

ROOT = Path(__file__).resolve().parents[1]
STATIC = "application/vnd.plotly.v1+json"
NAN = math.nan


# -- helpers ---------------------------------------------------------------------------------
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
        run.record_step(
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


def by_panel(dash: Dashboard, axis: str, run_id: int = 1) -> dict[str, Any]:
    return {t.name: t for t in traces(dash, run_id) if t.xaxis == axis and t.mode == "lines"}


def live_dashboard(run: Run, **settings: Any) -> Dashboard:
    dash = Dashboard(None, live=True, stop_mode="off", **settings)
    dash.on_step(run)
    return dash


# -- series ----------------------------------------------------------------------------------
def test_decimator_keeps_bounded_means_and_skips_nan() -> None:
    dec = Decimator(2000)
    x = np.arange(100_000, dtype=float)
    for chunk in np.array_split(x, 37):
        dec.extend(chunk, np.where(chunk % 2 == 0, chunk * 3, np.nan))
    px, py = dec.points()
    assert 1000 <= len(px) <= 2000
    assert np.all(np.isfinite(py)) and np.allclose(py, 3 * px)   # bucket means of y = 3x
    assert px[0] < 100 and px[-1] > 99_000
    assert dec.raw == 50_000


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_bandwidth(1e6, 4, 0.002) == pytest.approx(1e6 * 2 * 3 / 4 / 0.002)
    assert math.isnan(bus_bandwidth(1e6, 1, 0.002))     # one rank: nothing crosses a bus
    assert math.isnan(bus_bandwidth(0, 4, 0.002))
    assert math.isnan(bus_bandwidth(1e6, 4, NAN))


def test_straggler_needs_factor_and_margin() -> None:
    run = make_run(100, slow=3)
    series = RunSeries(replicas=4)
    series.ingest(run.rows_since(0))
    [s] = series.stragglers()
    assert s.key == (0, 3) and s.ratio == pytest.approx(3.0)
    lenient = RunSeries(replicas=4, straggler_factor=4.0)
    lenient.ingest(run.rows_since(0))
    assert lenient.stragglers() == []
    two = RunSeries(replicas=2)                          # leave-one-out median works for N=2
    two.ingest(make_run(30, replicas=2, slow=1).rows_since(0))
    assert [s.key for s in two.stragglers()] == [(0, 1)]


# -- live widget -----------------------------------------------------------------------------
def test_one_trace_per_replica_and_global_line(recorder: Recorder) -> None:
    run = make_run(60)
    dash = live_dashboard(run)
    run.finish("done")
    dash.close()
    loss = by_panel(dash, "x")
    assert sorted(loss) == ["mean of replicas", "replica 0", "replica 1", "replica 2",
                            "replica 3"]
    assert loss["mean of replicas"].line.width > loss["replica 0"].line.width
    expected = np.mean([[1.0 / (s + 1) + 0.1 * r for r in range(4)] for s in range(60)], axis=1)
    assert np.allclose(loss["mean of replicas"].y, expected)
    assert np.allclose(loss["replica 2"].y, [1.0 / (s + 1) + 0.2 for s in range(60)])
    grad = by_panel(dash, "x2")
    assert sorted(grad) == [f"replica {r}" for r in range(4)]
    assert np.allclose(grad["replica 1"].y, 3.0)
    assert set(by_panel(dash, "x4")) >= {"host step time", "replica 0"}
    assert isinstance(loss["replica 0"].y, np.ndarray) and loss["replica 0"].y.dtype == np.float64
    menu = dash.views[1].fig.current["layout"]["updatemenus"][0]   # log-scale toggle for loss
    assert {b["args"][0]["yaxis.type"] for b in menu["buttons"]} == {"linear", "log"}
    assert recorder.displayed, "the dashboard was not displayed"


def test_global_loss_is_the_sum_of_replicas_when_they_add_up(recorder: Recorder) -> None:
    # each replica's loss divided by the global batch (compute_average_loss): the tutorial
    # reports their sum; the bold line, the summary and the progress line show it too
    run = Run(id=1, mode="step", strategy="mirrored", replicas=4, total_steps=20)
    run.sum_replica_losses(4)
    feed(run, 0, 20)
    dash = live_dashboard(run)
    run.finish("done")
    dash.close()
    loss = by_panel(dash, "x")
    label = "global loss (sum of replicas)"
    assert sorted(loss) == [label, "replica 0", "replica 1", "replica 2", "replica 3"]
    expected = np.sum([[1.0 / (s + 1) + 0.1 * r for r in range(4)] for s in range(20)], axis=1)
    assert np.allclose(loss[label].y, expected)
    assert run.last["global_loss"] == pytest.approx(expected[-1])
    assert f"loss (sum of replicas) {expected[-1]:.4g}" in run.summary()
    assert "loss per replica: " in run.summary()   # the per-replica values beside it
    assert any("sum of the 4 replicas' losses" in note for note in run.notes)
    from nbdist.widgets.progress import _progress_html

    assert f"loss {expected[-1]:.4g}" in _progress_html(run)
    fig = static_figure(run)   # run.plot(): the same line, the same label
    [line] = [t for t in fig.data if t.name == label]
    assert np.allclose(line.y, expected)


def test_keras_fit_run_draws_the_reduced_series(recorder: Recorder) -> None:
    run = Run(id=1, mode="fit", strategy="mirrored", replicas=2)
    for s in range(30):
        run.record_step(s, 0, loss=[1.0 / (s + 1)], step_ms=5.0, replica=-1,
                        extra={"accuracy": 0.5})
    dash = live_dashboard(run)
    run.finish("done")
    dash.close()
    lines = [t for t in traces(dash) if t.mode == "lines"]
    assert {t.name for t in lines} == {"mean of replicas", "slowest replica", "host step time"}
    loss = by_panel(dash, "x")["mean of replicas"]
    assert np.allclose(loss.y, [1.0 / (s + 1) for s in range(30)])
    assert len(by_panel(dash, "x3")["slowest replica"].x) == 0       # fit: no allreduce timing
    assert "step time per worker" in dash.views[1].fig.current["layout"]["annotations"][3]["text"]
    assert dash.views[1].progress.layout.visibility == "hidden"      # no total: no bar


def test_traces_stay_bounded_on_a_long_run(recorder: Recorder) -> None:
    run = make_run(30_000, replicas=2, total=30_000)
    dash = live_dashboard(run)
    dash.close()
    for trace in traces(dash):
        assert len(trace.x) <= 2000, trace.name
    loss = by_panel(dash, "x")["replica 0"]
    assert loss.x[0] < 20 and loss.x[-1] > 29_900          # covers the whole run
    assert run.n_rows == 60_000                            # the Run keeps everything


def test_unmeasured_timings_are_skipped_not_zero(recorder: Recorder) -> None:
    run = make_run(100, every=10, ar_ms=2.5)
    dash = live_dashboard(run)
    dash.close()
    ar = by_panel(dash, "x3")
    assert list(ar["replica 0"].x) == list(range(0, 100, 10))
    assert np.all(ar["replica 0"].y == 2.5)
    assert list(ar["slowest replica"].x) == list(range(0, 100, 10))
    compute = by_panel(dash, "x4")["replica 1"]
    assert len(compute.y) == 10 and np.all(np.isfinite(compute.y)) and np.all(compute.y > 0)


def test_straggler_in_header_and_marked_on_plot(recorder: Recorder) -> None:
    run = make_run(100, slow=2)
    dash = live_dashboard(run)
    view = dash.views[1]
    assert dash.stragglers == ["replica 2"]
    assert run.stragglers == ["replica 2"]          # the lab status bar reads them there
    assert "straggler: replica 2" in view.notes.value and "3.0×" in view.notes.value
    marks = [t for t in traces(dash) if t.name == "stragglers"][0]
    assert list(marks.x) == [90.0] and list(marks.y) == [3.0]
    calm = live_dashboard(make_run(100, run_id=2))
    assert calm.stragglers == [] and calm.views[2].notes.value == ""


def test_bus_bandwidth_in_header(recorder: Recorder) -> None:
    run = make_run(50, ar_ms=2.0)
    run.allreduce_bytes = 1_000_000
    dash = live_dashboard(run)
    # 1e6 B x 2(4-1)/4 / 2 ms = 0.75 GB/s, in the unit that reads best
    assert "bus bw 750 MB/s" in dash.views[1].header.value
    assert "other collectives" not in dash.views[1].header.value
    # SyncBatchNormalization's collectives: beside the gradient all-reduce, not in its bandwidth
    run = make_run(50, ar_ms=2.0, other_ms=5.0, run_id=2)
    run.allreduce_bytes = 1_000_000
    header = live_dashboard(run).views[2].header.value
    assert "bus bw 750 MB/s" in header and "other collectives 20 ms" in header


def test_the_header_is_redrawn_with_the_plots_from_the_same_rows(
        recorder: Recorder, clock: Clock) -> None:
    """At every redraw the header's step is the plots' last step (it used to be redrawn at
    most every 0.5 s, and showed "step 1/96" beside plots of 13 steps)."""
    import re

    run = make_run(1, total=40)
    dash = live_dashboard(run, min_interval=0.1, cpu_budget=1.0)
    for step in range(1, 40):
        clock.advance(0.15)
        feed(run, step, step + 1, on_step=dash.on_step)
        header = re.sub(r"<[^>]+>", "", dash.views[1].header.value)
        plotted = by_panel(dash, "x")["replica 0"].x[-1]
        assert f"step {int(plotted) + 1}/40 · epoch 1" in header, (step, header)
    assert dash.redraws == 40


def test_a_pause_is_said_in_the_header_until_the_next_step(recorder: Recorder) -> None:
    """No step for ``stall_after`` seconds: the header says so (the plots cannot); the next
    step's redraw takes the note away; the finished header has none."""
    run = make_run(5, total=100)
    dash = live_dashboard(run, stall_after=0.3)
    view = dash.views[1]
    deadline = time.monotonic() + 10
    while "no new step for" not in view.header.value and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "no new step for" in view.header.value
    assert "step 5/100" in view.header.value            # the rest is what the rows say
    feed(run, 5, 6, on_step=dash.on_step)
    assert "no new step" not in view.header.value and "step 6/100" in view.header.value
    run.finish("done")
    dash.close()
    assert view.stall is None and "no new step" not in view.header.value


def test_redraws_are_throttled_and_send_binary_buffers(recorder: Recorder, clock: Clock) -> None:
    run = make_run(5, total=1000)
    dash = live_dashboard(run, min_interval=0.1, cpu_budget=1.0)   # min_interval governs
    fig = dash.views[1].fig
    before = dash.redraws
    clock.advance(0.12)
    feed(run, 5, 205, on_step=dash.on_step)    # 200 steps within 0.1 s (the clock stands still)
    assert dash.redraws - before <= 2
    clock.advance(0.12)
    feed(run, 205, 206, on_step=dash.on_step)
    updates = [(d["content"], b) for kind, cid, d, b in recorder.messages
               if cid == fig.comm.comm_id and kind == "comm_msg"
               and (d or {}).get("method") == "custom" and d["content"]["type"] == "restyle"]
    assert updates, "no restyle was sent"
    message, buffers = updates[-1]
    assert buffers and all(memoryview(b).format in ("d", "B") for b in buffers)
    ys = message["props"]["y"]
    assert all(set(v) == {"buffer"} for v in ys)          # float64 buffers, not JSON lists
    assert len(buffers[ys[0]["buffer"]]) % 8 == 0
    # The figure's state is as first drawn (5 steps): later points travel in messages only.
    first = next(t for t in recorder.state(fig.comm.comm_id)["figure"]["data"]
                 if t["name"] == "replica 0" and t["xaxis"] == "x")
    assert len(first["y"]) == 5
    loss0 = next(t for t in traces(dash) if t.name == "replica 0" and t.xaxis == "x")
    assert loss0.x[-1] == 205 and len(loss0.y) == 206


def test_costly_redraws_are_spaced_to_the_cpu_budget(recorder: Recorder, clock: Clock) -> None:
    run = make_run(5, total=1000)
    dash = live_dashboard(run, cpu_budget=0.01, max_interval=0.5)
    clock.advance(0.12)
    feed(run, 5, 30, on_step=dash.on_step)                # a second (steady-state) redraw
    assert dash.redraws == 2 and dash._cost is not None
    interval = dash._next - clock.monotonic()
    assert min(0.5, max(0.1, dash._cost / 0.01)) - 0.05 <= interval <= 0.5


def test_drawing_failure_warns_once_and_training_continues(
        recorder: Recorder, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    run = make_run(3)
    dash = live_dashboard(run, min_interval=0.0)

    def boom(self: Any) -> Any:
        raise RuntimeError("plotly exploded")

    monkeypatch.setattr(FigureModel, "changes", boom)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        feed(run, 3, 40, on_step=dash.on_step)
        assert dash.should_stop() is False
        run.finish("done")
        dash.close()
    dashboard_warnings = [w for w in caught if "dashboard" in str(w.message)]
    assert len(dashboard_warnings) == 1
    assert "plotly exploded" in str(dashboard_warnings[0].message)
    assert run.steps_done == 40
    summary = recorder.displayed[-1]                     # the summary still reaches the user
    assert summary["text/plain"].startswith("Run 1")
    assert recorder.replaced, "the failed dashboard's widgets were left in the output"


def test_stop_button_requests_a_stop(recorder: Recorder) -> None:
    run = make_run(5)
    dash = live_dashboard(run)
    assert dash.should_stop() is False
    dash.views[1].button.click()
    assert dash.should_stop() is True
    dash.on_step(run)
    dash.close()
    assert dash.views[1].button.disabled


def test_stop_signal_route_hook_sees_click_on_another_thread() -> None:
    import threading

    class FakeComm:
        calls: list = []

        def _reply_subshell_for(self, data: Any, default: Any) -> Any:
            self.calls.append(data)
            return default

    class FakeButton:
        comm = FakeComm()

        def on_click(self, fn: Any) -> None:
            self.fn = fn

    kernel = type("K", (), {"shell_channel_thread": object()})()
    signal = StopSignal(FakeButton(), kernel)
    assert signal.mode == "route"
    hook = FakeButton.comm._reply_subshell_for
    results: list = []
    t = threading.Thread(target=lambda: results.append(
        hook({"method": "update", "state": {"x": 1}}, "sub")))
    t.start()
    t.join()
    assert results == ["sub"] and not signal.requested()   # other messages pass through
    threading.Thread(target=hook, args=({"method": "custom", "content": {"event": "click"}},
                                        None)).start()
    deadline = time.monotonic() + 2
    while not signal.requested() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert signal.requested()
    signal.close()
    assert "_reply_subshell_for" not in vars(FakeButton.comm)     # hook removed
    assert StopSignal(FakeButton(), None).mode == "off"          # no kernel: no live stop


# -- without a frontend -----------------------------------------------------------------------
def test_headless_run_ends_with_static_figure_and_summary(
        recorder: Recorder, capsys: Any) -> None:
    run = make_run(30)
    terminal = type("TerminalShell", (), {"kernel": None})()
    dash = Dashboard(terminal)
    assert dash.live is False
    dash.on_step(run)
    run.finish("done")
    dash.close()
    bundle, summary = recorder.displayed
    assert summary["text/plain"].startswith("Run 1 (step, mirrored, 4 replica(s)): done")
    assert "<pre>" in summary["text/html"]
    assert bundle["image/svg+xml"].startswith("<svg") and "Run 1" in bundle["text/plain"]
    names = [t["name"] for t in bundle["application/vnd.plotly.v1+json"]["data"]]
    assert names.count("replica 3") == 4                   # one per panel
    dash_none = Dashboard(None)
    dash_none.on_step(run)
    dash_none.close()
    assert "Run 1" in capsys.readouterr().out


def test_run_plot_returns_a_static_figure() -> None:
    import plotly.graph_objects as go

    run = make_run(5000, replicas=3, slow=0)
    run.allreduce_bytes = 4096
    run.finish("done")
    fig = run.plot()
    assert isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)
    loss = [t for t in fig.data if t.xaxis == "x"]
    assert [t.name for t in loss] == ["replica 0", "replica 1", "replica 2", "mean of replicas"]
    assert all(len(t.x) <= 2000 for t in fig.data)
    assert "done" in fig.layout.title.text
    assert "bus bw" in fig.layout.annotations[2].text
    marks = [t for t in fig.data if t.name == "stragglers"][0]
    assert marks.text == ("replica 0: 3.0x the median",)


def test_to_tensorboard_writes_one_series_per_replica(tmp_path: Path) -> None:
    tf = pytest.importorskip("tensorflow")
    run = make_run(40, replicas=2, every=10)
    run.finish("done")
    root = run.to_tensorboard(str(tmp_path))
    assert root.parent == tmp_path and root.name.startswith("run1-")
    found: dict[str, dict[str, list]] = {}
    for event_file in root.rglob("events.out.tfevents.*"):
        series = found.setdefault(event_file.parent.relative_to(root).as_posix(), {})
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name in ("", "scalars")
                series.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    assert sorted(found) == ["global", "replica_0", "replica_1"]
    for r in (0, 1):
        loss = dict(found[f"replica_{r}"]["loss"])
        assert len(loss) == 40 and loss[9] == pytest.approx(0.1 + 0.1 * r)
        assert [s for s, _ in found[f"replica_{r}"]["allreduce_ms"]] == [0, 10, 20, 30]
    assert len(found["global"]["step_ms"]) == 40
    assert dict(found["global"]["loss"])[0] == pytest.approx(1.05)


# -- real kernels ---------------------------------------------------------------------------
SETUP = [
    "%load_ext nbdist\n%distribute mirrored --devices 2",
    "import tensorflow as tf\nGLOBAL = 16\nx = tf.random.normal([{n}, 4])\n"
    "y = tf.random.normal([{n}, 2])\n"
    "ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL, drop_remainder=True)",
    "%%distribute\nmodel = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])\n"
    "optimizer = tf.keras.optimizers.SGD(0.05)",
]
STEP = ("%%distribute --step --data ds --epochs {epochs}\nx, y = batch\n"
        "with tf.GradientTape() as tape:\n"
        "    per = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)\n"
        "    loss = tf.nn.compute_average_loss(per, global_batch_size=GLOBAL)\n"
        "grads = tape.gradient(loss, model.trainable_variables)\n"
        "optimizer.apply_gradients(zip(grads, model.trainable_variables))")


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@pytest.mark.kernel
@pytest.mark.timeout(120)
def test_notebook_saves_dashboard_state_with_one_loss_series_per_replica(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for key, value in _kernel_env().items():
        monkeypatch.setenv(key, value)
    logdir = tmp_path / "tb"
    step = STEP.format(epochs=2).replace("--epochs 2", f"--epochs 2 --tensorboard {logdir}", 1)
    cells = [c.format(n=320) for c in SETUP] + [step]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=90, store_widget_state=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[-1].outputs
    # The live widgets gave way to the static final figure: no output needs a widget model.
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in outputs)
    assert any("done, 40 step(s)" in o.get("data", {}).get("text/plain", "") for o in outputs)
    [fig] = [o.data[STATIC] for o in outputs if STATIC in o.get("data", {})]
    loss = {t["name"]: t for t in fig["data"] if t.get("xaxis") == "x"}
    assert sorted(loss) == ["global loss (sum of replicas)", "replica 0", "replica 1"]
    import base64

    for name in ("replica 0", "replica 1"):
        y = loss[name]["y"]
        y = np.frombuffer(base64.b64decode(y["bdata"]), y["dtype"])
        assert len(y) == 40 and np.all(np.isfinite(y))
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    models = {m["model_name"] for m in state.values()}
    assert {"VBoxModel", "ButtonModel", "IntProgressModel", "AnyModel"} <= models
    assert len(json.dumps(state)) < 60_000        # data only: no plotly.js in the state
    # --tensorboard DIR wrote one series directory per replica, and said where.
    [run_dir] = logdir.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["global", "replica_0", "replica_1"]
    assert all(list(p.glob("events.out.tfevents.*")) for p in run_dir.iterdir())
    assert any(f"TensorBoard scalars of run 1 in {run_dir}" in o.get("text", "") for o in outputs)


@pytest.mark.kernel
@pytest.mark.timeout(150)
def test_stop_click_ends_a_running_cell_at_a_step_boundary() -> None:
    """A real kernel, the Stop click sent through the comm while the cell is busy."""
    from jupyter_client.manager import start_new_kernel

    out: list[str] = []
    km, kc = start_new_kernel(kernel_name="python3", env=_kernel_env())
    try:
        for code in [c.format(n=16 * 400) for c in SETUP]:
            reply = kc.execute_interactive(code, timeout=90)
            assert reply["content"]["status"] == "ok", reply["content"]
        msg_id = kc.execute(STEP.format(epochs=50))          # 20,000 steps: minutes
        clicked = None
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=100)
            content = msg["content"]
            if (msg["msg_type"] == "comm_open" and clicked is None
                    and content["data"]["state"].get("_model_name") == "ButtonModel"):
                time.sleep(1.0)
                kc.shell_channel.send(kc.session.msg("comm_msg", {
                    "comm_id": content["comm_id"],
                    "data": {"method": "custom", "content": {"event": "click"}}}))
                clicked = time.monotonic()
            if (msg["msg_type"] == "status" and content["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                break
        assert clicked is not None, "the dashboard's Stop button never appeared"
        assert time.monotonic() - clicked < 30
        probe = kc.execute_interactive(
            "import nbdist; r = nbdist.runs[-1]\nprint(r.status, r.steps_done, r.total_steps)",
            timeout=30, output_hook=lambda m: out.append(m["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert probe["content"]["status"] == "ok"
    status, done, total = "".join(out).split()
    assert status == "stopped" and 0 < int(done) < int(total) == 20_000



@pytest.mark.kernel
@pytest.mark.timeout(150)
def test_the_header_shows_the_rate_and_the_eta_while_a_run_runs() -> None:
    """A real kernel: the dashboard header's updates (comm messages to the frontend) show
    steps/s and the time left at that rate; the last one, the outcome."""
    import re

    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=_kernel_env())
    headers: list[str] = []
    try:
        for code in [c.format(n=16 * 400) for c in SETUP]:
            reply = kc.execute_interactive(code, timeout=90)
            assert reply["content"]["status"] == "ok", reply["content"]
        reply = kc.execute_interactive(
            STEP.format(epochs=5), timeout=120,     # 2,000 steps
            output_hook=lambda msg: headers.append(
                ((msg["content"].get("data") or {}).get("state") or {}).get("value", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    headers = [re.sub(r"<[^>]+>", "", h) for h in headers
               if isinstance(h, str) and "<b>Run 1</b>" in h]
    running = [m for h in headers if (m := re.search(
        r"step (\d+)/2000 · epoch [1-5]/5 · ([\d.]+) steps/s · (\d+) s left", h))]
    assert running, headers
    for m in running:
        left, rate, eta = 2000 - int(m[1]), float(m[2]), int(m[3])
        assert left / (rate + 0.05) - 0.5 <= eta <= left / (rate - 0.05) + 0.5, m[0]
    assert "✓ finished" in headers[-1] and "step 2000/2000 · epoch 5/5" in headers[-1]
    assert "left" not in headers[-1]
