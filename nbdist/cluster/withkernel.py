"""Processes that end with the kernel that started them.

A kernel killed outright (the OOM killer, SIGKILL, a crash) runs no cleanup, so the local
controller and engines it started would run on forever: the engines run without ipyparallel's
nanny, and the controller does not watch its parent. Each of them runs ``exit_with_parent``:
a thread that ends the process once its parent is no longer the process that started it.

    python .../nbdist/cluster/withkernel.py MODULE [ARGS]   # MODULE as __main__

It is run by its path and imports only the standard library: the controller's start does not
pay for importing nbdist (0.1-0.3 s of a cold start).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time

#: How often the process checks that the kernel that started it is still its parent.
PARENT_CHECK_S = 1.0


_forks_watched = [False]


def exit_with_parent() -> None:
    """End this process (at once, even while its main thread is busy in C++) once the process
    that is its parent now is gone; so do the processes it forks (the controller forks one),
    each once its own parent is."""
    if not _forks_watched[0]:
        _forks_watched[0] = True
        os.register_at_fork(after_in_child=exit_with_parent)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:   # re-parented: the kernel is gone
                os._exit(0)

    threading.Thread(target=watch, name="nbdist-exit-with-kernel", daemon=True).start()


def command(module: str) -> list[str]:
    """The command that runs ``module`` as ``__main__`` under ``exit_with_parent``."""
    return [sys.executable, os.path.abspath(__file__), module]


def main() -> None:
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]   # run by its path: this directory's modules must not shadow others
    exit_with_parent()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
