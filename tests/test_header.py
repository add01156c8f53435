"""The dashboard header's formats (units, durations, epochs counted from 1), the finished
states, and what the lab status bar is sent: the same step, epoch and stragglers."""

from __future__ import annotations

import re

import pytest

from nbdist.fitrecord import planned_length
from nbdist.lab.state import LabState
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.header import epoch_text, format_bandwidth, format_duration, header_html
from nbdist.widgets.series import RunSeries


@pytest.mark.parametrize(("bytes_per_s", "text"), [
    (37_600.0, "37.6 KB/s"),          # multiworker over gRPC: the "3.76e-05 GB/s"
    (750e6, "750 MB/s"),
    (999.6e6, "1 GB/s"),              # rounds up into the next unit, not "1e+03 MB/s"
    (3.76e9, "3.76 GB/s"),
    (2.5e12, "2.5 TB/s"),
    (12.0, "12 B/s"),
])
def test_bandwidth_takes_the_unit_that_reads_best(bytes_per_s: float, text: str) -> None:
    assert format_bandwidth(bytes_per_s) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0.4, "0 s"), (42.2, "42 s"), (59.7, "1 min 00 s"), (125, "2 min 05 s"),
    (2 * 3600 + 7 * 60 + 20, "2 h 07 min"), (-3, "0 s"),
])
def test_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_epochs_are_counted_from_one() -> None:
    assert epoch_text(0, 3) == "epoch 1/3"
    assert epoch_text(2, 3) == "epoch 3/3"
    assert epoch_text(4, None) == "epoch 5"


def _run(steps: int, *, epochs: int = 3, per_epoch: int = 10, status: str = "running",
         slow: int | None = None, nbytes: int | None = None) -> tuple[Run, RunSeries]:
    run = Run(id=7, mode="step", strategy="multiworker", replicas=1, workers=2,
              total_steps=epochs * per_epoch, epochs=epochs, allreduce_bytes=nbytes)
    series = RunSeries(replicas=1, workers=2)
    for s in range(steps):
        for w in range(2):
            RunWriter(run).record_step(
                s, s // per_epoch, loss=[1.0], step_ms=10.0, worker=w, allreduce_ms=[100.0],
                compute_ms=[30.0 if w == slow else 10.0],
                # the other worker waits for the slow one before the all-reduce
                wait_ms=None if slow is None else [0.0 if w == slow else 20.0])
    series.ingest(run.rows_since(0))
    if status != "running":
        RunWriter(run).finish(status)
    return run, series


def _text(markup: str) -> str:
    return re.sub(r"<[^>]+>", "", markup)


def test_header_shows_where_the_run_is_in_two_unbreakable_lines() -> None:
    run, series = _run(13, nbytes=4000)
    markup = header_html(run, series, final=False)
    who, where = markup.split("<br>")
    assert _text(who) == "Run 7 · multiworker · 1 replica × 2 workers"
    assert _text(where).startswith("step 13/30 · epoch 2/3")
    # 4000 B x 2(2-1)/2 / 100 ms
    assert "bus bw 40 KB/s" in _text(where)
    items = re.findall(r"<span style='white-space:nowrap'>(.*?)</span>", markup)
    assert "bus bw 40 KB/s" in items     # a narrow output breaks between items, never in one


@pytest.mark.parametrize(("status", "outcome"), [
    ("done", "✓ finished"), ("stopped", "■ stopped"), ("interrupted", "■ interrupted"),
    ("failed", "✗ failed"),
])
def test_a_finished_header_says_how_the_run_ended(status: str, outcome: str) -> None:
    run, series = _run(30, status=status)
    text = _text(header_html(run, series, final=True))
    assert outcome in text and "step 30/30 · epoch 3/3" in text and "left" not in text


def test_a_finished_step_run_points_to_its_explanation() -> None:
    run, series = _run(30, status="done")
    assert "why this speed? %distribute explain 7" in _text(header_html(run, series, final=True))
    assert "explain" not in _text(header_html(run, series, final=False))   # not while it runs


def test_the_summary_counts_steps_and_epochs_from_one_like_the_header() -> None:
    run, _ = _run(30, status="done")
    assert "step 30/30 (epoch 3/3)" in run.summary()


def test_lab_state_has_the_runs_epoch_from_one_and_its_stragglers_while_it_runs() -> None:
    run, _ = _run(13, slow=1)
    state = LabState.of(None, [run], "0").to_json()
    assert state["run"] == {"id": 7, "status": "running", "step": 13, "epoch": 2,
                            "total_steps": 30}
    assert state["stragglers"] == ["worker 1"]
    RunWriter(run).finish("done")
    assert LabState.of(None, [run], "0").stragglers == []
    empty = Run(id=8, mode="fit", strategy="mirrored", replicas=2)
    assert LabState.of(None, [empty], "0").to_json()["run"]["epoch"] == 0


def test_a_fits_length_comes_from_keras_callback_params() -> None:
    assert planned_length({"epochs": 3, "steps": 16, "verbose": 0}) == (3, 16)
    assert planned_length({"epochs": 3, "steps": None}) == (3, None)   # unknown cardinality
    assert planned_length(None) == (None, None)
