"""A second view of the live dashboard, for a page that connected while the run goes on (a
reload, another tab): what the page gets when it asks, that the view follows the run and
stops it, and what replaces it when the run ends. Through a recording comm (no frontend)."""

from __future__ import annotations

import threading
from typing import Any

import dashboard_helpers
import numpy as np
from dashboard_helpers import STATIC, Recorder, feed, make_run

from nbdist.telemetry.run import RunWriter
from nbdist.widgets.dashboard import Dashboard

recorder, clock = dashboard_helpers.recorder, dashboard_helpers.clock     # fixtures

VIEW = "application/vnd.jupyter.widget-view+json"


def _opened(recorder: Recorder) -> dict[str, dict[str, Any]]:
    """The state each widget was created with, by model id."""
    return {cid: data["state"] for kind, cid, data, _ in recorder.messages
            if kind == "comm_open"}


def _custom(recorder: Recorder, comm_id: str) -> list[tuple[dict[str, Any], list[Any]]]:
    return [(d["content"], b) for kind, cid, d, b in recorder.messages
            if kind == "comm_msg" and cid == comm_id and d.get("method") == "custom"]


def _children(opened: dict[str, dict[str, Any]], model_id: str) -> list[str]:
    return [c.removeprefix("IPY_MODEL_") for c in opened[model_id].get("children", [])]


def test_a_page_that_asks_gets_a_view_that_follows_the_run_and_stops_it(
        recorder: Recorder, clock: dashboard_helpers.Clock) -> None:
    run = make_run(40, replicas=2, total=1000)
    dash = Dashboard(None, live=True, stop_mode="off")
    dash.on_step(run)
    replies: list[dict[str, Any]] = []
    # asked on the shell-channel thread while the cell runs; answered by the next redraw
    asker = threading.Thread(target=dash.request_view, args=("t1", replies.append))
    asker.start()
    asker.join()
    assert replies == []
    feed(run, 40, 41, every=10)
    dash.on_step(run)        # no time has passed: only a request makes this redraw happen
    [reply] = replies
    assert reply["type"] == "dashboard" and reply["token"] == "t1" and reply["run"] == 1
    assert reply["bundle"]["text/plain"].startswith("nbdist live dashboard of Run 1 ")
    box = reply["bundle"][VIEW]["model_id"]
    view = dash.views[1]
    assert view.extra_ids() == [box]

    # The new figure starts with every point drawn so far (the first got them in messages).
    opened = _opened(recorder)
    row, _notes, figure = _children(opened, box)
    header, _progress, button = _children(opened, row)
    loss = [t for t in opened[figure]["figure"]["data"] if t["name"] == "replica 0"][0]
    assert np.allclose(loss["y"], [1.0 / (s + 1) for s in range(41)])
    assert opened[button]["description"] == "Stop"
    assert "step 41/1000" in recorder.state(header)["value"]

    # Later steps reach both figures with the same messages; the header follows too.
    first = view.fig.model_id
    sent_before = len(_custom(recorder, figure))
    feed(run, 41, 60, every=10)
    clock.advance(5)
    dash.on_step(run)
    assert _custom(recorder, figure)[sent_before:] == _custom(recorder, first)[-1:]
    assert "step 60/1000" in recorder.state(header)["value"]

    # Stop in the new view stops the run.
    assert not dash.should_stop()
    view.extra[0].button.click()
    assert dash.should_stop()
    clock.advance(5)
    dash.on_step(run)
    assert recorder.state(button)["description"] == "Stopping…"

    # The run ends: the page gets the final figure and the summary, then the view closes.
    RunWriter(run).finish("stopped")
    dash.close()
    [final] = replies[1:]
    assert final["type"] == "final" and final["run"] == 1 and final["views"] == [box]
    assert STATIC in final["figure"] and "stopped" in final["summary"]["text/plain"]
    assert final["figure"] == recorder.replaced[-1]     # what the first page's view became
    closed = [cid for kind, cid, *_ in recorder.messages if kind == "comm_close"]
    assert box in closed and figure in closed
    assert view.extra == []


def test_a_request_before_anything_is_drawn_waits_and_one_after_the_run_gets_none(
        recorder: Recorder) -> None:
    run = make_run(0, replicas=2, total=100)
    dash = Dashboard(None, live=True, stop_mode="off")
    replies: list[dict[str, Any]] = []
    dash.request_view("early", replies.append)
    dash.on_step(run)                     # no step recorded: no widgets yet
    assert replies == []
    feed(run, 0, 5)
    dash.on_step(run)
    assert [r["token"] for r in replies] == ["early"] and replies[0]["run"] == 1
    dash.request_view("late", replies.append)     # arrives after the last step
    RunWriter(run).finish("done")
    dash.close()
    assert [(r["type"], r["run"]) for r in replies[1:]] == [("dashboard", None), ("final", 1)]
    assert replies[1]["token"] == "late"


def test_a_second_view_at_most_doubles_the_messages_of_a_redraw(
        recorder: Recorder, clock: dashboard_helpers.Clock) -> None:
    run = make_run(20, replicas=2, total=1000)
    dash = Dashboard(None, live=True, stop_mode="off")
    dash.on_step(run)

    def sent() -> int:
        return sum(1 for kind, *_ in recorder.messages if kind == "comm_msg")

    before = sent()
    feed(run, 20, 40)
    clock.advance(5)
    dash.on_step(run)
    alone = sent() - before
    dash.request_view("t", lambda _msg: None)
    feed(run, 40, 41)
    dash.on_step(run)
    before = sent()
    feed(run, 41, 61)
    clock.advance(5)
    dash.on_step(run)
    assert alone < sent() - before <= 2 * alone
    RunWriter(run).finish("done")
    dash.close()


def test_a_page_reloaded_again_and_again_keeps_at_most_a_few_views(recorder: Recorder) -> None:
    from nbdist.widgets.run_view import MAX_EXTRA_VIEWS

    run = make_run(10, replicas=2, total=100)
    dash = Dashboard(None, live=True, stop_mode="off")
    dash.on_step(run)
    replies: list[dict[str, Any]] = []
    for i in range(MAX_EXTRA_VIEWS + 1):
        dash.request_view(f"t{i}", replies.append)
        feed(run, 10 + i, 11 + i)
        dash.on_step(run)
    boxes = [r["bundle"][VIEW]["model_id"] for r in replies]
    view = dash.views[1]
    assert view.extra_ids() == boxes[1:] and len(view.fig._followers) == MAX_EXTRA_VIEWS
    closed = {cid for kind, cid, *_ in recorder.messages if kind == "comm_close"}
    assert boxes[0] in closed and not closed & set(boxes[1:])
    RunWriter(run).finish("done")
    dash.close()
