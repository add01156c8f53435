"""nbdist.lab.verdict: the status bar's bottleneck of the live run.

Unit tests drive ``LiveVerdict`` with a clock of their own and an explanation of known cost:
it keeps explaining within its budget of the run's time, shows nothing for a run it cannot
explain, and survives explain failing (the state in a real shell:
tests/test_labverdict_kernel.py).
"""

from __future__ import annotations

import pytest

from nbdist.errors import ConfigError
from nbdist.lab import verdict as verdict_module
from nbdist.lab.state import LabState, Verdict
from nbdist.lab.verdict import LiveVerdict
from nbdist.telemetry.run import Run


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def verdict(run: Run, bottleneck: str = "input") -> Verdict:
    return Verdict(run=run.id, step=10, bottleneck=bottleneck, advice="Read ahead")


@pytest.fixture
def explaining(monkeypatch: pytest.MonkeyPatch):
    """A LiveVerdict on a fake clock whose explanations take ``cost`` seconds of it and
    return ``result(run)``; ``calls`` lists the times they started."""
    clock = Clock()
    calls: list[float] = []
    setup = {"cost": 0.2, "result": verdict}

    def fake(run: Run):
        calls.append(clock.now)
        clock.now += setup["cost"]
        return setup["result"](run)

    monkeypatch.setattr(verdict_module, "verdict_of", fake)
    changes: list[dict | None] = []
    live = LiveVerdict(lambda: changes.append(live.verdict), clock=clock)
    return live, clock, calls, setup, changes


def train(live: LiveVerdict, clock: Clock, run: Run, seconds: float, step_s: float = 0.01):
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step_s
        live.on_step(run)


def test_explanations_stay_within_their_budget_of_the_run_time(explaining) -> None:
    live, clock, calls, _, changes = explaining
    run = Run(id=1, mode="step", strategy="mirrored", replicas=4)
    start = clock.now
    train(live, clock, run, 300.0)
    # the first once the assumed cost fits the budget; each next one when the last's did again
    assert calls[0] - start == pytest.approx(live.first_cost / live.budget, abs=0.05)
    for i, at in enumerate(calls[1:], 1):
        assert 0.2 * (i + 1) <= live.budget * (at - start) + 0.01
    assert 0.2 * len(calls) <= live.budget * 300.0 and len(calls) >= 6
    assert live.verdict == verdict(run) and changes == [verdict(run)]
    live.finish(run)                # the run ended: once more, over all of its steps
    assert len(calls) == live.explanations
    # the next run starts without a verdict, and waits for its first until what the last
    # explanation cost fits its budget; a new strategy clears the last run's verdict
    calls.clear()
    second, start = Run(id=2, mode="step", strategy="mirrored", replicas=4), clock.now
    train(live, clock, second, 1.0)
    assert live.verdict is None
    train(live, clock, second, 49.0)
    assert calls[0] - start == pytest.approx(0.2 / live.budget, abs=0.05)
    live.verdict = verdict(run)
    live.clear()
    assert live.verdict is None


def test_a_run_it_cannot_explain_shows_no_verdict_and_fit_runs_are_skipped(explaining) -> None:
    live, clock, calls, setup, _ = explaining
    setup["result"] = lambda run: None          # explain's ConfigError: too few steps
    train(live, clock, Run(id=1, mode="step", strategy="mirrored", replicas=4), 60.0)
    assert calls and live.verdict is None
    calls.clear()
    train(live, clock, Run(id=2, mode="fit", strategy="mirrored", replicas=4), 60.0)
    assert calls == [] and live.verdict is None


def test_a_failing_explain_never_reaches_training_and_is_not_retried(explaining) -> None:
    live, clock, calls, setup, _ = explaining
    run = Run(id=1, mode="step", strategy="mirrored", replicas=4)
    train(live, clock, run, 30.0)
    assert live.verdict is not None

    def broken(run: Run):
        raise KeyError("step_ms")

    setup["result"] = broken
    train(live, clock, run, 120.0)              # raises nothing
    live.finish(run)
    assert live.verdict is None and len(calls) == 2


def test_the_real_verdict_of_a_run_too_short_is_none() -> None:
    run = Run(id=1, mode="step", strategy="mirrored", replicas=4)
    assert verdict_module.verdict_of(run) is None
    with pytest.raises(ConfigError):
        run.explain()


def test_the_state_carries_the_verdict_of_the_last_run_only() -> None:
    first, last = (Run(id=i, mode="step", strategy="mirrored", replicas=4) for i in (1, 2))
    assert LabState.of(None, [first, last], "0", verdict(last)).verdict == verdict(last)
    assert LabState.of(None, [first, last], "0", verdict(first)).verdict is None
    with pytest.raises(ValueError, match="verdict.bottleneck must be one of"):
        verdict(last, "slow")


