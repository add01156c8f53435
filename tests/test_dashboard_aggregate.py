"""The dashboard above 16 replica series: per-step median, quantile and min-max bands over all
replicas, the worker x step heatmap, the top stragglers, and the switch itself."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from nbdist.telemetry.rows import POSITION as COL
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.aggregate import row_quantiles
from nbdist.widgets.figure import FigureModel, run_figure
from nbdist.widgets.series import RunSeries
from nbdist.widgets.svgplot import figure_svg

STATS = {"min": 0.0, "q10": 0.1, "median": 0.5, "q90": 0.9, "max": 1.0}


def synthetic_run(workers: int, replicas: int, steps: int, slow: tuple[int, int] = (5, 3),
                  seed: int = 0) -> tuple[Run, dict[str, np.ndarray]]:
    """A Run of random per-replica values; returns it and each metric as steps x keys."""
    rng = np.random.default_rng(seed)
    keys = workers * replicas
    values = {"loss": rng.normal(2.0, 0.5, (steps, keys)),
              "grad_norm": rng.gamma(2.0, 1.0, (steps, keys)),
              "compute_ms": rng.uniform(2.0, 3.0, (steps, keys))}
    values["compute_ms"][:, slow[0] * replicas + slow[1]] += 10.0
    run = Run(id=1, mode="step", strategy="multiworker", replicas=replicas, workers=workers,
              total_steps=steps)
    # each replica waits, before the all-reduce, for the slowest one's compute
    waits = values["compute_ms"].max(axis=1, keepdims=True) - values["compute_ms"]
    for step in range(steps):
        for w in range(workers):
            cols = slice(w * replicas, (w + 1) * replicas)
            RunWriter(run).record_step(step, 0, worker=w, step_ms=20.0, data_ms=0.1,
                                       loss=values["loss"][step, cols].tolist(),
                                       grad_norm=values["grad_norm"][step, cols].tolist(),
                                       allreduce_ms=[1.0] * replicas,
                                       wait_ms=waits[step, cols].tolist(),
                                       compute_ms=values["compute_ms"][step, cols].tolist())
    return run, values


def test_bands_equal_numpy_quantiles_over_all_replicas() -> None:
    run, values = synthetic_run(workers=8, replicas=4, steps=40)
    series = RunSeries(replicas=4, workers=8, max_points=100)
    for lo in range(0, run.n_rows, 13):        # batches that split steps across workers
        series.ingest(run.block_since(lo)[:13])
    series.finish()
    assert series.aggregated and series.plotted_keys() == []
    assert not any(isinstance(k, tuple) for (_, k) in series.series)   # no per-key lines
    for metric, name in (("loss", "loss"), ("grad_norm", "grad_norm"), ("time", "compute_ms")):
        for stat, q in STATS.items():
            x, y = series.series[(metric, stat)].points()
            np.testing.assert_array_equal(x, np.arange(40))
            np.testing.assert_allclose(y, np.quantile(values[name], q, axis=1), rtol=1e-12)
    heat_x, heat = series.aggregates.heat.points()
    per_worker = values["compute_ms"].reshape(40, 8, 4).max(axis=2)
    np.testing.assert_allclose(heat, per_worker)
    assert [s.label for s in run.stragglers()] == ["worker 5"]   # the others wait for its r3


def test_row_quantiles_match_numpy_with_missing_values() -> None:
    rng = np.random.default_rng(5)
    grid = rng.normal(size=(300, 24))
    grid[rng.random(grid.shape) < 0.3] = np.nan
    grid[7] = np.nan                               # a step where no replica measured it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = np.nanquantile(grid, list(STATS.values()), axis=1).T
    np.testing.assert_allclose(row_quantiles(grid, tuple(STATS.values())), expected,
                               rtol=1e-12, equal_nan=True)


def test_long_runs_keep_bounded_bucket_means() -> None:
    run, values = synthetic_run(workers=4, replicas=8, steps=300, slow=(1, 3))
    series = RunSeries(replicas=8, workers=4, max_points=64)
    series.ingest(run.block_since(0))
    series.finish()
    x, y = series.series[("loss", "median")].points()
    assert 32 <= len(x) <= 64
    k = series.aggregates.bands.k
    medians = np.median(values["loss"], axis=1)
    np.testing.assert_allclose(y, [medians[i * k:(i + 1) * k].mean() for i in range(len(x))])
    # the min-max band spans each bucket's extremes: one slow step stays visible
    spike = values["compute_ms"].max()
    _, top = series.series[("time", "max")].points()
    _, low = series.series[("time", "min")].points()
    assert top.max() == spike and low.min() == values["compute_ms"].min()
    slowest = values["compute_ms"].max(axis=1)
    np.testing.assert_allclose(top, [slowest[i * k:(i + 1) * k].max() for i in range(len(x))])


@pytest.mark.parametrize(("workers", "replicas", "aggregated"),
                         [(4, 4, False), (2, 8, False), (17, 1, True), (3, 6, True)])
def test_aggregates_above_16_series(workers: int, replicas: int, aggregated: bool) -> None:
    run, _ = synthetic_run(workers, replicas, steps=5, slow=(0, 0))
    fig = run_figure(run)
    names = [t["name"] for t in fig["data"]]
    note = " ".join(a["text"] for a in fig["layout"]["annotations"] if a["name"] == "notes")
    assert ("median of replicas" in names) is aggregated
    assert any(t["type"] == "heatmap" for t in fig["data"]) is aggregated
    assert (f"{workers} workers x {replicas} replicas: showing median" in note) is aggregated
    lines = [t for t in fig["data"] if t["name"] == "w0/r0"]
    assert len(lines) == (0 if aggregated else 4)     # loss, grad norm, all-reduce, time
    if aggregated:        # asked for: every replica's line
        every = run_figure(run, per_replica=True)
        assert sum(t["name"] == "w0/r0" for t in every["data"]) == 4


def test_a_live_figure_begun_on_part_of_a_step_keeps_every_panel() -> None:
    """The first rows a live dashboard sees are often one worker's part of step 0; no step is
    finished, yet the gradient-norm panel must be chosen (it was left out, for good)."""
    run, _ = synthetic_run(workers=64, replicas=8, steps=2)
    series = RunSeries(replicas=8, workers=64)
    series.ingest(run.block_since(0)[:8])           # worker 0 of step 0
    model = FigureModel(series, strategy="multiworker")
    model.layout()
    assert model.panels == ["loss", "grad_norm", "allreduce_ms", "time", "heatmap"]
    assert not any("no gradient norm" in n for n in model.notes), model.notes
    bare = RunSeries(replicas=8, workers=64)       # a step cell without grads: still said
    rows = run.block_since(0)[:8].copy()
    rows[:, COL.grad_norm] = np.nan
    bare.ingest(rows)
    model = FigureModel(bare, strategy="multiworker")
    model.layout()
    assert "grad_norm" not in model.panels
    assert any("no gradient norm" in n for n in model.notes), model.notes


def test_static_svg_fills_the_bands_and_draws_the_heatmap() -> None:
    run, _ = synthetic_run(workers=8, replicas=4, steps=20)
    svg = figure_svg(run_figure(run))
    assert svg.count("<polygon") == 2 * 4         # two bands in each of the four panels
    assert "showing median, 10-90% and min-max bands" in svg
    # the heatmap: one image, a pixel per worker and step, worker 0 on top as in the live
    # figure (plotly's reversed axis), the slow worker 5 the brightest row
    pixels = _png_pixels(svg)
    assert pixels.shape == (8, 20, 4) and (pixels[..., 3] == 255).all()
    brightness = pixels[..., :3].astype(int).sum(axis=2).mean(axis=1)
    assert int(np.argmax(brightness)) == 5, brightness


def _png_pixels(svg: str) -> np.ndarray:
    """The RGBA pixels of the one PNG image in ``svg`` (rows top to bottom)."""
    import base64
    import re
    import struct
    import zlib

    found = re.findall(r'href="data:image/png;base64,([^"]+)"', svg)
    assert len(found) == 1, len(found)
    png = base64.b64decode(found[0])
    width, height = struct.unpack(">II", png[16:24])
    assert png[24:26] == bytes([8, 6])           # 8 bits, RGBA
    body, at = b"", 8
    while at < len(png):
        size = struct.unpack(">I", png[at:at + 4])[0]
        if png[at + 4:at + 8] == b"IDAT":
            body += png[at + 8:at + 8 + size]
        at += 12 + size
    raw = np.frombuffer(zlib.decompress(body), dtype=np.uint8).reshape(height, 1 + 4 * width)
    assert (raw[:, 0] == 0).all()                 # no row filter
    return raw[:, 1:].reshape(height, width, 4)
