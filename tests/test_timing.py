"""Timing attribution when a step makes several collectives, and BatchNormalization's note.

A step cell training a model with SyncBatchNormalization (``BatchNormalization(
synchronized=True)``) all-reduces batch statistics before the gradients. What a user reads in
``run.metrics`` must still be the gradient all-reduce as ``allreduce_ms``, the rest as
``other_collective_ms``; the same cell with plain BatchNormalization gets a note that the
replicas' moving statistics drift apart. Speed is not asserted: benchmarks/syncbn.py prints
the numbers side by side.
"""

import numpy as np
import pandas as pd
import pytest
from bn_scenario import BUILD, GRADIENT_BYTES, SETUP, STEP
from helpers import run_ok

import nbdist

TIMED = STEP.format(data="bn_ds", flags="--steps 10 --timing-every 1")
ROUNDS = 3
TIMES = ["compute_ms", "wait_ms", "allreduce_ms", "other_collective_ms"]


@pytest.fixture(scope="module")
def trained(ip):
    """The same step cell on the BN and the SyncBN model, under `mirrored --devices 2`, in
    alternating rounds (so that this shared machine's load weighs on both alike):
    {synchronized: (its Runs, the last model's first BN layer's per-replica moving means)}."""
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 2")
    run_ok(ip, SETUP)
    out = {False: ([], None), True: ([], None)}
    for _ in range(ROUNDS):
        for synchronized in (False, True):
            run_ok(ip, BUILD.format(synchronized=synchronized))
            run_ok(ip, TIMED)
            strategy = nbdist.strategy()
            moving = ip.user_ns["model"].get_layer("bn1").moving_mean
            copies = [v.numpy() for v in strategy.experimental_local_results(moving.value)]
            out[synchronized] = ([*out[synchronized][0], nbdist.runs[-1]], copies)
    yield out
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")


def _medians(runs):
    frames = [run.metrics for run in runs]
    pooled = pd.concat([frame[frame["step"] >= 2] for frame in frames])   # after tracing
    return pooled[TIMES].median()


def test_syncbn_gradient_allreduce_is_allreduce_ms_and_the_rest_is_reported(trained):
    (bn_runs, _), (sync_runs, _) = trained[False], trained[True]
    for run in (*bn_runs, *sync_runs):
        assert run.status == "done" and run.replicas == 2 and run.steps_done == 10
        assert run.metrics[TIMES].notna().all().all()
        # The bus bandwidth's bytes: the gradients alone, the same for both models.
        assert run.allreduce_bytes == GRADIENT_BYTES
    bn, sync = bn_runs[-1], sync_runs[-1]
    # The other collectives: none with BN; SyncBN's batch statistics on every step.
    assert all((run.metrics["other_collective_ms"] == 0).all() for run in bn_runs)
    assert all((run.metrics["other_collective_ms"] > 0).all() for run in sync_runs)
    [note] = [n for n in sync.notes if "other collective" in n]
    assert "allreduce_ms and the bus bandwidth are the gradient all-reduce only" in note
    assert "apply_gradients" in note and f"{GRADIENT_BYTES} bytes" in note
    assert not any("other collective" in n for n in bn.notes)
    # Attribution, not speed: the gradient all-reduce (same bytes) is timed alike in both, and
    # the compute before it is not swallowed by the statistics' collectives. (Timing from the
    # first collective to the last made SyncBN's allreduce_ms 20-30x BN's here, and its
    # compute_ms 0.1-0.15x; attributed, 0.7-1x and 0.75-0.8x.)
    m_bn, m_sync = _medians(bn_runs), _medians(sync_runs)
    ratio = m_sync["allreduce_ms"] / m_bn["allreduce_ms"]
    assert 0.1 < ratio < 10, (m_bn.to_dict(), m_sync.to_dict())
    assert m_sync["compute_ms"] > 0.3 * m_bn["compute_ms"], (m_bn.to_dict(), m_sync.to_dict())
    assert "other_collective_ms" in sync.summary() and "other_collective_ms" not in bn.summary()


def test_plain_batchnorm_under_several_replicas_gets_a_note_and_its_statistics_drift(trained):
    (bn_runs, bn_copies), (sync_runs, sync_copies) = trained[False], trained[True]
    bn, sync = bn_runs[-1], sync_runs[-1]
    [note] = [n for n in bn.notes if "BatchNormalization" in n and "synchronized" in n]
    assert "2 BatchNormalization layers (bn1, bn2)" in note and "2 replicas" in note
    assert "BatchNormalization(synchronized=True)" in note and "drift apart" in note
    # What the note says: the replicas' copies of moving_mean differ, unless synchronized.
    assert not np.array_equal(*bn_copies)
    np.testing.assert_array_equal(*sync_copies)
    assert not any("synchronized=True" in n for n in sync.notes)


def test_no_batchnorm_note_on_one_replica(ip, trained):
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "one_device")
    run_ok(ip, BUILD.format(synchronized=False))
    run_ok(ip, STEP.format(data="bn_ds", flags="--steps 3"))
    run = nbdist.runs[-1]
    assert run.status == "done" and run.replicas == 1
    assert not any("synchronized" in n for n in run.notes)


# -- the host side of the attribution (numpy only) --------------------------------------------
@pytest.mark.unit
def test_split_timing_counts_overlapping_other_collectives_once_and_not_as_compute():
    from nbdist.telemetry.collectives import split_timing

    # Two replicas. Replica 0: begin 0, other collectives [1, 3] and [2, 4] (overlapping),
    # [6, 7] after the gradients; gradients 5 -> 5.5. Replica 1 reaches the gradients at 5.25.
    ms = split_timing({
        "t_begin": np.array([0.0, 0.0]) / 1e3,
        "t_grad_start": np.array([5.0, 5.25]) / 1e3, "t_grad_end": np.array([5.5, 5.5]) / 1e3,
        "t_other_start_0": np.array([1.0, 1.0]) / 1e3, "t_other_end_0": np.array([3.0, 2.0]) / 1e3,
        "t_other_start_1": np.array([2.0, 2.0]) / 1e3, "t_other_end_1": np.array([4.0, 2.5]) / 1e3,
        "t_other_start_2": np.array([6.0, 6.0]) / 1e3, "t_other_end_2": np.array([7.0, 6.5]) / 1e3,
    })
    np.testing.assert_allclose(ms["other_collective_ms"], [4.0, 2.0])
    np.testing.assert_allclose(ms["compute_ms"], [2.0, 3.75])
    np.testing.assert_allclose(ms["wait_ms"], [0.25, 0.0])
    np.testing.assert_allclose(ms["allreduce_ms"], [0.25, 0.25])
    plain = split_timing({"t_begin": np.zeros(2), "t_grad_start": np.array([0.002, 0.003]),
                          "t_grad_end": np.array([0.004, 0.004])})
    assert plain["other_collective_ms"] == [0.0, 0.0]
    np.testing.assert_allclose(plain["compute_ms"], [2.0, 3.0])
    # A step whose gradient all-reduce did not run (a loss scale optimizer skipped it): its
    # stamps are NaN, and so are its times, not 0 ms.
    skipped = split_timing({"t_begin": np.zeros(2), "t_grad_start": np.full(2, np.nan),
                            "t_grad_end": np.full(2, np.nan)})
    for name in ("compute_ms", "wait_ms", "allreduce_ms"):
        assert np.isnan(skipped[name]).all(), (name, skipped[name])


@pytest.mark.unit
def test_the_gradient_allreduce_is_the_optimizers_else_the_largest():
    from nbdist.telemetry.collectives import Collective, attribute

    stats, grads, late = (Collective("s0", "s1", 400, False), Collective("g0", "g1", 100, True),
                          Collective("m0", "m1", 4, False))
    chosen = attribute([stats, grads, late])
    assert chosen.gradient == (grads,) and chosen.others == (stats, late)
    assert chosen.by_optimizer and chosen.gradient_bytes == 100
    assert chosen.stamps("b") == {"t_begin": "b", "t_grad_start": "g0", "t_grad_end": "g1",
                                  "t_other_start_0": "s0", "t_other_end_0": "s1",
                                  "t_other_start_1": "m0", "t_other_end_1": "m1"}
    hand = attribute([Collective("a", "b", 8, False), Collective("c", "d", 400, False),
                      Collective("e", "f", 400, False)])
    assert not hand.by_optimizer and hand.gradient[0].t0 == "e" and len(hand.others) == 2
    assert "most bytes" in hand.describe() and hand.gradient_bytes == 400


@pytest.mark.unit
def test_the_dashboard_draws_other_collectives_beside_the_gradient_allreduce():
    from nbdist.telemetry.run import Run, RunWriter

    ALLREDUCE = "slowest replica's all-reduce"

    def run_with(other_ms):
        run = Run(id=1, mode="step", strategy="mirrored", replicas=2)
        for step in range(20):
            RunWriter(run).record_step(
                step, 0, loss=[1.0, 1.0], step_ms=9.0, allreduce_ms=[1.0, 2.0], wait_ms=[0.0, 0.0],
                compute_ms=[3.0, 3.0], other_collective_ms=[other_ms, 2 * other_ms])
        run.allreduce_bytes = 1000
        RunWriter(run).finish("done")
        return run.plot()

    def allreduce_panel(fig):      # the panel (y axis) of the slowest replica's all-reduce
        [axis] = {t.yaxis for t in fig.data if t.name == ALLREDUCE}
        return {t.name: t for t in fig.data if t.yaxis == axis}

    sync = allreduce_panel(run_with(4.0))
    assert set(sync) == {"replica 0", "replica 1", ALLREDUCE,
                         "other collectives, slowest replica"}
    assert set(sync["other collectives, slowest replica"].y) == {8.0}
    assert set(sync[ALLREDUCE].y) == {2.0}      # the gradient all-reduce alone
    assert "other collectives, slowest replica" not in allreduce_panel(run_with(0.0))
