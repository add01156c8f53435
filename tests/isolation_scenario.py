"""Driver for tests/test_isolation.py: a kernel-like process that starts one local cluster.

``python tests/isolation_scenario.py '%distribute LINE'`` starts the cluster, prints one JSON
line after ``READY:`` (what the start printed, the status, every TCP port the process and its
children listen on, in whichever network namespace they run), then waits for a line on stdin
before ``%distribute stop``; then it prints ``STOPPED:`` with the processes left. Its own
process because a parameter-server cluster makes the kernel its coordinator for good.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def listening() -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of this process and its children.

    Read from each process's own /proc/PID/net/tcp{,6}: psutil's ``net_connections`` reads
    the caller's network namespace, and misses the sockets of processes in another one."""
    import psutil

    found = []
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        with contextlib.suppress(OSError):
            inodes = {_target(f"/proc/{proc.pid}/fd/{fd}")[len("socket:["):-1]
                      for fd in os.listdir(f"/proc/{proc.pid}/fd")}
            for table in ("tcp", "tcp6"):
                with open(f"/proc/{proc.pid}/net/{table}") as f:
                    for row in f.read().splitlines()[1:]:
                        cols = row.split()
                        if cols[3] == "0A" and cols[9] in inodes:   # LISTEN
                            address, port = cols[1].split(":")
                            found.append((proc.pid, address, int(port, 16)))
    return found


def _target(link: str) -> str:
    try:
        return os.readlink(link)
    except OSError:   # closed meanwhile
        return ""


def main(line: str) -> None:
    import psutil
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "nbdist")
    started = io.StringIO()
    with contextlib.redirect_stdout(started):
        ip.run_line_magic("distribute", line)
    status = io.StringIO()
    with contextlib.redirect_stdout(status):
        ip.run_line_magic("distribute", "status")
    from nbdist.session import current_session

    engines = current_session().backend.engines
    namespace = getattr(engines, "namespace", None)
    children = [p.pid for p in psutil.Process().children(recursive=True)]
    print("READY:" + json.dumps({
        "started": started.getvalue(), "status": status.getvalue(), "listening": listening(),
        "holder": namespace.holder.pid if namespace else None,
        "link": namespace.link if namespace else None, "children": children}), flush=True)
    sys.stdin.readline()
    ip.run_line_magic("distribute", "stop")
    left = [pid for pid in children if psutil.pid_exists(pid)
            and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    print("STOPPED:" + json.dumps({"left": left}), flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    finally:
        sys.stdout.flush()
        os._exit(0)
