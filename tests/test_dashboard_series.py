"""What the dashboard plots, computed from a Run (RunSeries, Decimator); run.to_tensorboard()."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dashboard_helpers import make_run

from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.decimator import Decimator
from nbdist.widgets.series import bus_bandwidth

NAN = math.nan


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



def test_the_loss_scale_is_a_panel_of_its_own_with_one_point_per_step() -> None:
    from nbdist.widgets.figure import run_figure

    run = Run(id=1, mode="step", strategy="multiworker", replicas=2, workers=2, total_steps=4)
    scales = [2.0 ** 15, 2.0 ** 14, 2.0 ** 14, 2.0 ** 15]
    for worker in (0, 1):     # one worker's rows after the other's, as they reach the kernel
        for step, scale in enumerate(scales):
            RunWriter(run).record_step(step, 0, loss=[1.0, 1.1], step_ms=4.0,
                                       grad_norm=[2.0, 2.1], worker=worker,
                                       extra={"loss_scale_factor": [scale, scale]})
    assert run.metrics["loss_scale_factor"].tolist() == [s for s in scales for _ in "ab"] * 2
    fig = run_figure(run)
    titles = [a["text"] for a in fig["layout"]["annotations"] if a.get("name", "").startswith(
        "title:")]
    assert "<b>loss scale</b>" in titles, titles
    [line] = [t for t in fig["data"] if t.get("name") == "loss scale"]
    assert line["x"].tolist() == [0, 1, 2, 3] and line["y"].tolist() == scales
    # a run whose steps scale no loss has no such panel
    plain = make_run(4, replicas=2)
    titles = [a["text"] for a in run_figure(plain)["layout"]["annotations"]]
    assert not any("loss scale" in t for t in titles)
