"""The cluster's pure parts: TF_CONFIG, Keras choice, error picking, the stop protocol."""

import math
import socket
from math import nan

import numpy as np
import pytest
from helpers import skip_unless_all_required

from nbdist.cluster import failures, tfconfig
from nbdist.cluster.multiworker import backend as multiworker
from nbdist.cluster.multiworker.monitor import ClusterMonitor, StopCoordinator
from nbdist.errors import ConfigError, StepCodeError
from nbdist.spec import StrategySpec
from nbdist.telemetry.rows import pack
from nbdist.telemetry.run import Run, RunList, RunWriter


def test_tf_configs_use_distinct_free_loopback_ports():
    configs = tfconfig.local_tf_configs(3)
    workers = configs[0]["cluster"]["worker"]
    assert len(set(workers)) == 3 and all(a.startswith("127.0.0.1:") for a in workers)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": i} for i in range(3)]
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    with pytest.raises(ValueError):
        tfconfig.tf_config(workers, 3)


@pytest.mark.parametrize("choice, have, mode, words", [
    ("auto", True, "legacy", "keras-team/keras#20585"),
    ("auto", False, "keras3", "tf_keras is not installed"),
    ("legacy", True, "legacy", "asked with --keras legacy"),
    ("keras3", True, "keras3", "step mode"),
])
def test_which_keras_the_workers_run(monkeypatch, choice, have, mode, words):
    monkeypatch.setattr("importlib.util.find_spec",
                        lambda name: object() if have else None)
    got, why = multiworker.resolve_keras(choice)
    assert got == mode and words in why


def test_legacy_keras_without_tf_keras_or_a_bad_choice_fail_clearly(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ConfigError,
                       match=r"Run `python3 -m nbdist\.install_tf_keras` in a terminal"):
        multiworker.resolve_keras("legacy")
    with pytest.raises(ConfigError, match="choose one of auto, legacy, keras3"):
        multiworker.resolve_keras("keras2")


def test_parameter_server_is_not_an_in_kernel_strategy():
    from nbdist.strategies import build_strategy

    with pytest.raises(ConfigError, match="needs its worker and parameter-server processes"):
        build_strategy(StrategySpec("parameter_server", workers=2, ps=1))


def err(kind, message="m", nbdist=False, line=None):
    return {"type": kind, "message": message, "traceback": f"Traceback\n  cell line {line}\n",
            "cell_line": line, "nbdist": nbdist}


def test_one_error_for_identical_failures_on_every_worker():
    e = failures.build_error({0: err("ValueError", "boom", line=2),
                              1: err("ValueError", "boom", line=2)}, 2)
    assert isinstance(e, failures.WorkerError) and str(e) == "[all 2 workers] ValueError: boom"
    lines = e._render_traceback_()
    assert lines[0] == "[worker 0] Traceback" and lines[-1] == str(e) and e.cell_line == 2


def test_the_cause_wins_over_collateral_collective_errors():
    e = failures.build_error({0: err("UnavailableError", "peer gone"),
                              1: err("ZeroDivisionError", "division by zero")}, 3)
    text = str(e)
    assert text.startswith("[worker 1] ZeroDivisionError: division by zero")
    assert "worker 0 then failed with UnavailableError (a consequence" in text
    assert "1 other worker finished" in text


def test_nbdist_errors_keep_their_class():
    e = failures.build_error({0: err("StepCodeError", "cell line 3 `x`: bad", True, 3),
                              1: err("StepCodeError", "cell line 3 `x`: bad", True, 3)}, 2)
    assert isinstance(e, StepCodeError) and e.cell_line == 3
    assert str(e) == "[all 2 workers] cell line 3 `x`: bad"


def test_describe_exception_starts_at_the_cell_and_maps_its_lines():
    source = "# header\nx = 1\n\ndef f():\n    return 1 / 0\nf()\n"
    try:
        exec(compile(source, "<nbdist-cell-9>", "exec"), {})
    except ZeroDivisionError as caught:
        info = failures.describe_exception(caught, filename="<nbdist-cell-9>")
    assert info["type"] == "ZeroDivisionError" and info["cell_line"] == 5
    assert "cell line 6, in <module>" in info["traceback"]
    assert "cell line 5, in f" in info["traceback"]
    assert "test_cluster_unit" not in info["traceback"]


class Wire:
    def __init__(self):
        self.sent = []

    def __call__(self, worker, message):
        self.sent.append((worker, message["type"], message.get("step")))
        return True


def test_stop_protocol_halts_when_all_paused_at_the_same_step():
    wire = Wire()
    c = StopCoordinator(wire)
    c.request([0, 1])
    assert wire.sent == [(0, "stop", None), (1, "stop", None)]
    c.on_paused(0, 7)
    c.tick({0, 1})
    assert len(wire.sent) == 2          # waits for worker 1
    c.on_paused(1, 7)
    c.tick({0, 1})
    assert wire.sent[2:] == [(0, "halt", None), (1, "halt", None)] and c.halted_at == 7


def test_stop_protocol_brings_a_worker_behind_up_to_the_leader():
    wire = Wire()
    c = StopCoordinator(wire)
    c.request([0, 1])
    c.on_paused(0, 8)
    c.on_paused(1, 7)
    c.tick({0, 1})
    assert wire.sent[2:] == [(1, "resume_until", 8)]
    c.on_paused(1, 8)
    c.tick({0, 1})
    assert {m[1] for m in wire.sent[3:]} == {"halt"}


def test_stop_protocol_resumes_paused_workers_when_one_is_blocked_in_the_next_step(monkeypatch):
    from nbdist.cluster.multiworker import monitor

    monkeypatch.setattr(monitor, "PAUSE_GRACE_S", 0.0)
    wire = Wire()
    c = StopCoordinator(wire)
    c.request([0, 1])
    c.on_paused(0, 5)        # worker 1 is inside step 6's collective, waiting for worker 0
    c.tick({0, 1})
    assert wire.sent[2:] == [(0, "resume_until", 6)]


def test_monitor_routes_rows_health_and_run_end():
    runs = RunList()
    mon = ClusterMonitor(2, Wire(), lambda: runs.new(mode="fit", strategy="multiworker",
                                                      replicas=1, workers=2))
    step_run = runs.new(mode="step", strategy="multiworker", replicas=1, workers=2)
    mon.expect_run("step1", step_run)
    row = dict(step=3, epoch=0, replica=0, worker=0, loss=0.5, grad_norm=nan, allreduce_ms=1.0,
               wait_ms=0.0, compute_ms=2.0, other_collective_ms=0.0, step_ms=9.0, data_ms=1.0,
               wall_time=123.0)

    def rows(**columns):
        values = {**row, **columns}
        return {"type": "rows", "run": "step1", **pack(list(values), np.array([
            list(values.values())], dtype=float))}

    for w in (0, 1):
        mon.handle(w, {"type": "run_start", "run": "step1", "mode": "step", "total_steps": 10})
        mon.handle(w, rows())
    assert mon.running_workers() == {0, 1} and step_run.total_steps == 10
    frame = step_run.metrics
    assert list(frame["worker"]) == [0, 1] and math.isnan(frame["grad_norm"][0])
    assert mon.health[1].step == 4 and mon.runs_with_news() == [step_run]
    mon.handle(0, {**rows(), "run": "nope"})
    mon.handle(0, {**rows(), "n": 2})                            # bytes for one row
    mon.handle(0, {**rows(), "data": "not base64!"})
    mon.handle(0, {**rows(), "columns": list(row)[1:] + ["x"]})  # no step column
    mon.handle(0, rows(epoch=nan))
    mon.handle(0, {"type": "rows", "run": "step1", "rows": [row]})     # the old format
    assert mon.bad_rows == 6 and step_run.n_rows == 2     # all refused, nothing appended
    mon.handle(0, {"type": "run_end", "run": "step1", "status": "done"})
    assert step_run.status == "running"
    mon.handle(1, {"type": "run_end", "run": "step1", "status": "stopped"})
    assert step_run.status == "stopped" and mon.running_workers() == set()
    mon.handle(0, {"type": "run_start", "run": "cell2-fit1", "mode": "fit"})
    fit_row = dict(step=0, epoch=0, replica=-1, worker=0, loss=1.0, grad_norm=nan,
                   allreduce_ms=nan, wait_ms=nan, compute_ms=nan, other_collective_ms=nan,
                   step_ms=5.0, data_ms=nan, wall_time=1.0, accuracy=0.5)
    mon.handle(0, {"type": "rows", "run": "cell2-fit1", **pack(
        list(fit_row), np.array([list(fit_row.values())]))})
    fit = runs[-1]
    assert fit.mode == "fit" and fit.metrics["replica"].tolist() == [-1]
    assert fit.metrics["accuracy"].tolist() == [0.5]
    assert isinstance(step_run, Run)


def test_worker_rows_reach_the_kernel_run_by_column_name():
    """A worker Run's rows, forwarded over the signed channel encoding, land in the kernel's
    Run as that worker's rows with every column and extra where it belongs."""
    from nbdist.cluster.inengine.runs import Forwarder
    from nbdist.cluster.inengine.worker import WorkerState
    from nbdist.telemetry.channel import decode, encode, new_key, read_frame

    key, sent = new_key(), []

    class Channel:
        def send(self, message):
            a, b = socket.socketpair()
            with a, b:
                a.sendall(encode(key, message))
                sent.append(decode(key, read_frame(b)))

    st = WorkerState(index=1, workers=2, tf_config={}, keras="legacy", channel=Channel())
    local = Run(id=0, mode="step", strategy="multiworker", replicas=2, workers=2)
    forward = Forwarder(st, "cell3")
    RunWriter(local).record_step(7, 1, loss=[0.5, 0.7], step_ms=9.0, grad_norm=[1.0, 2.0],
                                 allreduce_ms=[3.0, 3.5], wait_ms=[0.0, 0.5], compute_ms=[4.0, 4.5],
                                 other_collective_ms=[1.0, 1.25], data_ms=0.25, wall_time=100.0)
    RunWriter(local).record_step(8, 1, loss=[0.4, float("nan")], step_ms=8.0, wall_time=101.0,
                                 extra={"update_ms": 1.5})
    forward.flush(local)
    runs = RunList()
    kernel = runs.new(mode="step", strategy="multiworker", replicas=2, workers=2)
    mon = ClusterMonitor(2, Wire(), lambda: None)
    mon.expect_run("cell3", kernel)
    for message in sent:
        mon.handle(1, message)
    assert mon.bad_rows == 0 and mon.health[1].step == 9
    assert kernel.n_rows == 0   # held until worker 0's rows of the same steps (arrivals)...
    mon.flush_rows()            # ...or the end of the call on the workers
    got = kernel.metrics.to_dict("records")
    want = local.metrics.assign(worker=1).to_dict("records")
    assert len(got) == 4 and got[0]["loss"] == 0.5 and got[1]["compute_ms"] == 4.5
    assert got[1]["other_collective_ms"] == 1.25
    assert got[3]["update_ms"] == 1.5 and math.isnan(got[0]["update_ms"])
    for mine, theirs in zip(got, want, strict=True):
        assert mine.keys() == theirs.keys()
        for name, value in mine.items():
            assert value == theirs[name] or (math.isnan(value) and math.isnan(theirs[name])), \
                name


def test_stacks_show_a_thread_blocked_in_cell_code_with_its_line():
    import linecache
    import threading

    from nbdist.cluster.inengine import stacks

    source = "def wait(event):\n    event.wait()\n"
    filename = "<nbdist-cell-99>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    event = threading.Event()
    thread = threading.Thread(target=namespace["wait"], args=(event,), name="blocked")
    thread.start()
    try:
        snap = stacks.snapshot(step=7)
    finally:
        event.set()
        thread.join()
    by_name = {t["name"]: t for t in snap["threads"]}
    assert snap["step"] == 7 and by_name["main"]["main"]
    assert by_name["blocked"]["blocked_in_cell"] and not by_name["main"]["blocked_in_cell"]
    files = [f["file"] for f in by_name["blocked"]["frames"]]
    assert filename in files and files[-1].endswith("threading.py")   # Event.wait inside
    from nbdist.cluster.multiworker.stall import cell_frame, diagnose

    assert cell_frame(snap) == f"cell line 2 (in wait, {filename}): event.wait()"
    waiting = {"step": 7, "phase": "step", "threads": [by_name["main"]]}
    assert diagnose({0: waiting, 1: snap, 2: None}) == ([1, 2], [0])


def test_the_stall_limit_follows_the_median_step_and_doubles_without_a_culprit():
    from nbdist.cluster.multiworker import stall

    watch = stall.StallWatch()
    assert watch.bound() == stall.FIRST_STEP_S                  # before any step but the first
    watch.progressed(0, 30.0)                                   # the first step (tracing)
    assert watch.bound() == stall.FIRST_STEP_S
    for step in range(1, 30):
        watch.progressed(step, 2.0)
    assert watch.bound() == 20.0 and watch.median() == 2.0      # 10 x the median
    for step in range(30, 60):
        watch.progressed(step, 0.01)
    assert watch.bound() == stall.STALL_FLOOR_S                 # the floor
    assert watch.stalled_for() is None
    watch.no_culprit()
    assert watch.bound() == 2 * stall.STALL_FLOOR_S
    watch.started()
    assert watch.bound() == stall.FIRST_STEP_S


def test_a_parameter_server_worker_stopped_or_silent_while_others_step_is_the_culprit():
    """PSStall: a stopped process is named once seen stopped for STOPPED_S; past the stall
    limit, the workers that recorded no step for that long while another did are named; with
    every live worker silent alike nobody is blamed and the limit doubles."""
    import time

    from nbdist.cluster.paramserver import stall
    from nbdist.cluster.progress import STALL_FLOOR_S

    states = {0: "sleeping", 1: "stopped"}
    watch = stall.PSStall(2, states.__getitem__)
    for step in range(30):
        watch.recorded(step % 2, step, 0.01)
    assert watch.culprits(set()) is None                        # seen stopped just now
    watch._stopped_since[1] -= stall.STOPPED_S + 0.1            # ... a while ago
    assert watch.culprits(set()) == ([1], "stopped")
    assert watch.culprits({1}) is None                          # dead: not stopped, not stuck
    text = watch.message([1], "stopped", lambda w: f"worker {w} (pid 4{w})", 30)
    assert text.startswith("worker 1 (pid 41) is stopped (SIGSTOP / state T) after its step 15 "
                           "(the run's step 30): a debugger holds it"), text
    assert "The others ran on: worker 0 (15 steps)." in text and "%distribute restart" in text

    states[1] = "sleeping"                                      # running again, but silent
    long_ago = time.monotonic() - 10 * stall.StallWatch().bound()
    watch.watch.last_progress = watch.last_row[1] = long_ago
    assert watch.culprits(set()) == ([1], "stuck")
    text = watch.message([1], "stuck", lambda w: f"worker {w}", 30)
    assert "worker 1 is stuck after its step 15" in text and "state sleeping" in text, text
    watch.last_row[0] = long_ago                                # every worker silent alike
    assert watch.culprits(set()) is None
    assert watch.watch.bound() == 2 * STALL_FLOOR_S             # the limit doubled


def test_inject_partition_refuses_engines_it_cannot_cut_off_one_by_one():
    import re
    import shutil

    from nbdist.cluster.engines.links import LinkControl
    from nbdist.cluster.inengine.identity import namespaces

    here = {"host": "hostA", "ip": "10.0.0.5", **namespaces()}
    if here["boot_id"] is None or shutil.which("ip") is None:
        skip_unless_all_required("needs Linux namespaces and the `ip` command")
    cases = [({**here, "boot_id": "another-machine"}, "runs on another machine"),
             (here, "shares this kernel's network stack"),
             ({**here, "netns": "net:[1]", "link": {"name": "eth0", "ifindex": 2,
                                                    "iflink": 10**9}},
              "eth0 at 10.0.0.5, which is not one end of a veth pair")]
    links = LinkControl([d for d, _ in cases])
    for worker, (_, expected) in enumerate(cases):
        with pytest.raises(ConfigError, match=re.escape(expected)):
            links.partition(worker)
    assert links.cut == {}
    with pytest.raises(ConfigError, match="nbdist did not cut worker 0's link"):
        links.heal(0)


def test_a_main_thread_waiting_for_its_next_batch_is_in_the_input_phase():
    """The phase comes from the step loop's own functions: a main thread blocked while
    ``timed_batches`` fetches a batch is "input" (a renamed loop once made it "cell")."""
    import traceback

    from nbdist.cluster.inengine import stacks
    from nbdist.data.iterate import timed_batches

    class Source:   # a dataset whose next batch looks at where the main thread is
        def __iter__(self):
            return self

        def __next__(self):
            return stacks._phase(traceback.extract_stack())

    phases = [batch for batch, _ in timed_batches(Source(), 2)]
    assert phases == ["input", "input"]
    assert stacks._phase(traceback.extract_stack()) == "cell"


def test_every_engine_set_offers_the_whole_protocol_before_it_starts(tmp_path):
    """The backends read every member of ``EngineSet`` without probing: both kinds of engine
    set have each one, with a value saying "none" where they do not offer it."""
    import shutil
    from typing import get_type_hints

    from nbdist.cluster.engines.base import EngineSet
    from nbdist.cluster.engines.local import LocalEngines
    from nbdist.cluster.engines.profile import ProfileEngines

    members = set(get_type_hints(EngineSet)) | {
        name for name, value in vars(EngineSet).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    assert {"pids", "links", "remote", "local", "describe"} <= members, members
    local = LocalEngines(2)
    try:
        profile = ProfileEngines(str(tmp_path), 2)
        for engines in (local, profile):
            missing = sorted(m for m in members if not hasattr(engines, m))
            assert not missing, (type(engines).__name__, missing)
        assert local.pids == {} and local.links is None and local.remote == []
        assert profile.pids == {} and profile.links.cut == {} and profile.remote == []
    finally:
        shutil.rmtree(local.profile_dir, ignore_errors=True)


def test_every_fault_kind_is_read_from_one_table(monkeypatch):
    """``protocol.FAULT_KINDS`` is the one list of ``%distribute inject`` faults: the kernel's
    checks, the worker's half, the magic's help and the parameter-server backend read it, so
    a new kind that is a signal is one entry there."""
    import os
    import signal

    from nbdist.cluster import injection, protocol
    from nbdist.cluster.inengine.faults import FaultPlan
    from nbdist.cluster.paramserver.faults import PSFaults
    from nbdist.magics import _help

    text = _help()
    for name, kind in protocol.FAULT_KINDS.items():
        assert name in text
        fault, worker, delay = injection.check(name, "1", 2, None, None)
        assert (fault, worker, delay) == (name, 1, kind.delay)
        if not kind.at_step:
            with pytest.raises(ConfigError, match="drop --at-step"):
                injection.check(name, "1", 2, 3, None)
        if kind.delay is None:
            with pytest.raises(ConfigError, match="per-step delay of `slow`"):
                injection.check(name, "1", 2, None, 1.0)
    with pytest.raises(ConfigError, match="not a fault(.|\n)*  partition  take the worker"):
        injection.check("explode", "1", 2, None, None)

    toy = protocol.FaultKind("term", "SIGTERM: asked to end", signal="SIGTERM")
    monkeypatch.setitem(protocol.FAULT_KINDS, "term", toy)
    assert injection.check("term", "0", 2, 5, None) == ("term", 0, None)
    sent, signalled = [], []
    monkeypatch.setattr(os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    plan = FaultPlan(sent.append, lambda: None)
    plan.on_control({"fault": "term", "at_step": 5}, steps_done=2)
    plan.on_step(4)
    assert signalled == [] and sent == []
    plan.on_step(5)
    assert signalled == [(os.getpid(), signal.SIGTERM)]
    assert sent == [{"type": protocol.INJECTED, "fault": "term", "step": 5}]
    plan.on_control({"fault": "heal"}, steps_done=0)   # the kernel's to apply: ignored here
    assert len(sent) == 1
    with pytest.raises(ConfigError, match="`%distribute inject term` is offered under "
                                          "multiworker only"):
        PSFaults(lambda sig, w: None, 2).inject("term", "1", None, None)


def test_ipyparallel_exit_logs_are_kept_off_stderr_and_shown_once_collapsed(
        monkeypatch, caplog):
    """ipyparallel logs an exited engine's last 100 lines as a warning ("Output for N:"):
    kept (``LOGS``) and shown once, folded, at the end of the cell, never as red stderr."""
    from nbdist.cluster.engines import enginelogs

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **_: shown.append(obj))
    monkeypatch.setattr(enginelogs._filter, "_show_after_cell", lambda: None)   # no shell
    with caplog.at_level("WARNING", logger="nbdist.cluster"):
        enginelogs.ENGINE_LOG.warning("Output for %s:\n%s", "1",
                                      "2026 [IPEngine.1] Handling apply_request: x\nbye")
        enginelogs.ENGINE_LOG.warning("engine set stopped 17: {'exit_code': -9}")
        enginelogs.ENGINE_LOG.warning("Controller could not start")
    assert [r.getMessage() for r in caplog.records] == ["Controller could not start"]
    assert enginelogs.LOGS[-1] == "engine set stopped 17: {'exit_code': -9}"
    enginelogs.show_pending()
    enginelogs.show_pending()
    [bundle] = shown
    assert bundle["text/plain"].startswith(
        "nbdist: worker logs: engine process 1 exited (4 lines from ipyparallel)")
    assert bundle["text/html"].startswith("<details class='nbdist-worker-logs'><summary>")
    assert "[IPEngine.1] Handling apply_request" in bundle["text/html"]
    enginelogs.keep("TensorFlow's ClusterCoordinator: Start cancelling closures due to error")
    enginelogs.show_pending()
    assert shown[-1]["text/plain"].startswith(
        "nbdist: worker logs: the cluster's failure (1 line from TensorFlow)"), shown[-1]


def test_a_parameter_server_step_traces_both_variants_in_its_first_two_steps():
    """Tracing waits for every task: the plain variant must not wait for the pacer (which
    times the first steps, until their rows are read), when a worker may be stopped."""
    from types import SimpleNamespace

    from nbdist.cluster.paramserver.steps import PSStepLoop
    from nbdist.step.pacing import TimingPacer

    loop = SimpleNamespace(_pacer=TimingPacer(None), _compiled={})
    chosen = []
    for step in range(40):   # no row read yet: the pacer alone would time all of them
        timed = PSStepLoop._variant(loop, step)
        chosen.append(timed)
        loop._compiled[timed] = object()
    assert chosen[:2] == [True, False] and all(chosen[2:]), chosen
    never_timed = SimpleNamespace(_pacer=TimingPacer(0), _compiled={})
    assert PSStepLoop._variant(never_timed, 0) is False   # --timing-every 0: one variant
    never_timed._compiled[False] = object()
    assert PSStepLoop._variant(never_timed, 1) is False


def test_an_input_error_of_several_steps_at_once_is_read_from_its_first_root_error():
    from nbdist.cluster.paramserver.inputerror import _cause

    one = ("Graph execution error:\n\nDetected at node StringToNumber\n"
           "StringToNumberOp could not correctly convert string: bad\n\t [[{{node X}}]]")
    several = ("2 root error(s) found.\n  (0) INVALID_ARGUMENT:  StringToNumberOp could not "
               "correctly convert string: bad\n\t [[{{node StringToNumber}}]]\n  (1) "
               "INVALID_ARGUMENT:  StringToNumberOp could not correctly convert string: bad\n"
               "0 successful operations.")
    said = "StringToNumberOp could not correctly convert string: bad"
    assert _cause(one) == said and _cause(several) == said
