"""A cluster of several hosts started by a real launcher: ipyparallel's SSH launcher
(``SSHEngineSetLauncher``) against an sshd on each simulated host (tests/hostbed.py,
tests/hostbed_ssh.py), the profile written as a user writes one for their machines.

`%distribute multiworker --cluster PROFILE --workers 2` trains over the hosts; `%distribute
restart` and `stop` restart the engines for real through ipcluster and ssh: the engine
processes die on their hosts and fresh ones start on the same hosts (checked from this
machine in each host's network and PID namespace, not by what the engines say), and
`ipcluster stop` afterwards leaves no engine on any host. The stop runs as in a Jupyter kernel
(inside its event loop), where the kernel's ``Cluster`` would go on watching the engines it
restarted and race the user's `ipcluster stop` for their log files. Skipped with the reason
where the bed cannot be made (not root, no iproute2) or sshd is missing; under
NBDIST_REQUIRE_ALL=1 (CI) each of those fails instead.
"""

import asyncio
import logging
import os
import threading
import time
from functools import partial

import hostbed_ssh
import psutil
import pytest
from helpers import host_bed, run_ok, skip_unless_all_required
from test_cluster import SETUP, STEP  # one model per worker's own data, 8 batches

import nbdist
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.session import current_session


@pytest.fixture(scope="module")
def bed(ip):
    reason = hostbed_ssh.skip_reason()
    if reason:
        skip_unless_all_required(reason)
    with host_bed(ip, 2, ssh=True) as the_bed:
        yield the_bed


def engines_on_hosts(bed) -> set[tuple[str, int]]:
    """Engine processes running on the bed's hosts, seen from this machine: (the host's name,
    found by the network namespace they run in; their pid on that host)."""
    found = set()
    for i in range(bed.n):
        for pid in bed.processes_on(i):
            try:
                process = psutil.Process(pid)
                if process.cmdline()[-2:] != ["-m", "ipyparallel.engine"] or \
                        process.status() == psutil.STATUS_ZOMBIE:
                    continue
                with open(f"/proc/{pid}/status") as f:
                    nspid = next(ln for ln in f if ln.startswith("NSpid:")).split()[-1]
            except (psutil.Error, OSError, StopIteration):
                continue
            found.add((bed.hostnames[i], int(nspid)))
    return found


def workers_where(bed) -> set[tuple[str, int]]:
    """The engines nbdist uses: (host, pid on that host), checking that each engine's
    network namespace is that host's own."""
    engines = current_session().backend.engines
    netns = {f"net:[{os.stat(f'/run/netns/{ns}').st_ino}]": host
             for ns, host in zip(bed.namespaces, bed.hostnames, strict=True)}
    where = {(d["host"], d["pid"]) for d in engines.idents}
    assert {d["netns"]: d["host"] for d in engines.idents}.items() <= netns.items(), \
        (engines.idents, netns)
    return where


def ssh_children() -> list[str]:
    return [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
            if p.name() == "ssh"]


def watchers() -> list[tuple[str, int]]:
    """The engines ipyparallel's launcher threads in this kernel watch over ssh for a live
    launcher: (host, pid). Two per engine meant two ``Cluster`` objects for one cluster file,
    both fetching and removing each engine's log file when it ended: the one that lost failed
    `%distribute stop` with ssh's exit status 1. The threads of a ``Cluster`` nbdist handed back
    run until their next poll, but their launchers are done (state "after") and do nothing."""
    found = []
    for thread in threading.enumerate():
        if thread.name.startswith("wait(host="):
            # the launcher's bound _wait, which ipyparallel wraps in a partial
            target = getattr(thread, "_target", None)
            parts = [target.func, *target.args] if isinstance(target, partial) else [target]
            found += [p.__self__ for p in parts if hasattr(getattr(p, "__self__", None),
                                                           "location")]
    return sorted((la.location, la.pid) for la in found if la.state == "running")


def wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    return condition()


def train(ip) -> None:
    run_ok(ip, SETUP)
    run_ok(ip, STEP.format(data="ds", flags="--epochs 1"))
    run = nbdist.runs[-1]
    assert run.status == "done", run.status
    assert run.metrics.groupby("worker").size().to_dict() == {0: 8, 1: 8}


def timed(ip, line: str) -> float:
    started = time.monotonic()
    ip.run_line_magic("distribute", line)
    return time.monotonic() - started


def as_in_jupyter(run):
    """Run ``run()`` inside a running event loop, as a Jupyter kernel runs its cells: then
    ipyparallel runs a ``Cluster``'s work on a loop in a thread of its own, which lives on and
    delivers its launchers' ends (in a terminal IPython, a loop made for each call and closed
    after it delivers nothing)."""
    async def inside():
        return run()
    return asyncio.run(inside())


def test_ssh_launched_engines_train_and_restart_on_their_hosts(ip, bed, capsys, caplog):
    seconds = {"start": timed(ip, f"multiworker --cluster {bed.profile_dir} --workers 2")}
    first = workers_where(bed)
    assert sorted(host for host, _ in first) == ["host1", "host2"]
    assert engines_on_hosts(bed) == first
    train(ip)

    seconds["restart"] = timed(ip, "restart")   # through ipcluster: ssh kills and starts
    second = workers_where(bed)
    assert sorted(host for host, _ in second) == ["host1", "host2"]
    assert engines_on_hosts(bed) == second       # the old engines are gone from the hosts
    assert first.isdisjoint(second)
    assert len(set(watchers())) == len(watchers()) == 2, watchers()   # each engine watched once
    train(ip)

    capsys.readouterr()
    seconds["stop"] = as_in_jupyter(lambda: timed(ip, "stop"))
    assert "restarted the engines of profile" in capsys.readouterr().out
    assert live_clusters() == [] and current_session().backend is None
    # the engines nbdist used are gone; the cluster's fresh ones are on the same hosts
    assert wait_for(lambda: sorted(h for h, _ in engines_on_hosts(bed)) == ["host1", "host2"])
    assert engines_on_hosts(bed).isdisjoint(second)

    caplog.set_level(logging.INFO, logger="nbdist.cluster")
    caplog.clear()
    started = time.monotonic()
    stopped = bed.ipcluster("stop")   # the user's `ipcluster stop`: over ssh too
    seconds["ipcluster stop"] = time.monotonic() - started
    assert stopped.returncode == 0, stopped.stderr[:3000] + "\n[...]\n" + stopped.stderr[-3000:]
    assert wait_for(lambda: not engines_on_hosts(bed), 30), engines_on_hosts(bed)
    # nor an ssh of ipyparallel's launchers in this kernel (each engine has one waiting on it)
    assert wait_for(lambda: not ssh_children(), 30), ssh_children()
    # the kernel handed the engines back: it neither fetched nor removed their log files
    assert not [r.getMessage()[:200] for r in caplog.records
                if any(w in r.getMessage().lower() for w in ("output", "fetching", "removing"))]
    print("seconds:", {k: round(v, 1) for k, v in seconds.items()})
