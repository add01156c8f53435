"""nbdist.lab.verdict in a real IPython shell: the state the status bar gets while
and after a run trains (tests/explain_cells.py's tiny MLP on 4 replicas)."""

from __future__ import annotations

from explain_cells import DATA, MLP_STEP, MODELS
from helpers import run_ok

import nbdist
from nbdist.lab.state import kernel_state


def test_the_state_names_the_bottleneck_while_and_after_a_run_trains(ip, monkeypatch) -> None:
    from nbdist.session import current_session

    session = current_session()
    live = session.verdict
    # a kernel with a frontend explains; a run this short needs a larger budget
    monkeypatch.setattr(live, "enabled", True)
    monkeypatch.setattr(live, "budget", 0.1)
    monkeypatch.setattr(live, "min_interval", 0.5)
    # the first explanation as soon as the run trains: on an idle machine its 150 steps take
    # less than the second the default first cost over this budget would wait
    monkeypatch.setattr(live, "first_cost", 0.001)
    monkeypatch.setattr(live, "_cost", None)
    states: list[dict] = []

    def record() -> None:
        states.append(kernel_state(session).to_json())

    monkeypatch.setattr(session, "listeners", [*session.listeners, record])
    run_ok(ip, DATA)
    run_ok(ip, MODELS)
    run_ok(ip, MLP_STEP.format(data="ex_fast", steps=600, flags="", model="ex_mlp"))
    final = kernel_state(session).to_json()
    assert final["verdict"] is not None, final
    assert final["verdict"]["run"] == final["run"]["id"] and final["run"]["status"] == "done"
    # the run's own explanation, whichever bottleneck the machine's load gives it (the tiny
    # MLP is dispatch-bound on an idle machine: benchmarks/explain.py --runs tests counts it)
    explained = nbdist.runs[-1].explain()
    assert final["verdict"]["bottleneck"] == explained.bottleneck, (final, explained.text)
    if explained.advice:
        assert final["verdict"]["advice"].startswith(explained.advice[0].text), final
    else:
        assert final["verdict"]["advice"] is None, final
    live_states = [s for s in states if s["run"] and s["run"]["status"] == "running"
                   and s["verdict"] is not None]
    assert live_states, ([s["verdict"] for s in states],
                         [s["run"] and s["run"]["status"] for s in states], live.explanations)
    assert live.explanations >= 2
