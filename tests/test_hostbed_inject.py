"""`%distribute inject partition|heal` on simulated hosts (tests/hostbed.py): nbdist takes a
host's link down itself, at once or when the worker reaches a step, and brings it back up.

A bed of its own (2 hosts): the first use of its ipcluster, so this test does not depend on
the bed's engines coming back after a restart. Skipped with the reason where network
namespaces cannot be made (not root, no iproute2); under NBDIST_REQUIRE_ALL=1 they fail.
"""

import contextlib
import os
import re
import subprocess
import sys
import time

import hostbed
import ipyparallel as ipp
import psutil
import pytest
from cluster_cells import stuck_input
from helpers import PROMPT_S, run_err, run_ok, skip_unless_all_required
from test_cluster import SETUP, STEP  # one model per worker's own data, 8 batches

from nbdist.cluster.failures import WorkerStuck, WorkerUnreachable
from nbdist.errors import ConfigError
from nbdist.session import current_session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def link_state(name):
    return re.search(r"state (\w+)", subprocess.run(
        ["ip", "link", "show", "dev", name], capture_output=True, text=True).stdout).group(1)


def test_inject_partition_at_once_heal_at_a_step_status_and_stop_heals(ip, capsys):
    reason = hostbed.skip_reason()
    if reason:
        skip_unless_all_required(reason)
    ip.run_line_magic("distribute", "stop")
    with hostbed.HostBed(2) as bed:
        bed.start_cluster()
        try:
            ip.run_line_magic("distribute", f"multiworker --cluster {bed.profile_dir}")
            run_ok(ip, SETUP)
            cluster = current_session().backend
            victim = [info["host"] for info in cluster.info].index("host2")
            link = bed.links[1]   # this machine's end of host2's veth pair

            ip.run_line_magic("distribute", f"inject partition {victim}")
            assert link_state(link) == "DOWN"
            ip.run_line_magic("distribute", f"inject heal {victim}")
            assert link_state(link) == "UP"
            with pytest.raises(ConfigError, match="did not cut worker"):
                ip.run_line_magic("distribute", f"inject heal {victim}")

            ip.run_line_magic("distribute", f"inject partition {victim} --at-step 30")
            assert link_state(link) == "UP"   # not yet: when the worker gets there
            err = run_err(ip, STEP.format(data="long_ds", flags="--steps 100000"))
            ended = time.monotonic()
            entry = cluster.monitor.injections[-1]
            with capsys.disabled():
                print(f"\npartition -> error {ended - entry['cut_at']:.1f} s: {err}")
            assert isinstance(err, WorkerUnreachable), repr(err)
            assert f"worker {victim} on host2 ({bed.ips[1]}) is unreachable" in str(err), err
            seen = int(re.search(r"last step seen: (\d+)", str(err)).group(1))
            assert 29 <= seen < 40, err   # step 29 is its 30th: cut when it said so
            assert ended - entry["cut_at"] < PROMPT_S, "the cell went on waiting for host2"
            assert link_state(link) == "DOWN"
            capsys.readouterr()
            ip.run_line_magic("distribute", "status")
            out = capsys.readouterr().out
            assert re.search(rf"partition worker {victim} at once, sent [\d:]+: applied", out), out
            assert re.search(rf"heal worker {victim} at once, sent [\d:]+: applied", out), out
            assert re.search(rf"partition worker {victim} after step 30, sent [\d:]+: applied "
                             "after step 30", out), out
            capsys.readouterr()
            started = time.monotonic()
            ip.run_line_magic("distribute", "stop")
            stop_s = time.monotonic() - started
            said = "".join(capsys.readouterr())
            # a stop this soon after `ipcluster start` waits out its early-shutdown window
            # (earlystop), and says so: not time spent on the partitioned host
            window = re.search(r"waiting (\d+) s before restarting the engines", said)
            waited = float(window.group(1)) if window else 0.0
            with capsys.disabled():
                print(f"stop after the partition: {stop_s:.1f} s ({waited:g} s of it waiting "
                      "for ipcluster's early-shutdown window)")
            assert link_state(link) == "UP"   # stop brings back what nbdist cut
            assert stop_s - waited < PROMPT_S, f"stop hung on the partitioned host: {said}"
        finally:
            ip.run_line_magic("distribute", "stop")
            bed.heal(1)
            ip.run_line_magic("distribute", "mirrored --devices 4")


def test_hand_started_engines_stop_promptly_after_a_partition_and_after_a_stall(ip, capsys):
    """`ipcontroller` and `ipengine` started by hand on two simulated hosts (no cluster file:
    nbdist cannot restart them). A partition, then a worker stuck in its input: each ends
    the cell, and `%distribute stop` returns rather than waiting on them, naming the engines it
    left (the test prints how long each stop took)."""
    reason = hostbed.skip_reason()
    if reason:
        skip_unless_all_required(reason)
    ip.run_line_magic("distribute", "stop")
    with hostbed.HostBed(2) as bed:
        profile = os.path.join(bed.workdir, "profile")
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
        log = open(os.path.join(bed.workdir, "processes.log"), "ab")  # noqa: SIM115
        popens = [subprocess.Popen(
            [sys.executable, "-m", "ipyparallel.controller", f"--profile-dir={profile}",
             f"--ip={bed.bridge_ip}"], env=env, stdout=log, stderr=subprocess.STDOUT)]
        try:
            client_file = os.path.join(profile, "security", "ipcontroller-engine.json")
            deadline = time.monotonic() + 60
            while not os.path.exists(client_file) and time.monotonic() < deadline:
                time.sleep(0.1)
            client = ipp.Client(profile_dir=profile)

            def start_engines():
                engines = [subprocess.Popen(bed.on_host(host, [
                    sys.executable, "-m", "ipyparallel.engine", f"--profile-dir={profile}"]),
                    env=env, stdout=log, stderr=subprocess.STDOUT) for host in range(2)]
                popens.extend(engines)
                deadline = time.monotonic() + 120
                while len(client.ids) < 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                return engines

            engines = start_engines()
            ip.run_line_magic("distribute", f"multiworker --cluster {profile}")
            run_ok(ip, SETUP)
            victim = [info["host"] for info in current_session().backend.info].index("host2")
            ip.run_line_magic("distribute", f"inject partition {victim} --at-step 30")
            err = run_err(ip, STEP.format(data="long_ds", flags="--steps 100000"))
            assert isinstance(err, WorkerUnreachable), repr(err)
            assert _timed_stop(ip, capsys, "partition") < PROMPT_S, "stop hung on the cut host"
            bed.heal(1)

            for engine in engines:   # spent: the user restarts them by hand
                engine.kill()
                engine.wait(timeout=30)
            deadline = time.monotonic() + 60
            while client.ids and time.monotonic() < deadline:   # the hub drops them
                time.sleep(0.2)
            start_engines()
            ip.run_line_magic("distribute", f"multiworker --cluster {profile}")
            run_ok(ip, SETUP)
            ip.push({"STALL_FILE": os.path.join(bed.workdir, "stalled")})
            ip.run_line_magic("distribute", "push STALL_FILE")
            run_ok(ip, "%%distribute\n" + stuck_input("GLOBAL_BATCH * 30"))
            err = run_err(ip, STEP.format(data="stuck_ds", flags="--steps 100000"))
            assert isinstance(err, WorkerStuck), repr(err)
            assert _timed_stop(ip, capsys, "stall") < PROMPT_S, "stop hung on the stuck worker"
        finally:
            ip.run_line_magic("distribute", "stop")
            procs = []   # the controller's schedulers are its children: kill the whole trees
            for popen in popens:
                try:
                    root = psutil.Process(popen.pid)
                    procs += [root, *root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    pass
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            for popen in popens:
                popen.wait(timeout=30)
            _, left = psutil.wait_procs(procs, timeout=30)
            log.close()
            assert not left, f"processes left behind: {[p.pid for p in left]}"
            ip.run_line_magic("distribute", "mirrored --devices 4")


def _timed_stop(ip, capsys, after):
    capsys.readouterr()
    started = time.monotonic()
    ip.run_line_magic("distribute", "stop")
    took = time.monotonic() - started
    said = "".join(capsys.readouterr())
    with capsys.disabled():
        print(f"\nhand-started engines: stop after the {after} {took:.1f} s: {said[-300:]}")
    return took
