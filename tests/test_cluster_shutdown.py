"""Shutting down a real Jupyter kernel leaves no worker, engine or controller process."""

import contextlib
import json
import os
import time

import psutil
from helpers import ROOT


def test_kernel_shutdown_leaves_no_process_behind():
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        code = ("%load_ext nbdist\n%distribute multiworker --workers 2\n"
                "from nbdist.session import current_session as _cs\n"
                "print('PIDS', __import__('json').dumps([p.pid for p in "
                "_cs().backend.processes()]))")
        reply = kc.execute_interactive(code, timeout=180, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        line = next(ln for ln in "".join(out).splitlines() if ln.startswith("PIDS"))
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) >= 3, pids          # controller, 2 engines (started without nannies)
        kernel = psutil.Process(km.provisioner.process.pid)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)        # a normal shutdown request, as Jupyter sends
    kernel.wait(timeout=30)
    deadline = time.monotonic() + 10
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        time.sleep(0.2)
    assert left == [], [psutil.Process(p).cmdline() for p in left if _alive(p)]


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_kernel_killed_outright_takes_its_workers_with_it():
    """SIGKILL (the OOM killer, a crashed kernel) runs no cleanup: the engines, which run
    without ipyparallel's nanny, end themselves once their kernel is gone."""
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        code = ("%load_ext nbdist\n%distribute multiworker --workers 2\n"
                "from nbdist.session import current_session as _cs\n"
                "print('PIDS', __import__('json').dumps([p.pid for p in "
                "_cs().backend.processes()]))")
        reply = kc.execute_interactive(code, timeout=180, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        line = next(ln for ln in "".join(out).splitlines() if ln.startswith("PIDS"))
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) >= 3, pids
        kernel = psutil.Process(km.provisioner.process.pid)
        kernel.kill()
        kernel.wait(timeout=30)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    deadline = time.monotonic() + 10
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in left if _alive(p)]
        time.sleep(0.2)
    try:
        assert not left, [psutil.Process(p).cmdline() for p in left if _alive(p)]
    finally:
        for pid in left:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
