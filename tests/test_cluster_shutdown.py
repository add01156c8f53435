"""Ending a real Jupyter kernel, by a shutdown request or by SIGKILL, leaves no worker, engine
or controller process."""

import contextlib
import json
import os
import time

import psutil
from helpers import ROOT, living

START = ("%load_ext nbdist\n%distribute multiworker --workers 2\n"
         "from nbdist.session import current_session as _cs\n"
         "print('PIDS', __import__('json').dumps([p.pid for p in _cs().backend.processes()]))")


@contextlib.contextmanager
def kernel_with_workers():
    """A Jupyter kernel running `%distribute multiworker --workers 2`: (its manager, its
    psutil Process, the psutil Processes of controller and engines)."""
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=env)
    out = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    try:
        reply = kc.execute_interactive(START, timeout=180, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        line = next(ln for ln in "".join(out).splitlines() if ln.startswith("PIDS"))
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) >= 3, pids          # controller, 2 engines (started without nannies)
        yield km, psutil.Process(km.provisioner.process.pid), [psutil.Process(p) for p in pids]
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def left_after(procs, seconds=10):
    """Those of ``procs`` still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    left = living(procs)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = living(left)
    return left


def test_kernel_shutdown_leaves_no_process_behind():
    with kernel_with_workers() as (km, kernel, procs):
        km.shutdown_kernel(now=False)        # a normal shutdown request, as Jupyter sends
        kernel.wait(timeout=30)
    left = left_after(procs)
    assert left == [], [p.cmdline() for p in left]


def test_a_kernel_killed_outright_takes_its_workers_with_it():
    """SIGKILL (the OOM killer, a crashed kernel) runs no cleanup: the controller and the
    engines (which run without ipyparallel's nanny) end themselves once their kernel is gone
    (nbdist.cluster.withkernel)."""
    with kernel_with_workers() as (_, kernel, procs):
        kernel.kill()
        kernel.wait(timeout=30)
    left = left_after(procs)
    try:
        assert not left, [p.cmdline() for p in left]
    finally:
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
