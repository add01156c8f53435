"""The finished dashboard without a kernel (static figure), and quiet cells (nbdist.tflogs).

These tests draw a Run as SVG and check the log filter; tests/test_static_notebook.py
executes a notebook with nbclient, renders it with nbconvert, and runs the headless
quickstart.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import warnings
from pathlib import Path

import pytest

from nbdist import tflogs
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets import warm
from nbdist.widgets.static import FIGURE_MIME, static_bundle

ROOT = Path(__file__).resolve().parents[1]


def _run(steps: int, replicas: int = 2) -> Run:
    run = Run(id=7, mode="step", strategy="mirrored", replicas=replicas, total_steps=steps)
    for s in range(steps):
        RunWriter(run).record_step(
            s, 0, loss=[1.0 / (s + 1) + r for r in range(replicas)], step_ms=4.0,
            grad_norm=[1.0] * replicas, allreduce_ms=[2.0] * replicas, compute_ms=[1.0] * replicas)
    RunWriter(run).finish("done")
    return run


def test_the_warm_up_draws_a_whole_dashboard_once_per_kernel(monkeypatch) -> None:
    """`%distribute` draws a throwaway figure while workers start (plotly's first figure is
    slow); it must be the real drawing code, run once."""
    bundle = warm.sample_bundle()
    assert {FIGURE_MIME, "image/svg+xml", "text/plain"} <= set(bundle)
    assert len(bundle[FIGURE_MIME]["data"]) >= 2        # one loss line per worker at least
    monkeypatch.setattr(warm, "_started", type(warm._started)())
    # the figure is drawn in a few ms once plotly is warm: hold it until its nice value is read
    drawn, draw = threading.Event(), warm.sample_bundle
    monkeypatch.setattr(warm, "sample_bundle", lambda: (drawn.wait(30), draw())[1])
    mine = _nice(threading.get_native_id())
    assert warm.warm_in_background(type("Terminal", (), {"kernel": None})()) is None
    kernel = type("Kernel", (), {"kernel": object()})()
    thread = warm.warm_in_background(kernel)
    assert thread is not None and warm.warm_in_background(kernel) is None
    nice = set()   # the warm-up thread's nice values seen while it draws
    deadline = time.monotonic() + 30
    while thread.is_alive() and warm.NICE not in nice and time.monotonic() < deadline:
        nice.add(_nice(thread.native_id))
        time.sleep(0.001)
    drawn.set()
    assert warm.NICE in nice, nice   # it yields the CPU to the starting workers
    assert _nice(threading.get_native_id()) == mine   # the kernel's own thread is untouched
    thread.join(60)
    assert not thread.is_alive()


def _nice(tid: int) -> int | None:
    """A thread's nice value (Linux), None once it has exited."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])
    except (OSError, IndexError):
        return None


def test_static_bundle_is_svg_plotly_json_and_text_and_stays_small() -> None:
    bundle = static_bundle(_run(20_000, replicas=8))
    svg = bundle["image/svg+xml"]
    assert svg.startswith("<svg") and svg.count("<polyline") >= 8 * 4
    assert "Run 7 · mirrored · 8 replicas · 20000 steps · done" in svg
    assert "Run 7" in bundle["text/plain"]
    names = [t["name"] for t in bundle[FIGURE_MIME]["data"] if t.get("yaxis") == "y"]
    assert names[:2] == ["replica 0", "replica 1"]
    # Ten of these in one notebook stay under 2 MB (the points are capped, float32).
    assert len(json.dumps(bundle)) < 150_000


def _texts(svg: str) -> list[str]:
    from html import unescape

    return [unescape(re.sub(r"<[^>]+>", "", t))
            for t in re.findall(r"<text [^>]*>(.*?)</text>", svg)]


def test_static_svg_speaks_the_dashboard_language() -> None:
    run = _run(300, replicas=2)
    run.allreduce_bytes = 1_000_000
    svg = static_bundle(run)["image/svg+xml"]
    texts = _texts(svg)
    # the legend names every line once: the replicas, then each aggregate by what it is
    for name in ("replica 0", "replica 1", "mean of replicas", "slowest replica's all-reduce",
                 "host step time (whole step)"):
        assert texts.count(name) == 1, name
    # aggregates: thick and dark, each with its own dash; replicas thin
    widths = [float(w) for w in re.findall(r'<polyline [^>]*stroke-width="([\d.]+)"', svg)]
    assert sorted(set(widths)) == [1.3, 2.6]
    looks = set(re.findall(r'<polyline fill="none" stroke="(#[0-9a-f]+)" stroke-width="2.6"'
                           r'( stroke-dasharray="[\d,]+")?', svg))
    assert len(looks) == 3          # loss black, all-reduce black dashed, host step time grey
    # panel titles with units, bus bandwidth in GB/s, the step axis once
    assert "gradient all-reduce time (ms) · bus bandwidth 500 MB/s" in texts
    assert texts.count("step") == 1 and texts.count("ms") == 2


def test_static_svg_ticks_are_whole_steps_and_readable_log_labels() -> None:
    svg = static_bundle(_run(3))["image/svg+xml"]
    steps = re.findall(r'<text [^>]*font-size="10" text-anchor="middle"[^>]*>([^<]*)</text>', svg)
    assert steps == ["0", "2", "4", "6", "8", "10"]      # steps 0..10 at least, whole numbers
    from nbdist.widgets.svgplot import _ticks

    # log axes: decades over a wide range, 1-2-5 within a decade or two, never 1..9
    assert [round(10 ** t, 6) for t in _ticks(-1.2, 3.3, True)] == [0.1, 1, 10, 100, 1000]
    assert [round(10 ** t, 6) for t in _ticks(0.1, 1.5, True)] == [2, 5, 10, 20]
    assert _ticks(0, 3.4, False, integer=True) == [0, 1, 2, 3]


def test_run_plot_ticks_log_axes_by_decades_or_1_2_5() -> None:
    from nbdist.widgets.figure import run_figure
    from nbdist.widgets.panels import log_dtick

    assert log_dtick(1.7, 14) == "D2" and log_dtick(0.01, 100) == 1
    run = Run(id=8, mode="step", strategy="mirrored", replicas=2, total_steps=40)
    for s in range(40):   # compute times over four decades, all-reduce times within one
        RunWriter(run).record_step(s, 0, loss=[1.0, 1.0], grad_norm=[1.0, 1.0], step_ms=4.0,
                                   allreduce_ms=[2.0, 3.0], compute_ms=[10.0 ** (s / 10 - 2)] * 2)
    RunWriter(run).finish("done")
    layout = run_figure(run)["layout"]
    assert layout["yaxis3"]["dtick"] == "D2" and layout["yaxis4"]["dtick"] == 1


def test_static_fit_figure_leaves_out_what_fit_cannot_measure() -> None:
    run = Run(id=3, mode="fit", strategy="mirrored", replicas=2)
    for s in range(20):
        RunWriter(run).record_step(s, 0, loss=[1.0 / (s + 1)], step_ms=5.0, replica=-1)
    RunWriter(run).finish("done")
    bundle = static_bundle(run)
    texts = _texts(bundle["image/svg+xml"])
    assert "loss" in texts and "step time per worker (ms)" in texts      # the panels drawn
    assert not any(t.startswith(("gradient norm", "gradient all-reduce")) for t in texts)
    assert any("model.fit reports the loss and the step time" in t for t in texts)
    layout = bundle[FIGURE_MIME]["layout"]
    assert "yaxis3" not in layout and layout["yaxis2"]["type"] == "log"


def test_run_plot_smoothing_draws_the_average_over_the_faint_raw_line() -> None:
    import numpy as np

    from nbdist.widgets.figure import ema, run_figure

    assert np.allclose(ema(np.array([1.0, 1.0, 1.0]), 0.9), 1.0)   # debiased: no ramp up
    assert np.allclose(ema(np.array([0.0, 2.0]), 0.5), [0.0, 4 / 3])
    fig = run_figure(_run(50), smoothing=0.6)
    loss = [t for t in fig["data"] if t.get("yaxis") == "y" and t["name"] == "replica 0"]
    smooth, raw = loss
    assert raw["legendgroup"] == smooth["legendgroup"]     # hidden with it from the legend
    assert raw["opacity"] < 0.5 and raw["hoverinfo"] == "skip" and not raw["showlegend"]
    assert np.allclose(smooth["y"], ema(raw["y"], 0.6))
    with pytest.raises(ValueError, match="smoothing must be in"):
        run_figure(_run(5), smoothing=1.0)


def test_quiet_tensorflow_hides_info_even_if_tensorflow_resets_its_level(caplog) -> None:
    logger = logging.getLogger("tensorflow")
    with tflogs.quiet_tensorflow():
        logger.setLevel(logging.INFO)           # what TensorFlow does on import in a notebook
        with caplog.at_level(logging.INFO, logger="tensorflow"):
            logger.info("Reduce to /job:localhost then broadcast")
            logger.warning("a real warning")
        with warnings.catch_warnings(record=True) as caught:    # keeps the filters in force
            warnings.warn("`shuffle=True` was passed, but will be ignored", UserWarning,
                          stacklevel=1)
    assert [r.getMessage() for r in caplog.records] == ["a real warning"]
    assert caught == []
    assert logger.filters == []                 # as it was afterwards
    logger.setLevel(logging.NOTSET)


def test_verbose_shows_everything(monkeypatch) -> None:
    monkeypatch.setenv(tflogs.ENV, "0")
    tflogs.set_verbose()
    assert tflogs.verbose() and tflogs.worker_environment()[tflogs.ENV] == "1"
    with tflogs.quiet_tensorflow():
        assert logging.getLogger("tensorflow").filters == []
    tflogs.set_verbose(False)
    assert not tflogs.verbose()


def test_native_stderr_keeps_what_cpp_writes_out_of_the_cell(capfd):
    # TensorFlow's and gRPC's C++ lines go to file descriptor 2, not sys.stderr
    with tflogs.native_stderr() as caught:
        os.write(2, b"E0000 00:00:1 context.cc:911] Failed to remove function remotely\n\n")
    os.write(2, b"after\n")
    assert caught == ["E0000 00:00:1 context.cc:911] Failed to remove function remotely"]
    assert capfd.readouterr().err == "after\n"
