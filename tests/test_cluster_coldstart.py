"""A multiworker cold start with what overlaps it: engines that import TensorFlow in the
background while they register (``inengine.preload``), and workers that load only the Keras
their cells use. ``benchmarks/cold_start.py`` measures the start; these tests check that what
was made to overlap or was dropped still fails cleanly and changes nothing users see."""

import os
import signal
import sys

import psutil
import pytest
from helpers import run_ok, when
from test_cluster import SETUP, STEP

from nbdist.cluster.engines.base import ClusterStartError
from nbdist.cluster.multiworker.backend import live_clusters


def _engines(marker: str = "nbdist.cluster.inengine.preload") -> list[psutil.Process]:
    """This process's local engines (launched through ``inengine.preload``), or its live
    children whose command line holds ``marker``."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if marker in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _importing_tensorflow(proc: psutil.Process) -> bool:
    """TensorFlow's native library is loaded: its import (seconds long) is under way."""
    try:
        with open(f"/proc/{proc.pid}/maps") as f:
            return "_pywrap_tensorflow_internal" in f.read()
    except OSError:
        return False


@pytest.fixture
def no_cluster(ip):
    ip.run_line_magic("distribute", "stop")
    yield ip
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")   # conftest's kernel strategy


def _registered_engine():
    """An engine of the starting cluster once all have registered (their pids are known)."""
    starting = live_clusters()
    engines = starting[0].engines if starting else None
    pids = list(engines.pids.values()) if engines is not None else []
    return psutil.Process(pids[0]) if pids else None


def _engine_importing_tensorflow():
    engines = _engines()
    return engines[0] if engines and _importing_tensorflow(engines[0]) else None


@pytest.mark.parametrize("moment", ["registering", "registered"])
def test_an_engine_killed_during_the_start_fails_the_line_and_leaves_nothing(
        no_cluster, moment):
    """Killed while it imports TensorFlow before registering (seen by the launcher), or once
    registered while the kernel waits for that import (seen by its pid): either way the line
    fails naming the process, and every other process is stopped."""
    victim = _engine_importing_tensorflow if moment == "registering" else _registered_engine
    killed = []

    def kill():
        proc = victim()
        killed.append(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)

    thread, done = when(lambda: victim() is not None, kill, timeout=120)
    with pytest.raises(ClusterStartError) as info:
        no_cluster.run_line_magic("distribute", "multiworker --workers 2")
    thread.join(5)
    assert done and killed, f"no engine was seen {moment}"
    text = str(info.value)
    assert f"(pid {killed[0]})" in text and "run the `%distribute" in text, text
    assert live_clusters() == []
    assert _engines("ipyparallel") == _engines() == [], "processes left after the failed start"


def test_workers_on_tf_keras_do_not_import_keras_3(no_cluster, tf_keras):
    """A worker that runs tf_keras never imports Keras 3 (0.3 s of its start): neither the
    step's Keras hooks nor the telemetry probe load it."""
    no_cluster.run_line_magic("distribute", "multiworker --workers 2")
    run_ok(no_cluster, SETUP)
    run_ok(no_cluster, STEP.format(data="ds", flags="--steps 2"))
    loaded = run_ok(no_cluster, "%%distribute\nimport sys\nsorted({'keras', 'tf_keras'} "
                                "& set(sys.modules))")
    assert loaded.values == {0: "['tf_keras']", 1: "['tf_keras']"}, loaded
    assert "keras" in sys.modules   # the kernel's own Keras: untouched


def test_engines_collect_garbage_but_not_tensorflow_s_objects(no_cluster):
    """An engine imports TensorFlow with the garbage collector off, then freezes what the
    import created (``gc.freeze``: never scanned again) and turns the collector back on: the
    cells' own reference cycles are collected as usual."""
    no_cluster.run_line_magic("distribute", "multiworker --workers 2")
    out = run_ok(no_cluster, "%%distribute\nimport gc, weakref\n"
                             "class Node: pass\n"
                             "node = Node(); node.me = node; ref = weakref.ref(node); del node\n"
                             "gc.collect()\n"
                             "(gc.isenabled(), gc.get_freeze_count() > 100_000, ref() is None)")
    assert out.values == {0: "(True, True, True)", 1: "(True, True, True)"}, out
