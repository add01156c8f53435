"""Telling a worker's wait for a later one from its input time (cluster/multiworker/arrivals),
on rows built by hand: two workers, one replica each."""

import numpy as np
import pytest

from nbdist.cluster.multiworker import arrivals
from nbdist.cluster.multiworker.arrivals import StepAligner
from nbdist.telemetry.rows import COLUMNS, POSITION
from nbdist.telemetry.run import Run, RunWriter


def rows(worker, steps, *, data_ms, step_ms=5.0, start=1000.0, late_s=0.0, cycle_s=0.4,
         clock=0.0):
    """One worker's rows: step s starts fetching at ``start + s * cycle_s + late_s`` on its
    clock (``clock``: its offset from the others')."""
    block = np.full((len(steps), len(COLUMNS)), np.nan)
    for i, s in enumerate(steps):
        fetch = start + s * cycle_s + late_s + clock
        block[i, [POSITION.step, POSITION.epoch, POSITION.replica, POSITION.worker]] = \
            [s, 0, 0, worker]
        block[i, POSITION.data_ms] = data_ms[i] if isinstance(data_ms, list) else data_ms
        block[i, POSITION.step_ms] = step_ms
        block[i, POSITION.wall_time] = fetch + (block[i, POSITION.data_ms] + step_ms) / 1e3
    return block


def column(released, name):
    block = np.concatenate([b for b, _ in released])
    order = np.lexsort((block[:, POSITION.worker], block[:, POSITION.step]))
    return block[order, getattr(POSITION, name)].reshape(-1, 2)


def stragglers(released):
    """What the kernel's Run of two workers finds in the released rows."""
    run = Run(id=1, mode="step", strategy="multiworker", replicas=1, workers=2)
    for block, extras in released:
        RunWriter(run).append_block(block, extras or None)
    return run.stragglers()


def test_a_workers_wait_for_a_later_one_moves_from_data_to_wait_and_names_it():
    """Worker 1 reaches each step 300 ms after worker 0, which waits in the iterator's
    collective: worker 0's fetch takes 302 ms, worker 1's 2 ms."""
    steps = list(range(8))
    aligner = StepAligner(2)
    assert aligner.add(0, rows(0, steps, data_ms=302.0), {}) == []   # held for worker 1
    released = aligner.add(1, rows(1, steps, data_ms=2.0, late_s=0.3), {})
    assert column(released, "data_ms") == pytest.approx(np.full((8, 2), 2.0))
    assert column(released, "wait_ms") == pytest.approx(np.tile([300.0, 0.0], (8, 1)))
    [straggler] = stragglers(released)
    assert straggler.label == "worker 1" and straggler.waited_ms == pytest.approx(300.0)
    assert straggler.note().startswith("straggler: worker 1; the other workers waited a median")


def test_a_slower_input_or_a_clock_offset_is_not_taken_for_waiting():
    steps = list(range(8))
    # both reach each step together; worker 0's own input is slower: nothing moves
    aligner = StepAligner(2)
    aligner.add(0, rows(0, steps, data_ms=40.0), {})
    released = aligner.add(1, rows(1, steps, data_ms=2.0), {})
    assert column(released, "data_ms") == pytest.approx(np.tile([40.0, 2.0], (8, 1)))
    assert np.isnan(column(released, "wait_ms")).all() and stragglers(released) == []
    # worker 1's clock is 5 s behind and their fetches take the same time: nothing moves
    aligner = StepAligner(2)
    aligner.add(0, rows(0, steps, data_ms=3.0), {})
    released = aligner.add(1, rows(1, steps, data_ms=3.0, clock=-5.0), {})
    assert np.isnan(column(released, "wait_ms")).all() and stragglers(released) == []


def test_rows_wait_for_the_other_worker_at_most_hold_s_and_all_are_flushed(monkeypatch):
    aligner = StepAligner(2)
    now = [100.0]
    monkeypatch.setattr(arrivals.time, "monotonic", lambda: now[0])
    assert aligner.add(0, rows(0, [0, 1, 2], data_ms=1.0), {"acc": np.ones(3)}) == []
    released = aligner.add(1, rows(1, [0], data_ms=1.0), {})   # only step 0 is complete
    block = np.concatenate([b for b, _ in released])
    assert sorted(block[:, POSITION.step].tolist()) == [0, 0]
    extras = np.concatenate([e["acc"] for _, e in released])
    assert sorted(np.nan_to_num(extras).tolist()) == [0.0, 1.0]   # worker 1's has none
    now[0] += arrivals.HOLD_S + 0.1   # worker 1's later rows never come
    late = aligner.add(1, np.empty((0, len(COLUMNS))), {})
    assert [b[:, POSITION.step].tolist() for b, _ in late] == [[1.0, 2.0]]
    aligner.add(0, rows(0, [3], data_ms=1.0), {})
    assert [b[:, POSITION.step].tolist() for b, _ in aligner.flush()] == [[3.0]]
    assert aligner.flush() == []
