"""`%distribute multiworker --cluster PROFILE`: workers on a user's own ipyparallel cluster.

The module starts a real cluster the way a user would (`ipcluster start --daemonize` in a
temporary profile directory, engines on this machine), runs nbdist sessions on it, and stops
it with `ipcluster stop` at the end, checking that no process is left. Also here: tf_keras
`model.fit` on the workers records allreduce_ms (the optimizer hook, telemetry.fitreduce).
"""

import glob
import os
import re
import subprocess
import sys
import time

import ipyparallel as ipp
import psutil
import pytest
from helpers import PROMPT_S, ROOT, cluster_processes, ipcluster, living, run_ok, session_cluster

import nbdist
from nbdist.cluster.engines import hosts as engine_hosts
from nbdist.cluster.engines.local import ClusterStartError
from nbdist.cluster.inengine import identity
from nbdist.cluster.multiworker.backend import live_clusters
from nbdist.errors import ConfigError
from nbdist.session import current_session

SETUP = """%%distribute
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(nbdist_worker)
xs = rng.normal(size=(256, 4)).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((xs, xs.sum(axis=1, keepdims=True))).batch(
    32, drop_remainder=True)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
"""


def _profile_dir(path):
    profile_dir = str(path)
    with open(os.path.join(profile_dir, "ipcontroller_config.py"), "w") as f:
        # the hub admits engines at its heartbeat (3 s by default): quicker (re)starts
        f.write("c.HeartMonitor.period = 500\nc.HeartMonitor.max_heartmonitor_misses = 20\n")
    return profile_dir


def _wait_gone(procs, timeout=15):
    """Those of ``procs`` still running after ``timeout`` s (killed then)."""
    deadline = time.monotonic() + timeout
    while living(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = living(procs)
    for proc in left:
        proc.kill()
    return left


@pytest.fixture(scope="module")
def user_cluster(ip, tmp_path_factory):
    """A user's cluster: 2 engines started by ipcluster, not by nbdist."""
    profile_dir = _profile_dir(tmp_path_factory.mktemp("ipp-profile"))
    started = ipcluster("start", "--daemonize", "--n=2", f"--profile-dir={profile_dir}")
    assert started.returncode == 0, started.stderr[-2000:]
    procs = cluster_processes(profile_dir)
    try:
        client = ipp.Client(profile_dir=profile_dir)
        client.wait_for_engines(2, timeout=60)
        ip.run_line_magic("distribute", "stop")
        yield profile_dir, client
        ip.run_line_magic("distribute", "stop")
        assert live_clusters() == []
        procs = cluster_processes(profile_dir)     # engines restarted by nbdist included
        client.close()
        assert len(living(procs)) >= 3    # controller + 2 engines: nbdist left them running
    finally:   # whatever failed above, stop the cluster and leave no process behind
        stopped = ipcluster("stop", f"--profile-dir={profile_dir}")
        left = _wait_gone(procs)
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert not left, (stopped.stderr[-2000:], [p.cmdline() for p in left])


def _engine_pids(client, count=2, timeout=60, gone=()):
    """Engine id -> pid, once ``count`` engines (none of the ids ``gone``) are registered."""
    client.wait_for_engines(count, timeout=timeout)
    deadline = time.monotonic() + timeout
    while ((len(client.ids) != count or set(client.ids) & set(gone))
           and time.monotonic() < deadline):
        time.sleep(0.1)
    return dict(zip(client.ids, client[:].apply_sync(os.getpid), strict=True))


@pytest.fixture
def fresh(ip, user_cluster):
    """The user's cluster with no nbdist session and engines that served none, whatever the
    tests before left: a live session is stopped (nbdist restarts the engines it used), engines
    left spent by a kernel exit are restarted through ipyparallel, as a user would."""
    profile_dir, client = user_cluster
    ip.run_line_magic("distribute", "stop")
    ids = list(_engine_pids(client))
    if any(d["used"] for d in client[ids].apply_sync(identity.identify, "127.0.0.1")):
        ipp.Cluster.from_file(profile_dir=profile_dir).restart_engines_sync()
        _engine_pids(client, gone=ids)
    return user_cluster


def _a_session_then_a_kernel_exit(ip, profile_dir):
    """An nbdist session on the engines, then what atexit runs when its kernel ends (nbdist
    only lets go of the engines: no restart from a dying kernel). Their pids."""
    ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
    cluster = current_session().backend
    used = sorted(info["pid"] for info in cluster.info)
    cluster._stop_at_exit()                       # what atexit runs when the kernel ends
    ip.run_line_magic("distribute", "stop")
    return used


def test_workers_run_on_the_users_engines_and_fit_records_allreduce(ip, fresh, capsys):
    profile_dir, client = fresh
    users = _engine_pids(client)
    client[:].push({"users_value": 42}, block=True)
    ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
    cluster = current_session().backend
    assert cluster.n == 2 and cluster.engines.ids == sorted(users)
    assert sorted(info["pid"] for info in cluster.info) == sorted(users.values())
    assert cluster.processes() == []                   # nbdist started none of them
    workers = cluster.info[0]["tf_config"]["cluster"]["worker"]
    assert all(a.startswith("127.0.0.1:") for a in workers) and len(set(workers)) == 2
    assert cluster.channel.address[0] == "127.0.0.1"   # all engines local: loopback
    ip.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    assert f"2 engines {sorted(users)} of ipyparallel profile" in out   # [0, 1] when first
    assert "not started by nbdist" in out

    run_ok(ip, SETUP)
    run_ok(ip, "%%distribute\nhistory = model.fit(ds, epochs=2, verbose=0)")
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.mode == "fit" and run.status == "done"
    assert frame.groupby("worker").size().to_dict() == {0: 16, 1: 16}
    assert frame["allreduce_ms"].notna().all() and (frame["allreduce_ms"] > 0).all()
    assert (frame["allreduce_ms"] < frame["step_ms"]).mean() > 0.9
    assert any("gradient all-reduce inside the optimizer" in n for n in run.notes), run.notes


def test_a_kernel_exit_leaves_the_engines_and_too_many_workers_is_a_clear_error(ip, fresh):
    """At interpreter exit nbdist only lets go of the engines (no restart from a dying
    kernel); the next session restarts them (next test)."""
    profile_dir, client = fresh
    used = _a_session_then_a_kernel_exit(ip, profile_dir)
    assert sorted(_engine_pids(client).values()) == used   # not restarted, not killed
    with pytest.raises(ConfigError, match=r"--workers 3: the cluster of profile .* has 2 "
                                          r"engines\. Ask for at most 2"):
        ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir} --workers 3")
    assert session_cluster() is None and live_clusters() == []


def test_used_engines_are_restarted_and_stop_leaves_them_fresh_and_reusable(
        ip, fresh, capsys):
    """One MultiWorkerMirroredStrategy per process: nbdist restarts the cluster's engines
    (ipyparallel Cluster.restart_engines) when a session starts on engines a previous one
    used, and on stop; the controller and the engine count stay."""
    profile_dir, client = fresh
    _a_session_then_a_kernel_exit(ip, profile_dir)
    spent = _engine_pids(client)
    ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
    assert "already hosted nbdist's workers; restarting" in capsys.readouterr().err
    in_session = {info["pid"] for info in current_session().backend.info}
    assert in_session.isdisjoint(spent.values())
    client[:].push({"users_value": 42}, block=True)
    ip.run_line_magic("distribute", "stop")
    assert live_clusters() == []
    fresh = _engine_pids(client)
    assert set(fresh.values()).isdisjoint(in_session), (in_session, fresh)
    assert not [p for p in [*spent.values(), *in_session] if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    with pytest.raises(ipp.error.CompositeError, match="NameError"):
        client[:].pull("users_value", block=True)      # fresh namespaces

    ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir} --workers 1")
    assert current_session().backend.engines.ids == [min(fresh)]
    value = run_ok(ip, "%%distribute\nimport tensorflow as tf\n"
                       "(tf.distribute.get_strategy().num_replicas_in_sync, nbdist_workers)")
    assert repr(value) == "(1, 1)"


def test_worker_addresses_for_remote_engines():
    here = {"host": "a", "pid": 1, "ip": "127.0.0.1", "host_ip": "127.0.1.1"}
    remote = {"host": "b", "pid": 2, "ip": "10.0.0.7", "host_ip": "10.0.0.7"}
    assert engine_hosts.worker_hosts([here, here], [True, True]) == (["127.0.0.1"] * 2, "127.0.0.1")
    hosts, channel = engine_hosts.worker_hosts([here, remote], [True, False])
    mine = engine_hosts.route_ip("10.0.0.7")
    assert hosts == [mine, "10.0.0.7"] and channel == mine
    tunnelled = {**remote, "ip": "127.0.0.1", "host_ip": "127.0.0.1"}
    with pytest.raises(Exception, match="cannot tell at which address"):
        engine_hosts.worker_hosts([here, tunnelled], [True, False])


def test_name_at_id_picks_one_of_the_clusters_of_a_profile(ip, tmp_path):
    """Two clusters in one profile (`ipcluster start --cluster-id ID`): `--cluster DIR` asks
    which one, `--cluster DIR@ID` takes that one's engines."""
    profile_dir = _profile_dir(tmp_path)
    ids = ("a", "b")
    started = [ipcluster("start", "--daemonize", "--n=1", f"--profile-dir={profile_dir}",
                         f"--cluster-id={cid}") for cid in ids]
    procs = []
    try:
        assert [done.returncode for done in started] == [0, 0], started[-1].stderr[-2000:]
        procs = [p for cid in ids for p in cluster_processes(profile_dir, cid)]
        client = ipp.Client(profile_dir=profile_dir, cluster_id="b")
        b_pids = _engine_pids(client, count=1)
        client.close()
        ip.run_line_magic("distribute", "stop")
        with pytest.raises(ConfigError, match=re.escape(
                f"the profile has 2 running clusters ({profile_dir}@a, {profile_dir}@b); name "
                f"one, e.g. `--cluster {profile_dir}@a`")):
            ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
        ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}@b")
        assert [info["pid"] for info in current_session().backend.info] == list(b_pids.values())
        run_ok(ip, "%%distribute\nimport tensorflow as tf\n"
                   "assert tf.distribute.get_strategy().num_replicas_in_sync == 1")
        ip.run_line_magic("distribute", "stop")
        assert live_clusters() == []
        procs += [p for cid in ids for p in cluster_processes(profile_dir, cid)]  # restarted
    finally:
        for cid in ids:
            ipcluster("stop", f"--profile-dir={profile_dir}", f"--cluster-id={cid}")
        left = _wait_gone(procs)
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert procs and not left, [p.cmdline() for p in left]


def _tree(proc):
    """A Popen's process and its children (an engine's nanny), as psutil Processes."""
    try:
        root = psutil.Process(proc.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def test_a_hand_started_cluster_is_released_on_stop_and_refused_until_restarted(
        ip, tmp_path, capsys):
    """`ipcontroller` and `ipengine` started by hand: no cluster file, so nbdist cannot restart
    the engines. `stop` resets their namespaces and says they must be restarted; a session
    refuses them until they are; restarted by hand, they serve again."""
    profile_dir = _profile_dir(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    log = open(tmp_path / "processes.log", "w")  # noqa: SIM115 - closed below

    popens = []

    def start(module):
        popens.append(subprocess.Popen(
            [sys.executable, "-m", module, f"--profile-dir={profile_dir}"],
            env=env, stdout=log, stderr=subprocess.STDOUT))
        return popens[-1]

    controller = start("ipyparallel.controller")
    procs = []
    client = None
    try:
        client_file = os.path.join(profile_dir, "security", "ipcontroller-client.json")
        deadline = time.monotonic() + 60
        while not os.path.exists(client_file) and time.monotonic() < deadline:
            time.sleep(0.1)
        engines = [start("ipyparallel.engine") for _ in range(2)]
        client = ipp.Client(profile_dir=profile_dir)
        pids = _engine_pids(client)
        procs += [_tree(controller), *(_tree(e) for e in engines)]   # schedulers, nannies
        assert glob.glob(os.path.join(profile_dir, "security", "cluster-*.json")) == []

        ip.run_line_magic("distribute", "stop")
        ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
        assert sorted(i["pid"] for i in current_session().backend.info) == sorted(pids.values())
        run_ok(ip, "%%distribute\nkept = nbdist_worker + 1")
        capsys.readouterr()
        ip.run_line_magic("distribute", "stop")
        said = capsys.readouterr().err
        assert "nbdist cannot restart them (no cluster file)" in said, said
        assert "Restart them before nbdist uses this profile again" in said
        assert _engine_pids(client) == pids                    # the same processes, still up
        with pytest.raises(ipp.error.CompositeError, match="NameError"):
            client[:].pull("kept", block=True)                 # their namespaces were reset
        with pytest.raises(ClusterStartError, match=r"already hosted nbdist's workers.*no "
                           r"cluster file.*Restart those engines yourself"):
            ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
        assert session_cluster() is None and live_clusters() == []

        for proc in [p for e in engines for p in _tree(e)]:   # the user restarts them
            proc.kill()
        engines = [start("ipyparallel.engine") for _ in range(2)]
        fresh = _engine_pids(client, gone=list(pids))
        procs += [_tree(e) for e in engines]
        ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
        assert sorted(i["pid"] for i in current_session().backend.info) == sorted(fresh.values())
        # an engine that cannot answer (frozen here; blocked in a collective, or cut off):
        # stop names it and returns instead of waiting for it
        frozen = sorted(fresh)[1]
        psutil.Process(fresh[frozen]).suspend()
        capsys.readouterr()
        started = time.monotonic()
        ip.run_line_magic("distribute", "stop")
        took = time.monotonic() - started
        said = capsys.readouterr().err
        psutil.Process(fresh[frozen]).resume()
        assert took < PROMPT_S, f"stop waited {took:.0f} s for the frozen engine"
        assert f"engine {frozen} of profile" in said and "did not answer within 3 s" in said
    finally:
        if client is not None:
            client.close()
        for proc in living([p for tree in [*procs, *map(_tree, popens)] for p in tree]):
            proc.kill()        # engines that served keep TensorFlow threads: no clean exit
        for popen in popens:
            popen.wait(timeout=30)
        log.close()
        ip.run_line_magic("distribute", "mirrored --devices 4")
