"""nbdist.lab.comm: the kernel end of the JupyterLab extension's "nbdist" comm."""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path
from typing import Any

import comm
import pytest
from comm.base_comm import BaseComm, CommManager

from nbdist.lab.comm import RUN_STATUSES, TARGET_NAME, LabChannel, LabState

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = json.loads((ROOT / "labextension" / "test" / "fixtures" / "states.json").read_text())

MIRRORED = {
    **LabState.empty("0.1.0").to_json(),
    "strategy": "mirrored",
    "magic_line": "%distribute mirrored --devices 2",
    "replicas": 2,
    "devices": ["CPU:0", "CPU:1"],
}


# -- LabState: the same fixtures as the TypeScript side --------------------------------------


@pytest.mark.parametrize("state", FIXTURES["valid"])
def test_the_shared_valid_states_serialize_back_to_themselves(state: dict[str, Any]) -> None:
    out = LabState.from_json(state).to_json()
    assert out == state and json.dumps(out) == json.dumps(state)   # the same keys, in order


@pytest.mark.parametrize("case", FIXTURES["invalid"], ids=[c["why"] for c in FIXTURES["invalid"]])
def test_the_shared_invalid_states_are_refused(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="nbdist state"):
        LabState.from_json(case["state"])


def test_run_statuses_bottlenecks_and_strategies_agree_with_the_frontend() -> None:
    from nbdist.spec import STRATEGY_NAMES
    from nbdist.telemetry.explain import BOTTLENECKS
    from nbdist.telemetry.run import STATUSES

    assert list(RUN_STATUSES) == list(STATUSES) == FIXTURES["run_statuses"]
    assert list(BOTTLENECKS) == FIXTURES["bottlenecks"]
    assert list(STRATEGY_NAMES) == FIXTURES["strategies"]


def _shape(value: Any) -> Any:
    """The keys and value types of a JSON value (lists: the shape of their items)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return sorted({json.dumps(_shape(v)) for v in value})
    return type(value).__name__


def test_the_state_of_a_training_kernel_has_the_fixtures_keys_and_types() -> None:
    from nbdist.backends.base import BackendStatus
    from nbdist.lab.state import Verdict
    from nbdist.spec import StrategySpec
    from nbdist.telemetry.run import Run, RunWriter

    spec = StrategySpec(name="mirrored", devices=2)
    status = BackendStatus(spec=spec, headline="mirrored", replicas=2,
                           devices=("/job:localhost/replica:0/task:0/device:CPU:0",
                                    "/job:localhost/replica:0/task:0/device:CPU:1"))
    run = Run(id=3, mode="step", strategy="mirrored", replicas=2, total_steps=100)
    for step in range(37):
        RunWriter(run).record_step(step, 0, loss=[1.0, 1.0], step_ms=10.0)
    verdict = Verdict(run=3, step=30, bottleneck="input", advice="Read ahead")
    built = LabState.of(status, [run], "0.1.0", verdict).to_json()
    assert _shape(built) == _shape(FIXTURES["valid"][1])
    assert LabState.of(None, [], "0.1.0").to_json() == FIXTURES["valid"][0]


def test_the_state_is_strict_about_keys_and_strategy_names() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\]"):
        LabState.from_json({**MIRRORED, "extra": 1})
    with pytest.raises(ValueError, match="strategy must be one of"):
        LabState.from_json({**MIRRORED, "strategy": "mirorred"})


def test_empty_state_is_valid_and_has_no_strategy() -> None:
    state = LabState.empty()
    assert state.strategy is None and state.run is None
    import nbdist

    assert state.version == nbdist.__version__


# -- LabChannel with a recording comm --------------------------------------------------------


class RecordingComm(BaseComm):
    """A comm that records what it publishes, as the frontend would receive it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.published: list[tuple[str, dict[str, Any] | None]] = []
        super().__init__(*args, **kwargs)

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        self.published.append((msg_type, copy.deepcopy(data)))

    def sent(self) -> list[dict[str, Any]]:
        return [data for kind, data in self.published if kind == "comm_msg"]

    def frontend_sends(self, data: dict[str, Any]) -> None:
        self.handle_msg({"content": {"comm_id": self.comm_id, "data": data}})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def manager(monkeypatch: pytest.MonkeyPatch) -> CommManager:
    """A fresh comm manager, and comm.create_comm handing out recording comms."""
    mgr = CommManager()
    created: list[RecordingComm] = []

    def create_comm(*args: Any, **kwargs: Any) -> RecordingComm:
        c = RecordingComm(*args, **kwargs)
        created.append(c)
        return c

    monkeypatch.setattr(comm, "get_comm_manager", lambda: mgr)
    monkeypatch.setattr(comm, "create_comm", create_comm)
    mgr.created = created  # type: ignore[attr-defined]
    return mgr


class Session:
    """What the lead's session would be: a mutable state and a status text."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = copy.deepcopy(MIRRORED)
        self.status = "Strategy: mirrored (2 replicas on CPU:0, CPU:1)"

    def channel(self, clock: Clock, **kwargs: Any) -> LabChannel:
        return LabChannel(
            lambda: LabState.from_json(self.state),
            lambda: self.status,
            clock=clock,
            auto_flush=kwargs.pop("auto_flush", False),
            **kwargs,
        )


def step(session: Session, n: int) -> None:
    session.state = {
        **session.state,
        "run": {"id": 1, "status": "running", "step": n, "epoch": 0, "total_steps": 100},
    }


def test_open_sends_the_state_in_the_comm_open(manager: CommManager) -> None:
    session = Session()
    channel = session.channel(Clock())
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    assert c.target_name == TARGET_NAME
    assert c.published == [("comm_open", {"type": "state", "state": MIRRORED})]
    assert channel.is_open
    assert TARGET_NAME in manager.targets


def test_identical_state_is_not_resent(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    for _ in range(3):
        clock.now += 1
        channel.publish()
        channel.flush()
    assert c.sent() == []
    session.state["replicas"] = 4  # the provider may mutate its dict in place
    clock.now += 1
    channel.publish()
    assert c.sent() == [{"type": "state", "state": {**MIRRORED, "replicas": 4}}]


def test_throttling_keeps_the_latest_state(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    clock.now += 1
    step(session, 1)
    channel.publish()  # >= 0.2 s since the open: sent at once
    for n in (2, 3, 4):
        clock.now += 0.05
        step(session, n)
        channel.publish()  # within 0.2 s: held back
    assert [m["state"]["run"]["step"] for m in c.sent()] == [1]
    clock.now += 0.2
    channel.publish()  # the next publish after the interval sends the latest
    assert [m["state"]["run"]["step"] for m in c.sent()] == [1, 4]
    step(session, 5)
    channel.publish()  # held back again ...
    channel.flush()  # ... and flush delivers it regardless of the interval
    assert [m["state"]["run"]["step"] for m in c.sent()] == [1, 4, 5]


def test_a_reverted_change_is_dropped_not_resent(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    step(session, 1)
    channel.publish()  # held back: 0 s since the open
    session.state = copy.deepcopy(MIRRORED)
    channel.publish()  # back to what the frontend has
    clock.now += 1
    channel.flush()
    assert c.sent() == []


def test_the_timer_delivers_a_held_back_state(manager: CommManager) -> None:
    session = Session()
    channel = LabChannel(lambda: LabState.from_json(session.state), lambda: session.status,
                          min_interval=0.05)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    step(session, 7)
    channel.publish()
    deadline = time.monotonic() + 5
    while not c.sent() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [m["state"]["run"]["step"] for m in c.sent()] == [7]
    channel.close()


def test_status_request_gets_the_status_text(manager: CommManager) -> None:
    session = Session()
    channel = session.channel(Clock())
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    c.frontend_sends({"type": "request", "what": "status"})
    assert c.sent() == [{"type": "status_text", "text": session.status}]
    c.frontend_sends({"type": "request", "what": "state"})
    assert c.sent()[-1] == {"type": "state", "state": MIRRORED}
    c.frontend_sends({"type": "request", "what": "coffee"})
    c.frontend_sends({"type": "something else"})
    assert len(c.sent()) == 2


def test_errors_in_the_providers_do_not_propagate(
    manager: CommManager, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_state() -> LabState:
        raise RuntimeError("session is half-built")

    def broken_status() -> str:
        raise KeyError("workers")

    channel = LabChannel(broken_state, broken_status, auto_flush=False)
    with caplog.at_level(logging.WARNING, logger="nbdist.lab.comm"):
        channel.open()  # opens with the empty state
        channel.publish()
        channel.flush()
    [c] = manager.created  # type: ignore[attr-defined]
    assert c.published == [("comm_open", {"type": "state", "state": LabState.empty().to_json()})]
    c.frontend_sends({"type": "request", "what": "status"})
    [reply] = c.sent()
    assert reply["type"] == "status_text" and "KeyError" in reply["text"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "session is half-built" in warnings[0].getMessage()


def test_an_invalid_state_is_not_sent(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    session.state = {**session.state, "replicas": "2"}
    clock.now += 1
    channel.publish()
    assert c.sent() == []


def test_comm_failures_do_not_propagate(manager: CommManager) -> None:
    def create_comm(**kwargs: Any) -> Any:
        raise OSError("iopub is gone")

    channel = LabChannel(lambda: LabState.from_json(MIRRORED), lambda: "", comm_factory=create_comm)
    channel.open()
    channel.publish()
    channel.flush()
    channel.close()
    assert not channel.is_open


def test_a_lost_connection_is_one_line_and_a_bug_its_traceback_once(
    manager: CommManager, caplog: pytest.LogCaptureFixture
) -> None:
    """iopub closed under the comm (zmq's error) is expected as a kernel shuts down; a
    TypeError is a bug in nbdist and must be seen with its traceback. Neither reaches the
    caller (the training loop's listener), and each is logged once, not on every publish."""
    import zmq

    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    failure: list[Exception] = [zmq.ZMQError(zmq.ENOTSOCK)]

    def send(data: Any, **kwargs: Any) -> None:
        raise failure[0]

    c.send = send
    with caplog.at_level(logging.WARNING, logger="nbdist.lab.comm"):
        for n, exc in enumerate([failure[0], failure[0], TypeError("bad"), TypeError("bad")]):
            failure[0] = exc
            step(session, n)
            clock.now += 1
            channel.publish()
    lost, bug = caplog.records
    assert "lost its connection" in lost.getMessage() and lost.exc_info is None
    assert "a bug in nbdist" in bug.getMessage() and bug.exc_info[0] is TypeError
    assert channel.is_open


def test_frontend_opened_comm_gets_the_state(manager: CommManager) -> None:
    """A reloaded page opens its own comm with a "state" request as the open data."""
    session = Session()
    channel = session.channel(Clock())
    channel.open()
    open_msg = {
        "content": {
            "comm_id": "frontend-1",
            "target_name": TARGET_NAME,
            "data": {"type": "request", "what": "state"},
        }
    }
    manager.comm_open(None, None, open_msg)
    kernel_comm, frontend_comm = manager.created  # type: ignore[attr-defined]
    assert frontend_comm.comm_id == "frontend-1"
    assert frontend_comm.sent() == [{"type": "state", "state": MIRRORED}]
    assert kernel_comm.sent() == []


class RoutedComm(RecordingComm):
    """A comm with ipykernel's routing method, which the kernel's shell-channel thread calls
    for every message to it as it arrives."""

    def _reply_subshell_for(self, data: Any, default: Any) -> Any:
        return default


def test_a_view_request_is_seen_as_it_arrives_and_answered_on_its_comm(
        manager: CommManager, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page loaded while a cell runs asks for the live dashboard: the request is handed to
    the dashboard serving views when it arrives (the kernel handles the message itself only
    once the cell ends, and then does not ask twice); without one the page hears "none"."""
    import threading

    monkeypatch.setattr(comm, "create_comm", lambda *a, **k: RoutedComm(*a, **k))
    channel = Session().channel(Clock())
    channel.open()
    [c] = channel._comms
    request = {"type": "request", "what": "dashboard", "token": "T1"}

    def arrives(data: dict[str, Any]) -> None:     # on the shell-channel thread
        t = threading.Thread(target=c._reply_subshell_for, args=(data, None))
        t.start()
        t.join()

    arrives(request)
    assert c.sent()[-1] == {"type": "dashboard", "token": "T1", "run": None}
    asked: list[tuple[str, Any]] = []
    channel.serve_views(lambda token, reply: asked.append((token, reply)))
    arrives({**request, "token": "T2"})
    arrives({"type": "request", "what": "status"})     # answered by the kernel when idle
    [(token, reply)] = asked
    assert token == "T2"
    reply({"type": "dashboard", "token": "T2", "run": 3})     # from the training loop's thread
    assert c.sent()[-1] == {"type": "dashboard", "token": "T2", "run": 3}
    c.frontend_sends({**request, "token": "T2"})         # the kernel handles it, idle at last
    assert len(asked) == 1
    channel.serve_views(None)
    channel.close()
    assert "_reply_subshell_for" not in vars(c)         # the hook is gone with the comm
    reply({"type": "final"})                              # a late reply goes nowhere
    assert c.sent()[-1]["type"] == "dashboard"


def test_a_comm_closed_by_the_frontend_is_reopened_a_few_times(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    created = manager.created  # type: ignore[attr-defined]
    for expected in (2, 3, 4, 4):
        created[-1].handle_close({"content": {"comm_id": created[-1].comm_id, "data": {}}})
        assert not channel.is_open
        clock.now += 60
        step(session, expected)
        channel.publish()
        assert len(created) == expected
    assert created[-1].published[0] == ("comm_open", {"type": "state", "state": session.state})


def test_close_closes_the_comm_and_stops_publishing(manager: CommManager) -> None:
    session, clock = Session(), Clock()
    channel = session.channel(clock)
    channel.open()
    [c] = manager.created  # type: ignore[attr-defined]
    channel.close()
    assert c.published[-1][0] == "comm_close"
    assert TARGET_NAME not in manager.targets
    step(session, 3)
    clock.now += 1
    channel.publish()
    assert len(manager.created) == 1 and c.sent() == []  # type: ignore[attr-defined]


def test_without_a_kernel_the_dummy_comm_makes_it_a_no_op(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Terminal IPython: the comm package hands out a comm that publishes nothing (its own
    DummyComm, or ipykernel's comm with no kernel running). The channel uses it as it would a
    frontend's, without a warning, and can be closed and opened again."""
    session = Session()
    manager = comm.get_comm_manager()
    others = set(manager.comms)   # the shared test shell's own channel, if it has one

    def ours() -> list[Any]:
        return [c for k, c in manager.comms.items()
                if c.target_name == TARGET_NAME and k not in others]

    assert ours() == []
    channel = LabChannel(lambda: LabState.from_json(session.state), lambda: session.status)
    with caplog.at_level(logging.DEBUG, logger="nbdist.lab.comm"):
        channel.open()
        [c] = ours()
        assert channel.is_open and TARGET_NAME in manager.targets
        sent: list[Any] = []
        monkeypatch.setattr(c, "send", lambda data, **kw: sent.append(copy.deepcopy(data)))
        step(session, 2)
        channel.publish()  # just after the open: held back (or sent by the timer) ...
        channel.flush()  # ... and sent by now, once
        assert [m["state"]["run"]["step"] for m in sent] == [2]
        channel.close()
        assert not channel.is_open and ours() == [] and TARGET_NAME not in manager.targets
        channel.open()  # usable again: a fresh comm with the current state
        [again] = ours()
        assert again is not c and channel.is_open
        channel.close()
    assert ours() == []
    assert caplog.records == []


# -- end to end through a real ipykernel -----------------------------------------------------


# -- the extension's hooks --------------------------------------------------------------------


