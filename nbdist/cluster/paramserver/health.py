"""What the parameter-server coordinator knows of its processes, shared by step mode
(``ps_steps``) and ``model.fit`` (``ps_fit``): which died (``ProcessWatch``), the error that
names them (``TaskDied``, ``dead_message``), and the in-order recording of RemoteValues that
may never arrive (``ready``, ``drain``).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import psutil

from ...hooks.tf_coordinator import remote_value_ready
from ..failures import ClusterError

#: After an UnavailableError: how long to wait for the failed process to be seen dead.
DEATH_GRACE_S = 3.0


class ProcessWatch:
    """What the loop needs from the cluster: which processes died (checked by pid)."""

    n: int   # how many workers

    def dead(self) -> dict[str, list[int]]:  # {"worker": [indices], "ps": [indices]}
        raise NotImplementedError

    def describe(self, job: str, index: int) -> str:
        raise NotImplementedError

    def state(self, job: str, index: int) -> str:
        """The task's process state: "stopped", "running", "sleeping", ... ("unknown" where
        it cannot be seen from here)."""
        return "unknown"

    def controller_gone(self) -> int | None:
        """The ipyparallel controller's pid once it died (``EngineSet.controller_gone``)."""
        return None


class TaskProcesses(ProcessWatch):
    """``ProcessWatch`` for a cluster of ipyparallel engines, one task each (the backend:
    ``info[(job, index)]``, ``tasks`` in engine order, ``engines``)."""

    info: dict[tuple[str, int], dict[str, Any]]
    tasks: list[tuple[str, int]]
    engines: Any

    def pid(self, job: str, index: int) -> int | None:
        return self.info.get((job, index), {}).get("pid")

    def is_local(self, job: str, index: int) -> bool:
        """The task's process is one this kernel can see by its pid."""
        engines = self.engines
        return engines is None or bool(engines.local[self.tasks.index((job, index))])

    def alive(self, job: str, index: int) -> bool:
        pid = self.pid(job, index)
        if pid is None:
            return False
        engines = self.engines
        if not self.is_local(job, index):   # another machine: ask ipyparallel's heartbeat
            position = self.tasks.index((job, index))
            return engines.client is not None and engines.ids[position] in engines.client.ids
        try:
            return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE,
                                                        psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:
            return False

    def state(self, job: str, index: int) -> str:
        pid = self.pid(job, index)
        if pid is None or not self.is_local(job, index):
            return "unknown"
        try:
            return str(psutil.Process(pid).status())
        except psutil.NoSuchProcess:
            return "gone"

    def controller_gone(self) -> int | None:
        return self.engines.controller_gone() if self.engines is not None else None

    def dead(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"worker": [], "ps": []}
        for job, index in self.tasks:
            if not self.alive(job, index):
                out[job].append(index)
        return out

    def describe(self, job: str, index: int) -> str:
        return f"{job_name(job)} {index} (pid {self.pid(job, index) or '?'})"

    def signal_task(self, sig: int, job: str, index: int) -> None:
        """Signal a task's process: directly on this machine, else through ipyparallel."""
        pid = self.pid(job, index)
        if self.is_local(job, index) and pid is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        elif self.engines is not None:
            self.engines.send_signal(sig, [self.engines.ids[self.tasks.index((job, index))]])


class TaskDied(ClusterError):
    """A parameter server (or every worker) is gone: the run cannot go on."""


#: What is lost with the parameter-server cluster's processes.
CLUSTER_STATE = ("the model's variables on the parameter servers (the models and optimizers "
                 "your `%%distribute` cells built) and the datasets made on the workers")


def drain(pending: deque[Any], record: Callable[..., None], quiet: bool = False) -> None:
    """``record(*entry)`` for every pending step, oldest first, each removed once recorded
    (an interrupt may come in between). ``quiet``: after an error, forget the rest (the run
    failed meanwhile: keep what was recorded)."""
    while pending:
        try:
            record(*pending[0])
        except Exception:
            if not quiet:
                raise
            pending.clear()
            return
        pending.popleft()


def dead_message_after(watch: ProcessWatch, err: BaseException, steps_done: int) -> str:
    """``dead_message``, giving a process behind an UnavailableError time to be seen
    dead."""
    deadline = time.monotonic() + (DEATH_GRACE_S if type(err).__name__ ==
                                   "UnavailableError" else 0.0)
    while True:
        died = dead_message(watch, steps_done)
        if died or time.monotonic() > deadline:
            return died
        time.sleep(0.05)


def dead_message(watch: ProcessWatch, steps_done: int) -> str:
    """Why the run cannot go on: a parameter server or every worker died ("" if neither)."""
    dead = watch.dead()
    steps = f" after step {steps_done}" if steps_done else ""
    if dead.get("ps"):
        who = ", ".join(watch.describe("ps", i) for i in dead["ps"])
        return (f"{who} died{steps}: its process is gone, and with it the model's "
                "variables that lived there; ParameterServerStrategy cannot continue "
                "without it. Run `%distribute restart` for fresh servers, then create "
                "the model and optimizer again (the steps so far are kept in "
                "nbdist.runs[-1]).")
    if dead.get("worker") and len(dead["worker"]) == watch.n:
        return (f"Every worker died{steps}, so no step can run. Run `%distribute "
                "restart` for fresh workers, then create the model again.")
    return ""


def ready(remote: Any) -> bool:
    """Whether a RemoteValue has its result (or error) without blocking."""
    return remote_value_ready(remote)   # True (so fetch blocks) on a TensorFlow without it


def job_name(job: str) -> str:
    """How a TensorFlow job is named to users ("worker", "parameter server")."""
    return "parameter server" if job == "ps" else job
