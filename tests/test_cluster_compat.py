"""Workers that cannot work: a TF_CONFIG port already taken, TensorFlow that fails to import,
a different TensorFlow version. Each is one clear error naming the worker and the fix; the
kernel stays usable and no process is left behind."""

import json
import os
import socket
import sys

import psutil
import pytest
from helpers import run_ok, run_python, session_cluster

from nbdist.cluster import compat, tfconfig
from nbdist.cluster.engines import local as engines
from nbdist.cluster.engines.base import ClusterStartError
from nbdist.cluster.multiworker.backend import live_clusters


def test_the_kernel_reads_its_tensorflow_version_without_importing_it():
    result = run_python("""
        import json, sys
        from nbdist.cluster import compat
        print(json.dumps([compat.kernel_versions()["tf"], "tensorflow" in sys.modules]))
    """)
    assert result.returncode == 0, result.stderr
    (name, version), imported = json.loads(result.stdout.strip().splitlines()[-1])
    import tensorflow as tf

    assert version == tf.__version__ and name.replace("_", "-").startswith("tensorflow")
    assert imported is False


WHO = {0: "0 (engine 4, pid 11 on a)", 1: "1 (engine 5, pid 12 on b)"}
KERNEL = {"tf": ("tensorflow-cpu", "2.21.0"), "nbdist": "0.1.0"}
GOOD = {"tf": ("tensorflow-cpu", "2.21.0"), "nbdist": "0.1.0", "python": "/usr/bin/python3",
        "tf_initialized": False, "tf_origin": "/site/tensorflow/__init__.py"}


@pytest.mark.parametrize("change, words", [
    ({"import_error": "ImportError: boom"}, ["worker 1 (engine 5, pid 12 on b) cannot import "
                                             "TensorFlow (ImportError: boom", "PYTHONPATH"]),
    ({"tf": None, "tf_origin": None}, ["worker 1 (engine 5", "no TensorFlow installed"]),
    ({"tf": ("tensorflow", "2.20.0")}, ["worker 1 (engine 5", "runs TensorFlow 2.20.0 "
                                        "(tensorflow) but this kernel has 2.21.0",
                                        "`tensorflow-cpu==2.21.0`"]),
    ({"nbdist": "0.0.9"}, ["has nbdist 0.0.9"]),
    ({"tf_initialized": True}, ["already initialised TensorFlow", "fresh processes"]),
    ({"env_conflicts": {"TF_USE_LEGACY_KERAS": None}}, ["TF_USE_LEGACY_KERAS=None"]),
])
def test_each_incompatibility_is_one_paragraph_naming_the_worker(change, words):
    reports = {0: dict(GOOD), 1: {**GOOD, **change}}
    with pytest.raises(ClusterStartError) as info:
        compat.check_reports(reports, WHO, KERNEL, "RETRY-HINT")
    text = str(info.value)
    assert "\n" not in text and text.rstrip(".").endswith("RETRY-HINT") and "worker 0" not in text
    for word in words:
        assert word in text, text
    compat.check_reports({0: GOOD, 1: GOOD}, WHO, KERNEL, "x")   # all good: no error


def _children():
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _gone(pids, timeout=10.0):
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def failing_start(ip, monkeypatch):
    """Run `%distribute multiworker --workers 2` that must fail; check the aftermath."""
    ip.run_line_magic("distribute", "stop")
    before = _children()
    spawned = []

    def start(line="multiworker --workers 2"):
        with pytest.raises(ClusterStartError) as info:
            ip.run_line_magic("distribute", line)
        spawned.extend(_children() - before)
        return str(info.value)

    yield start
    monkeypatch.undo()
    assert session_cluster() is None and live_clusters() == []
    assert _gone(spawned) == [], "processes left after a failed start"
    assert run_ok(ip, "21 * 2") == 42                       # the kernel is still usable
    ip.run_line_magic("distribute", "mirrored --devices 4")


def _fake_engine_path(monkeypatch, fake_dir):
    """Engines started by nbdist get ``fake_dir`` first on their PYTHONPATH."""
    real = engines.nbdist_pythonpath
    monkeypatch.setattr(engines, "nbdist_pythonpath",
                        lambda: os.pathsep.join([str(fake_dir), real()]))


def test_a_worker_that_cannot_import_tensorflow(failing_start, monkeypatch, tmp_path):
    package = tmp_path / "tensorflow"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('this tensorflow is broken')\n")
    _fake_engine_path(monkeypatch, tmp_path)
    text = failing_start()
    assert text.startswith("workers 0 (engine 0, pid ") and " 1 (engine 1, pid " in text
    assert "cannot import TensorFlow (ImportError: this tensorflow is broken" in text
    assert str(package / "__init__.py") in text and "PYTHONPATH" in text
    assert "run the `%distribute multiworker` line again" in text


def test_a_worker_on_another_tensorflow_version(failing_start, monkeypatch, tmp_path):
    name, version = compat.tensorflow_distribution()
    info = tmp_path / f"{name.replace('-', '_')}-2.99.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 2.99.0\n")
    _fake_engine_path(monkeypatch, tmp_path)
    text = failing_start()
    assert f"runs TensorFlow 2.99.0 ({name}) but this kernel has {version} ({name})" in text
    assert f"`{name}=={version}`" in text and sys.executable in text
    assert text.startswith("workers 0 (engine 0, pid ")


def test_a_tf_config_port_already_in_use(failing_start, monkeypatch):
    # a port taken on this machine: only where the workers share its network (in their own
    # namespace, the default, no port of theirs can be taken by another process)
    monkeypatch.setenv("NBDIST_ISOLATION", "0")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        real = tfconfig.free_ports
        monkeypatch.setattr(tfconfig, "free_ports", lambda n, host="127.0.0.1": [
            *real(n - 1, host), port])   # the last worker gets the taken port
        text = failing_start()
    assert text.count("[worker 1]") == 1 and f"127.0.0.1:{port}" in text, text
    assert "worker 0 waited for it and was stopped" in text, text
    assert "already in use" in text or "could not listen" in text, text
    assert "again" in text and "new free ports" in text, text
