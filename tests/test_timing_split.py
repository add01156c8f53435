"""The host-side arithmetic of step timing: split times, the gradient allreduce chosen, other
collectives drawn beside it."""

import numpy as np


# -- the host side of the attribution (numpy only) --------------------------------------------
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
