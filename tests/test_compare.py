"""A fit's per-batch loss recovered from Keras' running means, its metrics and validation in the
dashboard's figure, runs overlaid by ``nbdist.compare``, and a resumed run's curves going on
from the run it resumed: all from Runs built from rows (no TensorFlow)."""

import numpy as np
import pytest

import nbdist
from nbdist.errors import CompareError
from nbdist.fitrecord import BATCH_LOSS_LABEL, FitRecorder, batch_value
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.compare import comparison_figure
from nbdist.widgets.figure import run_figure


def keras_running_means(losses_per_epoch):
    """What Keras logs as ``loss`` after each batch: the mean over the epoch so far."""
    return [np.cumsum(ls) / np.arange(1, len(ls) + 1) for ls in losses_per_epoch]


def test_batch_value_recovers_each_batch_and_groups_of_batches():
    losses = np.array([2.0, 1.5, 1.7, 0.9, 1.1])
    means = keras_running_means([losses])[0]
    got = [batch_value(b + 1, means[b], b, means[b - 1] if b else 0.0) for b in range(5)]
    np.testing.assert_allclose(got, losses)
    # steps_per_execution=2: Keras logs after batches 2 and 4 only: each log gives their mean
    assert batch_value(4, means[3], 2, means[1]) == pytest.approx(losses[2:4].mean())
    assert np.isnan(batch_value(2, 1.0, 2, 1.0))        # no new batch: no value


def fit_run(losses_per_epoch, accuracy=0.5, val=True):
    """A Run recorded by the kernel's fit recorder, fed the logs Keras would send."""
    run = Run(id=1, mode="fit", strategy="mirrored", replicas=2, loss_label=BATCH_LOSS_LABEL)
    recorder = FitRecorder(run, [], central_storage=False)
    recorder.params = {"epochs": len(losses_per_epoch), "steps": len(losses_per_epoch[0])}
    recorder.on_train_begin()
    for epoch, means in enumerate(keras_running_means(losses_per_epoch)):
        recorder.on_epoch_begin(epoch)
        for batch, mean in enumerate(means):
            recorder.on_train_batch_begin(batch)
            recorder.on_train_batch_end(batch, {"loss": mean, "accuracy": accuracy + epoch / 10})
        logs = {"loss": means[-1], "accuracy": accuracy + epoch / 10}
        if val:
            logs |= {"val_loss": means[-1] + 0.1, "val_accuracy": accuracy}
        recorder.on_epoch_end(epoch, logs)
    RunWriter(run).finish("done")
    return run


def test_a_fit_records_each_batch_loss_its_metrics_and_each_epoch():
    losses = [[2.0, 1.0, 1.5, 0.5], [0.8, 0.4, 0.6, 0.2]]
    run = fit_run(losses)
    frame = run.metrics
    np.testing.assert_allclose(frame["batch_loss"], np.ravel(losses))   # not the staircase
    np.testing.assert_allclose(frame["loss"], np.ravel(keras_running_means(losses)))
    assert list(frame["accuracy"]) == [0.5] * 4 + [0.6] * 4
    epochs = run.epoch_metrics
    assert list(epochs["epoch"]) == [0, 1] and list(epochs["step"]) == [3, 7]
    np.testing.assert_allclose(epochs["val_loss"], [1.35, 0.6])
    assert "run.epoch_metrics" in run.__doc__


def lines(fig, axis=None):
    return {t["name"]: t for t in fig["data"] if axis is None or t.get("yaxis") == axis}


def test_the_fit_figure_draws_metrics_and_validation_per_epoch():
    run = fit_run([[2.0, 1.0, 1.5, 0.5], [0.8, 0.4, 0.6, 0.2]])
    fig = run_figure(run)
    loss = lines(fig, "y")
    assert set(loss) == {BATCH_LOSS_LABEL, "loss, Keras' running mean over the epoch",
                         "val_loss (per epoch)"}
    np.testing.assert_allclose(loss[BATCH_LOSS_LABEL]["y"], [2.0, 1.0, 1.5, 0.5, 0.8, 0.4,
                                                             0.6, 0.2])
    assert list(loss["val_loss (per epoch)"]["x"]) == [3, 7]
    assert loss["val_loss (per epoch)"]["mode"] == "lines+markers"
    metrics = lines(fig, "y2")
    assert set(metrics) == {"accuracy (running mean over the epoch)",
                            "val_accuracy (per epoch)"}
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert "<b>metrics</b>" in titles


def test_sampled_timings_say_so_in_their_panel_title():
    run = Run(id=3, mode="step", strategy="mirrored", replicas=2)
    for s in range(40):
        timed = s % 10 == 0
        RunWriter(run).record_step(s, 0, loss=[1.0, 1.0], step_ms=3.0,
                                   allreduce_ms=[0.5, 0.6] if timed else None,
                                   compute_ms=[2.0, 2.1] if timed else None)
    RunWriter(run).finish("done")
    titles = {a["name"]: a["text"] for a in run_figure(run)["layout"]["annotations"]}
    assert titles["title:allreduce_ms"].endswith("sampled every 10 steps")
    assert titles["title:time"].endswith("sampled every 10 steps")
    assert "sampled" not in titles["title:loss"]


def step_run(id_, steps, loss_scale=1, wall=1000.0, directory=None, first=0):
    run = Run(id=id_, mode="step", strategy="mirrored", replicas=2, loss_scale=loss_scale,
              started=wall)
    if directory:
        RunWriter(run).checkpointed(directory, first)
    for s in steps:
        RunWriter(run).record_step(s, 0, loss=[1.0 / (s + 1), 3.0 / (s + 1)], step_ms=3.0,
                                   wall_time=wall + s + 1)
    RunWriter(run).finish("done")
    return run


def test_compare_draws_one_line_per_run_on_steps_or_time():
    a = step_run(1, range(30))
    b = step_run(2, range(20), loss_scale=2, wall=5000.0)
    fig = comparison_figure([a, b])
    drawn = lines(fig)
    # nothing sets them apart but their number: what they share is in the title
    assert list(drawn)[:2] == ["run 1", "run 2"]
    assert fig["layout"]["title"]["text"] == "global loss: 2 runs · mirrored · 2 replicas"
    one, two = list(drawn.values())[:2]
    assert list(one["x"]) == list(range(30))
    np.testing.assert_allclose(one["y"], [2.0 / (s + 1) for s in range(30)])      # the mean
    np.testing.assert_allclose(two["y"], [4.0 / (s + 1) for s in range(20)])      # x scale 2
    timed = lines(comparison_figure([a, b], x="time"))
    assert list(timed["run 2"]["x"]) == [s + 1.0 for s in range(20)]
    assert comparison_figure([a, b], x="time")["layout"]["xaxis"]["title"]["text"] == \
        "seconds since the run started"
    step_ms = comparison_figure(a, metric="step_ms")
    assert step_ms["layout"]["yaxis"]["title"]["text"] == "step_ms (mean over replicas)"


def test_compare_draws_a_fits_metrics_and_validation_and_names_runs_without_them():
    fit = fit_run([[2.0, 1.0, 1.5, 0.5], [0.8, 0.4, 0.6, 0.2]])
    fit.title = "wide model"
    step = step_run(2, range(8))
    fig = comparison_figure([fit, step], metric="val_loss")
    [(name, line)] = lines(fig).items()
    assert name == "wide model" and line["mode"] == "lines+markers"
    assert list(line["x"]) == [3, 7]
    assert fig["layout"]["annotations"][0]["text"] == \
        "not drawn (no val_loss): run 2"


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"x": "clock"}, "x is the axis the runs are drawn against, \"step\""),
    ({"smoothing": 1.0}, "give a weight from 0 (no smoothing) up to but not 1"),
    ({"metric": "nope"}, "none of the 2 runs recorded that metric. They have: "),
    ({"runs": "abc"}, "takes a Run or a list of Runs"),
    ({"runs": [1]}, "every item must be a Run"),
    ({"runs": []}, "give at least one Run"),
])
def test_compare_refuses_bad_input_with_what_to_do(kwargs, says):
    runs = [step_run(1, range(5)), step_run(2, range(5))]
    with pytest.raises(CompareError, match="nbdist.compare") as err:
        comparison_figure(**{"runs": runs, **kwargs})
    assert says in str(err.value)


def test_compare_refuses_a_run_without_steps():
    empty = Run(id=9, mode="step", strategy="mirrored", replicas=2, status="failed")
    with pytest.raises(CompareError) as err:
        comparison_figure([step_run(1, range(5)), empty])
    assert "run 9 (failed) recorded no step" in str(err.value)


def test_a_resumed_run_continues_the_curves_of_the_run_it_resumed(tmp_path):
    where = str(tmp_path / "step")
    died = step_run(1, range(23), directory=where)
    resumed = step_run(2, range(16, 24), directory=where, first=16, wall=2000.0)
    assert resumed.resumed_from is died and resumed.resumed_at == 16
    assert died.resumed_from is None
    fig = run_figure(resumed)                      # the dashboard's figure
    assert "resumed from run 1 at step 16" in fig["layout"]["title"]["text"]
    loss = lines(fig, "y")
    assert list(loss["replica 0"]["x"]) == list(range(24))    # no blank steps 0-15
    assert list(loss["resumed from run 1 at step 16"]["x"]) == [15.5, 15.5]
    # compare: alone, the line starts at step 0; beside the run it resumed, it joins its end
    alone = lines(comparison_figure([resumed]))
    name = "run 2 · mirrored · 2 replicas · resumed run 1 at step 16"   # alone: all it is
    assert list(alone[name]["x"]) == list(range(24))
    both = lines(comparison_figure([died, resumed]))
    assert list(both["run 2 · resumed run 1 at step 16"]["x"]) == list(range(15, 24))
    assert list(both["run 1"]["x"]) == list(range(23))


def test_nbdist_compare_defaults_to_every_run_with_steps(monkeypatch):
    from nbdist.telemetry import run as store

    runs = store.RunList([step_run(1, range(5)), Run(id=2, mode="step", strategy="mirrored",
                                                      replicas=2), step_run(3, range(7))])
    monkeypatch.setattr(store, "runs", runs)
    fig = nbdist.compare()
    assert [t.name for t in fig.data if t.showlegend is not False] == ["run 1", "run 3"]
    bundle = fig._repr_mimebundle_()
    assert "<svg" in bundle["image/svg+xml"] and ">run 3</text>" in bundle["image/svg+xml"]
    assert bundle["text/plain"].startswith("global loss: 2 runs · mirrored · 2 replicas")
    monkeypatch.setattr(store, "runs", store.RunList())
    with pytest.raises(CompareError, match="no run of this kernel has recorded a step yet"):
        nbdist.compare()


def test_compare_runs_differing_in_learning_rate_are_named_by_it():
    a, b = step_run(1, range(10)), step_run(2, range(10))
    a.params, b.params = {"learning_rate": 0.01}, {"learning_rate": 0.001}
    fig = comparison_figure([a, b])
    assert [t["name"] for t in fig["data"][:2]] == ["run 1 · lr 0.01", "run 2 · lr 0.001"]
    assert a.label == "run 1 · mirrored · 2 replicas · lr 0.01"    # not in nbdist.runs: alone


def test_compare_controls_smooth_switch_the_x_axis_and_the_scale():
    from nbdist.widgets.controls import SMOOTHING_LEVELS, ema
    from nbdist.widgets.static import _unbdata

    a, b = step_run(1, range(30)), step_run(2, range(20), wall=5000.0)
    fig = comparison_figure([a, b], smoothing=0.6)
    one, two, raw_one, raw_two = fig["data"]
    assert (raw_one["opacity"], raw_one["showlegend"], raw_one["legendgroup"]) == \
        (0.2, False, "run 1")
    np.testing.assert_allclose(raw_one["y"], [2.0 / (s + 1) for s in range(30)])
    np.testing.assert_allclose(one["y"], ema(raw_one["y"], 0.6))
    assert one["y"][-1] > raw_one["y"][-1]          # the smoothed line lags a falling loss
    [slider] = fig["layout"]["sliders"]
    assert [s["label"] for s in slider["steps"]] == [f"{w:g}" for w in SMOOTHING_LEVELS]
    assert slider["steps"][slider["active"]]["label"] == "0.6"
    off = slider["steps"][0]["args"]
    assert off[1] == [0, 1]                         # the smoothed lines, not the raw copies
    np.testing.assert_allclose(_unbdata(off[0]["y"][0]), raw_one["y"], rtol=1e-6)
    x_menu, scale = fig["layout"]["updatemenus"]
    assert [b["label"] for b in x_menu["buttons"]] == ["step", "relative time", "wall time"]
    wall = x_menu["buttons"][2]["args"]
    assert wall[1]["xaxis.type"] == "date" and len(wall[0]["x"]) == 4   # every trace
    relative = _unbdata(x_menu["buttons"][1]["args"][0]["x"][1])
    np.testing.assert_allclose(relative, [s + 1.0 for s in range(20)])
    assert [b["args"][0]["yaxis.type"] for b in scale["buttons"]] == ["linear", "log"]
    assert comparison_figure([a], x="wall")["layout"]["xaxis"]["type"] == "date"


def test_the_dashboards_figure_says_when_each_step_ended_for_its_time_axes(tmp_path):
    where = str(tmp_path / "step")
    died = step_run(1, range(23), directory=where)
    resumed = step_run(2, range(16, 24), directory=where, first=16, wall=2000.0)
    meta = run_figure(resumed)["layout"]["meta"]["nbdist"]
    clock = meta["clock"]
    assert clock["steps"] == list(range(24)) and clock["started"] == died.started
    # the resumed steps ended in the later run's time: a gap where the first run died
    assert clock["seconds"][:16] == [s + 1.0 for s in range(16)]
    assert clock["seconds"][16] == 2000.0 + 17 - 1000.0
    assert meta["smoothing"] == 0 and meta["raw"] == [] and meta["lines"]
    smoothed = run_figure(step_run(3, range(1000)), smoothing=0.6)["layout"]["meta"]["nbdist"]
    assert len(smoothed["clock"]["steps"]) == 400 and smoothed["clock"]["steps"][-1] == 999
    assert smoothed["smoothing"] == 0.6 and [i for i, _ in smoothed["raw"]] == smoothed["lines"]


def test_compare_on_wall_time_draws_a_clock_in_its_svg():
    import re

    from nbdist.widgets.static import figure_bundle

    a = step_run(1, range(30), wall=1_700_000_000.0)
    svg = figure_bundle(comparison_figure([a], x="wall"), "test")["image/svg+xml"]
    ticks = re.findall(r'text-anchor="middle" font-family="sans-serif">([^<]*)</text>', svg)
    assert ticks[-1] == "wall time" and len(ticks) > 2, ticks      # the axis title last
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks[:-1]), ticks
    assert "<polyline" in svg
