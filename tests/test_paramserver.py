"""`%distribute parameter_server`: real tf.distribute.Server processes, the kernel as coordinator.

Being a coordinator changes a process's TensorFlow context (device names, a gRPC server in
the kernel), so the cluster scenarios run in fresh interpreters (tests/ps_scenario.py), each
once per module; the tests below check what they observed. Bad inputs are checked in the
shared test shell: they must fail before any process starts.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from helpers import PROMPT_S

from nbdist.backends import kernelstate
from nbdist.cluster.paramserver import context as ps_context
from nbdist.cluster.paramserver.backend import live_ps_clusters
from nbdist.cluster.paramserver.steps import LOST_ROWS, TAKE_EVERY_ROWS, WINDOW_PER_WORKER
from nbdist.errors import ConfigError
from nbdist.install_tf_keras import INSTALL_HINT
from nbdist.session import current_session
from nbdist.spec import StrategySpec
from nbdist.strategies import build_strategy
from nbdist.words import count

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIO_TIMEOUT_S = 300
_results: dict[str, dict] = {}


def scenario(name: str) -> dict:
    """Run tests/ps_scenario.py NAME once; its observations as a dict."""
    if name not in _results:
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), TF_CPP_MIN_LOG_LEVEL="2")
        # -X faulthandler: a crash inside TensorFlow leaves its stack in stderr, not silence
        done = subprocess.run([sys.executable, "-X", "faulthandler",
                               os.path.join(HERE, "ps_scenario.py"), name],
                              capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S,
                              env=env, cwd=HERE)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT:")]
        assert lines, f"scenario {name} printed no result (exit code {done.returncode}):\n" \
                      f"{done.stdout[-3000:]}\n" \
                      f"{done.stderr[-3000:]}"
        result = json.loads(lines[-1][len("RESULT:"):])
        result["_stderr"] = done.stderr
        result["_stdout"] = "\n".join(ln for ln in done.stdout.splitlines()
                                      if not ln.startswith("RESULT:"))
        errors = {k: v for k, v in result.items() if k.endswith("error") and v}
        assert "crash" not in result, f"{result['crash']}\nerrors seen before it: {errors}"
        _results[name] = result
    return _results[name]


@pytest.fixture(scope="module")
def main():
    return scenario("main")


@pytest.fixture(scope="module")
def faults():
    return scenario("faults")


@pytest.fixture(scope="module")
def user_cluster():
    return scenario("profile")


# -- bad inputs: one clear paragraph, nothing started ----------------------------------------

@pytest.mark.parametrize("line, expected", [
    ("parameter_server --ps 0", "--ps 0 is not allowed"),
    ("parameter_server --workers 0", "--workers 0 is not allowed"),
    ("parameter_server --devices 2", "each worker trains on one device"),
    ("parameter_server --cluster myprofile", "there is no IPython profile 'myprofile'"),
    ("parameter_server --keras legacy", "applies to `multiworker` only"),
    ("mirrored --ps 1", "Use `multiworker` or `parameter_server`"),
    ("multiworker --ps 1", "--ps only applies to `parameter_server`"),
])
def test_bad_lines_fail_clearly_before_starting_anything(ip, line, expected):
    before = current_session().backend
    with pytest.raises(ConfigError, match=None) as info:
        ip.run_line_magic("distribute", line)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)
    assert live_ps_clusters() == [] and current_session().backend is before


def test_keras3_fit_without_tf_keras_installed_says_how_to_get_it(monkeypatch):
    from nbdist.cluster.failures import KerasUnsupported
    from nbdist.cluster.paramserver import fit as ps_fit

    monkeypatch.setattr(ps_fit, "_tf_keras", lambda: None)
    with pytest.raises(KerasUnsupported) as info:
        ps_fit._refuse(object())
    assert INSTALL_HINT in str(info.value)   # the extra's advice pulled the full tensorflow
    assert "step mode" in str(info.value) and "\n" not in str(info.value)


def test_building_it_like_a_local_strategy_points_to_the_magic():
    with pytest.raises(ConfigError, match="%distribute parameter_server --workers N --ps P"):
        build_strategy(StrategySpec("parameter_server", workers=2, ps=1))


def test_a_kernel_left_bound_to_a_cluster_says_restart_the_kernel(monkeypatch):
    monkeypatch.setattr(kernelstate, "_TAINTED", "a worker died")
    with pytest.raises(ConfigError, match=r"\(a worker died\).*Restart the kernel"):
        ps_context.check_kernel_usable()


# -- the cluster ------------------------------------------------------------------------------

def test_defaults_status_roles_and_health(main):
    assert (main["n"], main["n_ps"]) == (2, 1)              # --workers 2 --ps 1 by default
    status, spec = main["status"], main["cluster_spec"]
    assert "parameter_server (tf.distribute.ParameterServerStrategy), asynchronous" in status
    assert "coordinator: this kernel" in status and json.dumps(spec) in status
    for i in (0, 1):
        assert f"worker           {i}  alive, pid" in status and spec["worker"][i] in status
    assert "parameter server 0  alive" in status and spec["ps"][0] in status
    assert "ParameterServerStrategy(resolver)" in status
    assert f"coordinator: localhost:{main['kernel_tf_ports'][0]}" in status


def test_no_socket_we_open_is_open_to_other_hosts_but_the_named_servers(main):
    """A parameter-server cluster is isolated on request only (NBDIST_ISOLATION=1, as root:
    tests/test_isolation.py tries its ports from another host). By default nbdist's own
    sockets listen on loopback or Unix sockets; TensorFlow's servers (the tasks' and the
    coordinator's, on every interface) are the exception, and the start and status name them."""
    tf_ports = {int(a.rsplit(":", 1)[1]) for job in main["cluster_spec"].values() for a in job}
    tf_ports |= set(main["kernel_tf_ports"])        # the coordinator's own gRPC server
    ours = [(ip, port) for ip, port, _ in main["listening"] if port not in tf_ports]
    assert {ip for ip, _ in ours} <= {"127.0.0.1"}, main["listening"]
    assert tf_ports <= {port for _, port, _ in main["listening"]}
    assert "network    ports" in main["status"] and "NBDIST_ISOLATION=1" in main["status"]


def test_variables_live_on_the_parameter_server(main):
    assert main["setup_error"] is None
    assert main["variable_device"] == "/job:ps/replica:0/task:0/device:CPU:0"


def test_step_mode_trains_async_and_records_which_worker_ran_each_step(main):
    run = main["step_run"]
    assert main["step_error"] is None
    assert run["status"] == "done" and run["steps"] == run["rows"] == run["total"] == 120
    assert run["step_unique"] and run["replicas"] == [0]       # one row per step: async
    assert set(run["by_worker"]) == {"0", "1"} and min(run["by_worker"].values()) >= 20
    assert run["loss_last"] < 1e-2 * run["loss_first"]
    assert run["grad_norm_ok"] and run["step_ms_ok"]


def test_parameter_update_timing_replaces_allreduce(main):
    run = main["step_run"]
    assert run["allreduce_all_nan"]
    assert run["update_ms_count"] >= 15 and 0 < run["update_ms_median"] < 1000
    assert any("update_ms is the parameter update" in n for n in run["notes"])
    assert main["fast_run"]["update_ms_count"] == 0              # --timing-every 0


def test_rows_stream_into_the_run_while_it_runs(main):
    assert main["seen_running"], "the Run only received rows at the end"


def test_steps_flag(main):
    """(Start time and throughput against a hand-written job: benchmarks/paramserver.py.)"""
    run = main["fast_run"]
    assert main["fast_error"] is None and run["status"] == "done" and run["rows"] == 200


def test_an_unchanged_rerun_reuses_its_trace_a_rebuilt_model_retraces(main):
    assert main["cache_first"] == [0, 1] and main["cache_rerun"] == [1, 1]
    fast = main["fast_run"]   # the reused trace trains the same variables on
    assert fast["loss_last"] < 1e-2 * main["step_run"]["loss_first"]
    assert main["rebuilt_error"] is None and main["rebuilt_run_error"] is None
    assert main["rebuilt_cache"] == [0, 1]
    assert main["rebuilt_trained"] and main["old_untouched"]


def test_stop_request_ends_the_run_after_the_steps_in_flight(main):
    """The observer asks once it sees 30 rows; rows reach the kernel in reads of at most
    TAKE_EVERY_ROWS (rowbuffer), then the steps in flight finish."""
    run = main["stopped_run"]
    in_flight = WINDOW_PER_WORKER * 2   # 2 workers
    assert run["status"] == "stopped"
    assert 30 <= run["rows"] <= 30 + TAKE_EVERY_ROWS + in_flight + 1, run
    assert run["rows"] == run["steps"]


def test_kernel_interrupt_stops_scheduling_keeps_the_partial_run(main):
    assert main["interrupt_error"].startswith("RunInterrupted: Interrupted after step")
    # the run had 100000 steps to go: minutes if the interrupt were ignored
    assert main["interrupt_s"] < PROMPT_S, "the run went on after the interrupt"
    run = main["interrupted_run"]
    assert run["status"] == "interrupted" and run["rows"] == run["steps"] >= 20
    assert main["after_interrupt_error"] is None and main["after_interrupt_status"] == "done"


def test_keras3_fit_is_refused_with_the_ways_that_work(main):
    name, _, message = main["fit_error"].partition(": ")
    assert name == "KerasUnsupported" and "2.21" in message
    assert "step mode" in message and "import tf_keras as keras" in message


def test_tf_keras_fit_trains_on_the_workers_and_records_each_step(main):
    assert main["tf_keras_setup_error"] is None and main["tf_keras_fit_error"] is None
    run = main["tf_keras_fit_run"]
    assert run["status"] == "done" and run["rows"] == run["steps"] == 80 and run["step_unique"]
    assert set(run["by_worker"]) == {"0", "1"} and min(run["by_worker"].values()) >= 10
    assert run["loss_last"] < 0.1 * run["loss_first"] and run["step_ms_ok"]
    assert any("parameter_server fit (tf_keras)" in n for n in run["notes"])
    # nbdist's per-step extras (worker, timestamps) never reach Keras' own logs
    assert list(main["tf_keras_history"]) == ["loss"] and len(main["tf_keras_history"]["loss"]) == 2
    # a second fit reuses the instrumented train function and records again
    assert main["tf_keras_refit_error"] is None and main["tf_keras_refit_run"]["rows"] == 80


def test_kernel_interrupt_stops_a_tf_keras_fit_keeps_its_steps_and_the_cluster(main):
    assert main["fit_interrupt_error"].startswith("RunInterrupted: model.fit interrupted after")
    assert main["fit_interrupt_s"] < PROMPT_S, "the fit (100000 steps) went on after the interrupt"
    run = main["fit_interrupted_run"]
    assert run["status"] == "interrupted" and run["rows"] == run["steps"] >= 20
    assert main["fit_after_interrupt_error"] is None
    assert main["fit_after_interrupt_run"]["status"] == "done"
    assert main["fit_after_interrupt_run"]["rows"] == 10


def test_step_checkpoint_saves_each_epoch_and_a_rerun_resumes(main):
    assert main["ckpt_setup_error"] is None
    refused = main["ckpt_every_error"]
    assert refused.startswith("ConfigError") and main["ckpt_every_new_runs"] == 0, refused
    assert ("--checkpoint-every 4 saves inside an epoch and resumes there by skipping the "
            "batches already trained on, but under parameter_server each worker reads its own "
            "dataset") in refused
    assert main["ckpt_interrupt_error"].startswith("RunInterrupted")
    assert main["ckpt_saves_finished"] == 13       # the save under way when it came finished
    first = main["ckpt_first_run"]
    assert first["status"] == "interrupted" and first["rows"] >= 104
    saved = main["ckpt_saved"]
    assert "checkpoint" in saved and any(name.endswith(".index") for name in saved)
    assert main["ckpt_resume_error"] is None
    resumed, start = main["ckpt_resumed_run"], main["ckpt_resumed_first_step"]
    assert start % 8 == 0 and 8 <= start <= first["rows"]     # after the last whole epoch
    assert resumed["status"] == "done" and resumed["rows"] == 320 - start
    assert any("resumed" in n for n in resumed["notes"]), resumed["notes"]
    # the trained weights came back: the resumed run starts where the first one had got to
    assert resumed["loss_first"] < 0.2 * first["loss_first"]
    assert not main["ckpt_left"]                               # deleted once every epoch ran


def test_tf_keras_fit_checkpoint_backs_up_each_epoch_and_a_rerun_resumes(main):
    assert main["fit_ckpt_interrupt_error"].startswith("RunInterrupted")
    first = main["fit_ckpt_first_run"]
    assert first["status"] == "interrupted" and first["rows"] >= 100
    assert main["fit_ckpt_resume_error"] is None
    resumed, start = main["fit_ckpt_resumed_run"], main["fit_ckpt_resumed_first_step"]
    assert start % 8 == 0 and 8 <= start <= first["rows"]       # after the last whole epoch
    assert resumed["status"] == "done" and resumed["rows"] == 240 - start
    assert main["fit_ckpt_history_epochs"] == 30 - start // 8
    assert any("resumed" in n for n in resumed["notes"]), resumed["notes"]
    assert resumed["loss_first"] < 0.2 * first["loss_first"]    # the backup's weights
    assert main["fit_ckpt_left"] == []                           # Keras deletes it when done


def test_push_is_explained_and_step_errors_name_the_cell_line(main):
    assert main["push_error"].startswith("ConfigError: push/pull move values")
    assert main["graph_fn_error"].startswith("StepCodeError: cell line 3")


def test_a_nan_loss_ends_the_run_at_its_step_and_the_cluster_trains_on(main):
    # the loss turns NaN once the optimizer applied 5 updates; steps are numbered in the order
    # the workers' rows arrive (asynchronous), so the first NaN row is around the 5th
    said = re.match(r"NonFiniteLoss: the loss is nan at step (\d+) \(epoch 1\) on worker [01],",
                    main["nan_error"] or "")
    assert said and 2 <= int(said.group(1)) < 16, main["nan_error"]
    assert main["nan_run"]["status"] == "failed"
    assert main["nan_run"]["steps"] >= int(said.group(1)) + 1
    assert main["after_nan_error"] is None
    assert main["after_nan_run"] == {"status": "done", "steps": 4}


def test_stop_leaves_no_process_and_the_kernel_can_use_another_strategy(main):
    assert main["processes_before_stop"] >= 4          # controller + 3 engines (+ nannies)
    assert main["left_after_stop"] == [] and main["live_after_stop"] == 0
    assert main["mirrored_after_error"] is None and main["mirrored_cell_error"] is None
    assert main["mirrored_run"]["status"] == "done" and main["mirrored_run"]["replicas"] == [0, 1]


# -- faults -----------------------------------------------------------------------------------

def test_inject_refuses_what_a_coordinator_cannot_survive_and_status_shows_the_kill(faults):
    refused = faults["refused"]
    assert "inject stop 1" not in refused   # offered: the stopped worker is named
    assert "experimental_get_current_worker_index() == 1" in refused["inject slow 1"], refused
    assert "multiworker only" in refused["inject partition 1"], refused
    assert "`inject stop WORKER`" in refused["inject partition 1"], refused
    assert "only workers can be targeted" in refused["inject kill ps0"], refused
    assert "give the worker, 0..1" in refused["inject kill 2"], refused
    assert re.search(r"kill worker 1 after step 20, sent [\d:]+: applied after step 20",
                     faults["status_after_kill"]), faults["status_after_kill"]


def test_a_killed_worker_s_steps_are_retried_on_the_other(faults):
    assert faults["inject_kill_error"] is None, faults["inject_kill_error"]
    assert faults["worker_kill_error"] is None, faults["worker_kill_error"]
    assert faults["kill_applied_step"] == 20   # `inject kill 1 --at-step 20`
    # it died right after its 20th step (one step in flight until then, its row read at once)
    assert faults["killed_worker_rows"] == 20, faults["killed_worker_rows"]
    run = faults["worker_kill_run"]
    assert run["status"] == "done" and run["total"] == 400
    last = faults["last_row_after_kill_s"]   # only the survivor trains after the kill
    assert sorted(last) == ["0", "1"] and last["1"] < 0.5 and last["0"] > max(last["1"], 0), last
    # Steps are numbered as their rows arrive. Rows still in the killed worker's ring are lost:
    # at most those it finished since the kernel last read it (rowbuffer)
    assert run["rows"] == run["steps"] >= 400 - TAKE_EVERY_ROWS - WINDOW_PER_WORKER * 2
    lost = [n for n in run["notes"] if LOST_ROWS in n]
    assert lost == ([f"{count(400 - run['rows'], 'step')}{LOST_ROWS}"]
                    if run["rows"] < 400 else []), \
        run["notes"]
    died = [n for n in run["notes"] if "worker 1 (pid" in n and "re-ran" in n]
    # the numbers users can check: its own count (what --at-step counts) and its last row
    last_step = faults["killed_worker_last_step"]
    assert len(died) == 1 and (f"nbdist recorded 20 steps of it in this run, the last step "
                               f"{last_step} in Run.metrics") in died[0], run["notes"]
    assert "worker           1  DEAD" in faults["status_after_kill"]
    # the whole 400-step run (seconds): a run left waiting on the dead worker would not end
    assert faults["worker_kill_s"] < 4 * PROMPT_S, "the run did not finish on the survivor"


def test_a_killed_parameter_server_is_named(faults):
    name, _, message = faults["ps_kill_error"].partition(": ")
    assert name == "TaskDied" and message.startswith("parameter server 0 (pid")
    assert "%distribute restart" in message
    assert faults["ps_kill_s"] < PROMPT_S, "the run went on (100000 steps) after the kill"
    assert faults["ps_kill_run"]["status"] == "failed"
    assert faults["after_ps_kill_error"].startswith("ClusterError: The parameter-server "
                                                    "cluster is unusable")


def test_stop_after_faults_returns_leaves_nothing_and_says_restart_the_kernel(faults):
    assert faults["stop_s"] < PROMPT_S, "stop hung on the processes the faults left"
    assert faults["left_after_stop"] == []
    for key in ("mirrored_after_error", "ps_again_error"):
        assert faults[key].startswith("ConfigError:") and "Restart the kernel" in faults[key]


@pytest.fixture(scope="module")
def stall():
    return scenario("stall")


def _restarted_and_trained(out, key):
    """`%distribute restart` after the fault, then the setup cell and 20 steps train."""
    for part in ("restart", "rebuild", "retrain"):
        assert out[f"{key}_{part}_error"] is None, out[f"{key}_{part}_error"]
    assert out[f"{key}_retrain_run"]["status"] == "done"
    assert out[f"{key}_retrain_run"]["rows"] == 20
    print(f"\n{key}: restart {out[key + '_restart_s']:.1f} s, setup + 20 steps "
          f"{out[key + '_retrain_s']:.1f} s")


def test_a_stopped_worker_is_named_with_its_step_and_the_run_fails(stall):
    """SIGSTOP on worker 1 once the run has 20 rows: ClusterCoordinator would wait for the
    step it holds for ever; the cell ends within seconds naming it, and the run is failed."""
    assert stall["setup_error"] is None
    error, victim = stall["stop_error"], stall["victim"]
    steps = stall["stop_run"]["by_worker"]["1"]
    assert error.startswith(f"WorkerStuck: worker 1 (pid {victim}) is stopped (SIGSTOP / state "
                            f"T) after its step {steps} (the run's step "
                            f"{stall['stop_run']['steps']})"), error
    assert "The others ran on: worker 0 (" in error and "%distribute restart" in error, error
    print(f"\nSIGSTOP -> cell error {stall['stop_s']:.1f} s")
    assert stall["stop_s"] < 10, "the cell went on waiting for the stopped worker"
    assert stall["stop_run"]["status"] == "failed"   # never "done": a step never came back
    assert "BROKEN: worker 1 (pid" in stall["stop_status"]
    _restarted_and_trained(stall, "stop")
    assert stall["victim_left"] == []    # restart resumed it, then ended it


def test_inject_stop_at_a_step_is_named_like_a_real_sigstop(stall):
    assert stall["inject_stop_error"] is None, stall["inject_stop_error"]
    error = stall["injected_stop_error"]
    assert error.startswith(f"WorkerStuck: worker 1 (pid {stall['injected_victim']}) is "
                            "stopped (SIGSTOP / state T) after its step 10 "), error
    assert stall["injected_stop_run"]["status"] == "failed"
    assert stall["injected_stop_run"]["by_worker"]["1"] == 10
    assert stall["injected_stop_s"] < 10, stall["injected_stop_s"]


def test_an_error_in_a_workers_dataset_function_names_the_worker_step_and_line(stall):
    error = stall["input_error"]
    run = stall["input_run"]
    assert error.startswith("WorkerError: worker 1 (pid "), error
    assert (f"its input (--data bad_fn) failed after its step 40 (the run's step "
            f"{run['steps']}): InvalidArgumentError: StringToNumberOp could not correctly "
            "convert string: bad") in error, error
    assert "cell line 6 of the cell that defines bad_fn: x = tf.fill((4,), " \
           "tf.strings.to_number(text))" in error, error
    assert "GRPC" not in error and "Op:__inference" not in error, error   # no raw dump
    assert run["status"] == "failed" and run["by_worker"]["1"] == 40
    assert stall["input_s"] < 10, stall["input_s"]
    assert stall["after_input_error"] is None   # the cluster still trains
    _restarted_and_trained(stall, "input")


def test_the_coordinators_failure_logs_are_kept_out_of_the_cells(stall):
    """What TensorFlow's coordinator logs while it handles these failures (gRPC dumps of each
    cancelled step) is in the collapsed worker logs, not in the cells' output."""
    shown = stall["_stdout"]
    assert "ERROR:tensorflow" not in shown and "Graph execution error" not in shown, shown
    assert "Additional GRPC error" not in shown, shown
    assert "nbdist: worker logs: the cluster's failure (" in shown, shown


def test_a_killed_controller_is_named_with_what_is_lost(stall):
    error = stall["controller_error"]
    assert error.startswith(f"TaskDied: The ipyparallel controller (pid {stall['controller']}) "
                            "died during this cell, after step"), error
    assert "no worker failed" in error and "parameter servers" in error, error
    assert "%distribute restart" in error and "re-run the `%%distribute` cells" in error
    print(f"\ncontroller SIGKILL -> cell error {stall['controller_s']:.1f} s")
    assert stall["controller_s"] < 10, stall["controller_s"]
    assert stall["controller_run"]["status"] == "failed"
    _restarted_and_trained(stall, "controller")


# -- --cluster PROFILE: a user's ipyparallel cluster ---------------------------------------------

def test_too_few_engines_in_the_profile_is_a_clear_error(user_cluster):
    assert user_cluster["ipcluster_start"][0] == 0, user_cluster["ipcluster_start"]
    error = user_cluster["too_many_error"]
    assert error.startswith("ConfigError: --workers 2 --ps 1 (3 engines): the cluster of "
                            "profile"), error
    assert "has 2 engines" in error


def test_tasks_run_on_the_users_engines_and_train(user_cluster):
    assert user_cluster["start_error"] is None
    assert user_cluster["task_pids"] == user_cluster["user_pids"]     # worker 0, then ps 0
    assert user_cluster["started_by_nbdist"] == 0
    spec = user_cluster["cluster_spec"]
    assert len(spec["worker"]) == len(spec["ps"]) == 1
    assert all(a.startswith("127.0.0.1:") for job in spec.values() for a in job)  # all local
    assert "of ipyparallel profile" in user_cluster["status"]
    assert "not started by nbdist" in user_cluster["status"]
    run = user_cluster["step_run"]
    assert user_cluster["setup_error"] is None and user_cluster["step_error"] is None
    assert run["status"] == "done" and run["rows"] == 40 and run["by_worker"] == {"0": 40}
    assert run["loss_last"] < 0.1 * run["loss_first"]


def test_stop_restarts_the_users_engines_and_leaves_the_cluster_running(user_cluster):
    after = user_cluster["after_stop_pids"]
    assert len(after) == 2 and not set(after) & set(user_cluster["user_pids"])
    assert user_cluster["controller_alive_after_stop"]
    assert user_cluster["left_after_ipcluster_stop"] == []


def test_after_a_parameter_server_died_restart_rebuild_and_rerun_resumes():
    out = scenario("ps_restart")
    assert out["setup_error"] is None
    assert out["ps_kill_error"].startswith("TaskDied: parameter server 0"), out["ps_kill_error"]
    killed = out["killed_run"]
    assert killed["status"] == "failed" and killed["rows"] >= 120
    assert out["restart_error"] is None and out["rebuild_error"] is None
    assert out["resume_error"] is None, out["resume_error"]
    resumed, start = out["resumed_run"], out["resumed_first_step"]
    assert start % 8 == 0 and 8 <= start <= killed["rows"]
    assert resumed["status"] == "done" and resumed["rows"] == 480 - start
    assert any("resumed" in n for n in resumed["notes"])
    assert resumed["loss_first"] < 0.2 * killed["loss_first"]   # trained weights restored


def test_fifty_step_cells_leave_no_thread_or_file_behind():
    """A day of cells under parameter_server: the thread and file-descriptor counts of the
    kernel (the coordinator), the controller, the workers and the parameter server stay
    flat over 50 training cells."""
    got = scenario("soak")
    assert got["setup_error"] is None and got["errors"] == [], got
    assert got["statuses"] == ["done"]
    before, after = got["before"], got["after"]
    print("\n(threads, fds) per process before and after 50 cells:", before, after)
    assert set(after) == set(before)
    for pid, (threads, fds) in after.items():
        assert threads - before[pid][0] <= 5 and fds - before[pid][1] <= 5, \
            (pid, before[pid], (threads, fds))
