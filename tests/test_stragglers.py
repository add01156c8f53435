"""nbdist.telemetry.stragglers: the replica or worker the others wait for, found from a Run's
rows (``Run.stragglers``), as the dashboard, the lab status bar and the notes show it."""

from __future__ import annotations

import numpy as np
import pytest

from nbdist.telemetry.run import Run, RunWriter
from nbdist.telemetry.stragglers import MIN_STEPS, last_to_arrive


def mirrored(steps: int, compute: list[float], *, step_ms: float = 10.0, every: int = 1,
             waits: bool = True) -> Run:
    """A mirrored Run whose replicas wait, before the all-reduce, for the slowest compute."""
    run = Run(id=1, mode="step", strategy="mirrored", replicas=len(compute))
    for s in range(steps):
        timed = s % every == 0
        RunWriter(run).record_step(
            s, 0, loss=[1.0] * len(compute), step_ms=step_ms,
            compute_ms=compute if timed else None,
            wait_ms=[max(compute) - c for c in compute] if timed and waits else None)
    return run


def test_the_replica_the_others_wait_for_is_the_straggler() -> None:
    run = mirrored(30, [2.0, 2.0, 8.0, 2.0])
    [s] = run.stragglers()
    assert (s.label, s.index, s.share, s.waited_ms) == ("replica 2", 2, 1.0, 6.0)
    assert s.note() == ("straggler: replica 2; the other replicas waited a median 6 ms for it "
                        "at 100% of the recent timed steps")


def test_no_straggler_when_the_wait_is_noise_or_nobody_waits() -> None:
    assert mirrored(30, [2.0, 2.0, 3.0, 2.0]).stragglers() == []   # 1 ms: under 2 ms
    # 5 ms is under a quarter of a 40 ms step
    assert mirrored(30, [2.0, 7.0], step_ms=40.0).stragglers() == []
    # slower compute, but the rows say nobody waited for it (no wait_ms measured)
    assert mirrored(30, [2.0, 8.0], waits=False).stragglers() == []
    # too few timed steps to judge
    assert mirrored(MIN_STEPS - 1, [2.0, 8.0]).stragglers() == []


def test_waited_for_at_too_few_steps_is_no_straggler() -> None:
    waits = np.array([[0.0, 10.0]] * 5 + [[10.0, 0.0]] * 5)   # each last at half the steps
    assert last_to_arrive(waits, 2.0) is None
    assert last_to_arrive(waits[:8], 2.0) == (0, 5 / 8, 10.0)


def test_a_worker_waits_as_long_as_its_least_waiting_replica() -> None:
    run = Run(id=2, mode="step", strategy="multiworker", replicas=2, workers=2)
    for s in range(10):
        for w in range(2):   # worker 1 is late: both of worker 0's replicas wait for it
            RunWriter(run).record_step(s, 0, loss=[1.0, 1.0], step_ms=20.0, worker=w,
                                       wait_ms=[30.0, 40.0] if w == 0 else [0.0, 12.0])
    [s] = run.stragglers()
    assert s.label == "worker 1" and s.waited_ms == pytest.approx(30.0)
    assert s.note().startswith("straggler: worker 1; the other workers waited a median 30 ms")


def test_rows_are_read_as_they_come_and_only_recent_steps_count() -> None:
    run = mirrored(30, [2.0, 8.0], every=3)        # timed every third step
    assert [s.label for s in run.stragglers()] == ["replica 1"]
    for s in range(30, 90):                        # then replica 0 is the late one
        RunWriter(run).record_step(s, 0, loss=[1.0, 1.0], step_ms=10.0,
                                   wait_ms=[0.0, 6.0], compute_ms=[8.0, 2.0])
        if s == 40:
            assert [x.label for x in run.stragglers()] == []   # 11 of 20 steps: neither
    assert [s.label for s in run.stragglers()] == ["replica 0"]


def test_a_worker_late_to_the_all_reduce_or_between_steps_is_waited_for() -> None:
    """Each worker's all-reduce starts at its arrival: the early one's is longer by its wait;
    a worker late between steps makes the others' steps longer (timed or not)."""
    inside = Run(id=3, mode="step", strategy="multiworker", replicas=1, workers=2)
    between = Run(id=4, mode="step", strategy="multiworker", replicas=1, workers=2)
    for s in range(12):
        for w in range(2):
            timed = s % 2 == 0   # the untimed steps show nothing of a wait in the step
            RunWriter(inside).record_step(
                s, 0, loss=[1.0], step_ms=40.0, worker=w,
                allreduce_ms=[31.0 if w == 0 else 1.0] if timed else None,
                wait_ms=[0.0] if timed else None,
                compute_ms=[5.0 if w == 0 else 35.0] if timed else None)
            RunWriter(between).record_step(s, 0, loss=[1.0], worker=w,
                                           step_ms=53.0 if w == 0 else 3.0)
    assert [(s.label, s.waited_ms) for s in inside.stragglers()] == [("worker 1", 30.0)]
    assert [(s.label, s.waited_ms) for s in between.stragglers()] == [("worker 1", 50.0)]
