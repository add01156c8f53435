"""nbdist.lab.comm through a real Jupyter kernel: the frontend's messages reach the
comm, and loading the extension again opens one channel and hooks once."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from comm.base_comm import CommManager
from test_labcomm import manager  # noqa: F401  (the fixture: recording comms)

from nbdist.lab.comm import TARGET_NAME, LabState

ROOT = Path(__file__).resolve().parents[1]
KERNEL_CODE = textwrap.dedent(
    """
    from nbdist.lab.comm import LabChannel, LabState
    _state = {**LabState.empty("0.1.0").to_json(), "strategy": "mirrored",
              "magic_line": "%distribute mirrored --devices 2", "replicas": 2}
    _chan = LabChannel(lambda: LabState.from_json(_state), lambda: "STATUS TEXT",
                       min_interval=0.0)
    _chan.open()
    """
)


def _comm_msgs_until_idle(kc: Any, msg_id: str, timeout: float = 30) -> list[dict[str, Any]]:
    """The comm messages on iopub until the kernel is idle after the request ``msg_id``."""
    msgs = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["msg_type"].startswith("comm_"):
            msgs.append(msg)
        elif msg["msg_type"] == "error":
            raise AssertionError("\n".join(msg["content"]["traceback"]))
        elif (
            msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
            and msg["parent_header"].get("msg_id") == msg_id
        ):
            return msgs
    raise AssertionError(f"the kernel did not go idle after {msg_id}")


def _run(kc: Any, code: str) -> list[dict[str, Any]]:
    return _comm_msgs_until_idle(kc, kc.execute(code))


def _frontend_sends(kc: Any, msg_type: str, content: dict[str, Any]) -> list[dict[str, Any]]:
    msg = kc.session.msg(msg_type, content)
    kc.shell_channel.send(msg)
    return _comm_msgs_until_idle(kc, msg["header"]["msg_id"])


@pytest.mark.timeout(120)
def test_through_a_real_kernel() -> None:
    import jupyter_client

    km = jupyter_client.KernelManager(kernel_name="python3")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    km.start_kernel(env=env, cwd=str(ROOT))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        [opened] = _run(kc, KERNEL_CODE)
        assert opened["msg_type"] == "comm_open"
        assert opened["content"]["target_name"] == TARGET_NAME
        state = opened["content"]["data"]["state"]
        assert LabState.from_json(state).magic_line == "%distribute mirrored --devices 2"
        comm_id = opened["content"]["comm_id"]

        # The frontend asks for the status; the idle kernel answers on the same comm.
        replies = _frontend_sends(
            kc, "comm_msg", {"comm_id": comm_id, "data": {"type": "request", "what": "status"}}
        )
        assert [
            (m["msg_type"], m["content"]["comm_id"], m["content"]["data"]) for m in replies
        ] == [("comm_msg", comm_id, {"type": "status_text", "text": "STATUS TEXT"})]

        # A state change made by the kernel reaches the frontend; no change, no message.
        sent = _run(kc, "_state['replicas'] = 4; _chan.publish(); _chan.publish()")
        assert [m["content"]["data"]["state"]["replicas"] for m in sent] == [4]

        # A reloaded page opens its own comm and gets the state at once.
        sent = _frontend_sends(
            kc,
            "comm_open",
            {
                "comm_id": "page-2",
                "target_name": TARGET_NAME,
                "data": {"type": "request", "what": "state"},
            },
        )
        assert [
            (m["content"]["comm_id"], m["content"]["data"]["state"]["replicas"]) for m in sent
        ] == [("page-2", 4)]

        # Later changes go to both comms.
        sent = _run(kc, "_state['replicas'] = 8; _chan.publish()")
        assert sorted(m["content"]["comm_id"] for m in sent) == sorted([comm_id, "page-2"])

        # A page loaded while a cell runs asks for the dashboard on the kernel's comm: the
        # request is seen while the cell runs (here the cell answers it, as the dashboard does
        # at its next redraw), and not again when the kernel gets to the message.
        _run(kc, "_asked = []; _chan.serve_views(lambda t, reply: _asked.append((t, reply)))")
        busy = kc.execute(textwrap.dedent("""
            import time
            _t0 = time.monotonic()
            while not _asked and time.monotonic() - _t0 < 60:
                time.sleep(0.02)
            for _token, _reply in _asked:
                _reply({"type": "dashboard", "token": _token, "run": 7})
            """))
        time.sleep(1.0)
        start = time.monotonic()
        request = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
            "type": "request", "what": "dashboard", "token": "T"}})
        kc.shell_channel.send(request)
        sent = _comm_msgs_until_idle(kc, busy)
        assert time.monotonic() - start < 30, "the request waited for the cell to end"
        assert [(m["content"]["comm_id"], m["content"]["data"]) for m in sent] == [
            (comm_id, {"type": "dashboard", "token": "T", "run": 7})]
        assert _comm_msgs_until_idle(kc, request["header"]["msg_id"]) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_loading_the_extension_again_opens_the_channel_and_hooks_once(
        ip: Any, manager: CommManager,  # noqa: F811 (the fixture imported above)
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`%load_ext`, `%unload_ext`, `%load_ext`, `%reload_ext` in one shell, and a load that
    finds the channel still there but the cell hooks gone: each time the lab channel is open
    and every hook is registered once."""
    import nbdist
    from nbdist.session import current_session

    session = current_session(ip)
    callbacks = ip.events.callbacks
    shared = session.backend.spec if session.backend is not None else None
    # unloading stops the session: the shared shell gets its strategy back at the end
    restore = lambda: shared and ip.run_line_magic(  # noqa: E731
        "distribute", shared.magic_line().removeprefix("%distribute "))

    def check() -> None:
        channel = session.lab_channel
        assert channel is not None and channel.is_open
        assert callbacks["pre_run_cell"].count(session.pre_run_cell) == 1
        assert callbacks["post_run_cell"].count(session.post_run_cell) == 1
        assert callbacks["post_run_cell"].count(session.flush_listeners) == 1
        assert session.listeners.count(channel.publish) == 1
        assert ip.input_transformers_post.count(session.pasted_in_plain_cell) == 1

    ip.run_line_magic("unload_ext", "nbdist")
    assert session.lab_channel is None
    assert session.pre_run_cell not in callbacks["pre_run_cell"]
    assert session.pasted_in_plain_cell not in ip.input_transformers_post
    assert session.flush_listeners not in callbacks["post_run_cell"]
    ip.run_line_magic("load_ext", "nbdist")
    check()
    ip.run_line_magic("load_ext", "nbdist")   # already loaded: IPython does not load it again
    check()
    ip.run_line_magic("reload_ext", "nbdist")
    check()
    nbdist.load_ipython_extension(ip)          # a second call of the hook itself
    check()
    ip.events.unregister("pre_run_cell", session.pre_run_cell)
    ip.events.unregister("post_run_cell", session.post_run_cell)
    session.lab_channel.close()
    nbdist.load_ipython_extension(ip)          # the channel is kept and opened again
    check()
    assert len(manager.created) == 3, manager.created  # type: ignore[attr-defined]
    monkeypatch.undo()                         # leave the shell with a channel of its own
    ip.run_line_magic("reload_ext", "nbdist")
    check()
    restore()
    assert session.backend is not None and session.backend.spec == shared
