"""`%distribute multiworker --cluster PROFILE`: workers on a user's own ipyparallel cluster.

The module starts a real cluster the way a user would (`ipcluster start --daemonize` in a
temporary profile directory, engines on this machine), runs nbdist sessions on it, and stops
it with `ipcluster stop` at the end, checking that no process is left. Also here: tf_keras
`model.fit` on the workers records allreduce_ms (the optimizer hook, telemetry.fitreduce).
"""

import os
import time

import ipyparallel as ipp
import psutil
import pytest
from helpers import cluster_processes, ipcluster, living, run_ok, session_cluster

import nbdist
from nbdist.cluster.engines import hosts as engine_hosts
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


@pytest.fixture(scope="module")
def user_cluster(ip, tmp_path_factory):
    """A user's cluster: 2 engines started by ipcluster, not by nbdist."""
    profile_dir = str(tmp_path_factory.mktemp("ipp-profile"))
    with open(os.path.join(profile_dir, "ipcontroller_config.py"), "w") as f:
        # the hub admits engines at its heartbeat (3 s by default): quicker (re)starts
        f.write("c.HeartMonitor.period = 500\nc.HeartMonitor.max_heartmonitor_misses = 20\n")
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
        deadline = time.monotonic() + 15
        while living(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = living(procs)
        for proc in left:
            proc.kill()
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert not left, (stopped.stderr[-2000:], [p.cmdline() for p in left])


def _engine_pids(client, count=2, timeout=60):
    client.wait_for_engines(count, timeout=timeout)
    deadline = time.monotonic() + timeout
    while len(client.ids) != count and time.monotonic() < deadline:
        time.sleep(0.1)
    return dict(zip(client.ids, client[:].apply_sync(os.getpid), strict=True))


def test_workers_run_on_the_users_engines_and_fit_records_allreduce(ip, user_cluster, capsys):
    profile_dir, client = user_cluster
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
    assert "2 engines [0, 1] of ipyparallel profile" in out and "not started by nbdist" in out

    run_ok(ip, SETUP)
    run_ok(ip, "%%distribute\nhistory = model.fit(ds, epochs=2, verbose=0)")
    run = nbdist.runs[-1]
    frame = run.metrics
    assert run.mode == "fit" and run.status == "done"
    assert frame.groupby("worker").size().to_dict() == {0: 16, 1: 16}
    assert frame["allreduce_ms"].notna().all() and (frame["allreduce_ms"] > 0).all()
    assert (frame["allreduce_ms"] < frame["step_ms"]).mean() > 0.9
    assert any("gradient all-reduce inside the optimizer" in n for n in run.notes), run.notes


def test_a_kernel_exit_leaves_the_engines_and_too_many_workers_is_a_clear_error(
        ip, user_cluster):
    """At interpreter exit nbdist only lets go of the engines (no restart from a dying
    kernel); the next session restarts them (next test)."""
    profile_dir, client = user_cluster
    cluster = current_session().backend
    used = sorted(info["pid"] for info in cluster.info)
    cluster._stop_at_exit()                       # what atexit runs when the kernel ends
    ip.run_line_magic("distribute", "stop")
    assert sorted(_engine_pids(client).values()) == used   # not restarted, not killed
    with pytest.raises(ConfigError, match=r"--workers 3: the cluster of profile .* has 2 "
                                          r"engine\(s\)\. Ask for at most 2"):
        ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir} --workers 3")
    assert session_cluster() is None and live_clusters() == []


def test_used_engines_are_restarted_and_stop_leaves_them_fresh_and_reusable(
        ip, user_cluster, capsys):
    """One MultiWorkerMirroredStrategy per process: nbdist restarts the cluster's engines
    (ipyparallel Cluster.restart_engines) when a session starts on engines a previous one
    used, and on stop; the controller and the engine count stay."""
    profile_dir, client = user_cluster
    spent = _engine_pids(client)
    ip.run_line_magic("distribute", f"multiworker --cluster {profile_dir}")
    assert "already served an nbdist session; restarting" in capsys.readouterr().err
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
