"""The ipyparallel controller and engines behind a local cluster, and their cleanup.

``LocalEngines`` starts one controller and N engines on this machine through ipyparallel's
``Cluster`` API (its ``LocalControllerLauncher`` / ``LocalEngineSetLauncher``), in a private
profile directory: the engines in a private network namespace (``isolation``) and the
controller on Unix sockets, or, where this machine allows no namespace, every socket on
127.0.0.1. ``stop`` ends them through the same API,
then checks with psutil that no process is left and kills any that is.

The engines run without ipyparallel's nanny (a second process per engine, 0.3 s of CPU each in
a cold start): nbdist knows each engine's pid (``pids``), signals and watches it (psutil).
Engines and controller end themselves once this kernel is gone (``withkernel``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import psutil

from ...hooks import ipyparallel as ipyparallel_hooks
from .. import tfconfig, withkernel
from ..inengine import preload
from .base import START_TIMEOUT_S, ClusterStartError, nbdist_pythonpath
from .enginelogs import ENGINE_LOG
from .isolation import IsolationUnavailable, Namespace

log = logging.getLogger("nbdist.cluster")

#: Seconds between SIGTERM and SIGKILL when stopping a process.
KILL_AFTER_S = 3


class LocalEngines:
    """One ipyparallel controller and ``n`` engines, all on this machine (``EngineSet``)."""

    owned = True
    #: They share this process's network stack: no link of one can be cut alone.
    links = None

    def __init__(self, n: int, environment: dict[str, str] | None = None,
                 engine_args: list[str] | None = None, timeout: float | None = None,
                 kernel_connects: bool = False):
        self.n = n
        self.kernel_connects = kernel_connects
        self.environment = {"PYTHONPATH": nbdist_pythonpath(), **(environment or {})}
        self.engine_args = list(engine_args or [])
        self.timeout = START_TIMEOUT_S if timeout is None else timeout
        self.profile_dir = tempfile.mkdtemp(prefix="nbdist-ipp-")
        self.cluster: Any = None
        self.client: Any = None
        self.ids: list[int] = []          # engine id of worker i
        self.pids: dict[int, int] = {}      # engine id -> its process
        self._known: dict[int, psutil.Process] = {}
        self.controller_pid: int | None = None   # the controller's process, once started
        self.exiting = False
        self.namespace: Namespace | None = None
        #: Why the engines share the kernel's network (None: they run in ``namespace``).
        self.unisolated: str | None = None
        self.channel_host = "127.0.0.1"

    @property
    def local(self) -> list[bool]:
        return [True] * len(self.ids)

    @property
    def remote(self) -> list[bool]:
        return [False] * len(self.ids)

    def mark_used(self) -> None:
        """Nothing to mark: stop ends these engines anyway."""

    def kernel_server_network(self) -> contextlib.AbstractContextManager[None]:
        if self.namespace is None or self.namespace.link is None:
            return contextlib.nullcontext()
        return self.namespace.entered()

    def task_addresses(self) -> list[str]:
        host = "127.0.0.1" if self.namespace is None else self.namespace.address
        return [f"{host}:{port}" for port in tfconfig.free_ports(len(self.ids))]

    def describe(self) -> str:
        if self.namespace is not None:
            return (f"{self.n} local ipyparallel engines in a private network namespace "
                    "(controller on Unix sockets)")
        return f"{self.n} local ipyparallel engines (controller on 127.0.0.1)"

    def kill_blocked(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def restart_advice(self, family: str) -> str:
        return (f"run the `%distribute {family}` line again: nbdist starts fresh engines with "
                f"this kernel's Python ({sys.executable}) and environment")

    # -- start -----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the controller and engines and wait until all engines have registered."""
        import ipyparallel as ipp
        from traitlets.config import Config

        self._isolate()
        config = Config()
        config.LocalProcessLauncher.stop_seconds_until_kill = KILL_AFTER_S
        config.LocalEngineSetLauncher.delay = 0.0
        # Engines start as the controller does, and import TensorFlow meanwhile (preload)
        engine_cmd = [sys.executable, "-m", preload.__name__]
        config.LocalEngineSetLauncher.engine_cmd = (
            engine_cmd if self.namespace is None else self.namespace.command(engine_cmd))
        config.LocalControllerLauncher.controller_cmd = withkernel.command("ipyparallel.controller")
        # In a namespace the engines reach the controller by its Unix sockets (ZeroMQ ipc)
        transport = [] if self.namespace is None else ["--transport=ipc"]
        controller_ip = ("127.0.0.1" if self.namespace is None
                         else os.path.join(self.profile_dir, "ipc"))
        self.cluster = ipp.Cluster(
            config=config, profile_dir=self.profile_dir, controller_ip=controller_ip,
            delay=0, log=ENGINE_LOG, load_profile=False, engine_timeout=int(self.timeout),
            send_engines_connection_env=False,   # engines read the controller's file instead
            controller_args=[
                *transport,
                "--usethreads",                    # schedulers as threads: 1 process, not 9
                # The hub admits an engine at a heartbeat: 3 s by default, most of the start
                # time; a dead engine is still declared after 20 missed beats (10 s).
                "--HeartMonitor.period=500", "--HeartMonitor.max_heartmonitor_misses=20",
            ],
        )
        try:
            self.cluster.start_controller_sync()   # returns once launched, not ready
            name = "-".join(filter(None, ["ipcontroller", self.cluster.cluster_id, "engine"]))
            url_file = os.path.join(self.profile_dir, "security", name + ".json")
            self.cluster.start_engines_sync(
                self.n, environment={**self.environment, preload.URL_FILE_ENV: url_file},
                engine_args=[*self.engine_args,
                             f"--IPEngine.wait_for_url_file={self.timeout:.0f}",
                             "--IPEngine.enable_nanny=False"])
            if self.namespace is not None:
                self._link_ipc_endpoints(url_file)
            self.client = self.cluster.connect_client_sync()
            self._wait_for_engines()
            self.ids = sorted(self.client.ids)[: self.n]
            pids = self.client[self.ids].apply_async(os.getpid)   # answered during the import
            self._wait_while_engines_live(pids)
            self.pids = dict(zip(self.ids, pids.get(1), strict=True))
        except BaseException:
            self.stop()
            raise
        self.controller_pid = next(iter(self.launcher_pids()["controller"]), None)
        self.remember_processes()

    def _isolate(self) -> None:
        """Open the engines' network namespace, or say why they share the kernel's."""
        try:
            self.namespace = Namespace.open(linked=self.kernel_connects)
        except IsolationUnavailable as why:
            self.unisolated = str(why)
            return
        self.channel_host = os.path.join(self.profile_dir, "channel")

    def _link_ipc_endpoints(self, engine_file: str) -> None:
        """Make the controller's ipc endpoints connectable (see ``ipc_aliases``) once it has
        written its connection files (the engines meanwhile import TensorFlow)."""
        files = [engine_file, engine_file[: -len("engine.json")] + "client.json"]
        deadline = time.monotonic() + self.timeout
        while not all(os.path.exists(f) for f in files):
            if time.monotonic() > deadline or self.controller_gone_early():
                raise ClusterStartError(
                    "The ipyparallel controller wrote no connection file, so the workers "
                    "cannot start. nbdist stops the engines; run the `%distribute` line "
                    "again. Its log:\n" + _tail(_glob_logs(self.profile_dir, "ipcontroller")))
            time.sleep(0.02)
        time.sleep(0.05)   # the file is written whole right after it is created
        for f in files:
            ipyparallel_hooks.ipc_aliases(f)

    def controller_gone_early(self) -> bool:
        return any(not _running(pid) for pid in self.launcher_pids()["controller"])

    def _wait_while_engines_live(self, future: Any) -> None:
        """Wait for ``future`` (at most the start timeout); fail at once if an engine exits."""
        deadline = time.monotonic() + self.timeout + 5
        while not future.done() and time.monotonic() < deadline:
            exited = [pid for pid in self.launcher_pids()["engines"] if not _running(pid)]
            exited += [data.get("pid") for engines in self.cluster.engines.values() for data in
                       ((getattr(engines, "stop_data", None) or {}).get("engines") or {}).values()]
            if exited:
                raise ClusterStartError(
                    f"An engine process (pid {exited[0]}) exited during startup (killed, out "
                    "of memory, or an error in its log below), so the workers cannot start. "
                    "nbdist stops the others; run the `%distribute` line again for fresh "
                    "engines. Its log:\n" + self.engine_log_tail())
            concurrent.futures.wait([future], timeout=0.1)   # returns once it is done

    def _wait_for_engines(self) -> None:
        future = self.client.wait_for_engines(self.n, block=False, timeout=self.timeout,
                                              interactive=False)
        self._wait_while_engines_live(future)
        try:
            future.result(timeout=1)
        except Exception as err:
            raise ClusterStartError(
                f"Only {len(self.client.ids)} of {self.n} worker engines registered within "
                f"{self.timeout:.0f} s ({err}). The machine may be overloaded; try fewer "
                "--workers. Engine log:\n" + self.engine_log_tail()
            ) from None

    # -- processes -------------------------------------------------------------------------
    def launcher_pids(self) -> dict[str, list[int]]:
        """Pids of the processes ipyparallel launched: the controller and each engine."""
        out: dict[str, list[int]] = {"controller": [], "engines": []}
        if self.cluster is None:
            return out
        controller = self.cluster.controller
        if controller is not None and getattr(controller, "pid", -1) > 0:
            out["controller"].append(controller.pid)
        for engine_set in self.cluster.engines.values():
            for launcher in getattr(engine_set, "launchers", {}).values():
                if getattr(launcher, "pid", -1) > 0:
                    out["engines"].append(launcher.pid)
        return out

    def remember_processes(self) -> None:
        """Record every process of the cluster (launched ones and their children)."""
        for pids in self.launcher_pids().values():
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    family = [proc, *proc.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for p in family:
                    self._known.setdefault(p.pid, p)

    def processes(self) -> list[psutil.Process]:
        """The cluster's processes that are still running."""
        self.remember_processes()
        return [p for p in self._known.values() if _alive(p)]

    def engine_log_tail(self, lines: int = 20) -> str:
        logs = sorted(_glob_logs(self.profile_dir, "ipengine"))
        text = []
        for path in logs[-self.n:]:
            try:
                with open(path, errors="replace") as f:
                    text += [f"  {line.rstrip()}" for line in f.readlines()[-lines:]]
            except OSError:
                continue
        return "\n".join(text) or "  (empty)"

    def controller_gone(self) -> int | None:
        pid = self.controller_pid
        return pid if pid is not None and not _running(pid) else None

    def send_signal(self, sig: int, engine_ids: list[int]) -> None:
        """Signal engines (their processes, directly)."""
        for engine_id in engine_ids:
            with contextlib.suppress(KeyError, OSError):   # not started, or gone already
                os.kill(self.pids[engine_id], sig)

    # -- stop ------------------------------------------------------------------------------
    def stop(self, timeout: float = 1.0, quit_fn: Any = None) -> list[int]:
        """Stop everything; return the pids of engines or controller that had to be killed.

        ``quit_fn``, if given, is first run on every engine (without waiting for an answer)
        to make it exit by itself; engines still running after a moment are stopped by
        ipyparallel (SIGTERM, then SIGKILL). Processes left ``timeout`` seconds after that
        are killed. All this fits in the 2.5 s Jupyter gives a kernel to exit before it sends
        SIGTERM.
        """
        if self.cluster is not None:
            self.remember_processes()
        if self.controller_gone() is not None:   # nothing reaches the engines: end them
            self.kill_blocked(self.launcher_pids()["engines"])
        elif quit_fn is not None and self.client is not None and self.ids:
            self._quit_engines(quit_fn)
        if self.client is not None:
            with contextlib.suppress(Exception):  # a half-started client: best effort
                self.client.close(linger=0)
            self.client = None
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception as err:
                log.warning("ipyparallel could not stop the cluster cleanly: %s", err)
            self.cluster.shutdown_atexit = False
            self.cluster = None
        killed = _reap(list(self._known.values()), timeout)
        self._known.clear()
        self.pids = {}
        if self.namespace is not None:
            self.namespace.close()
            self.namespace = None
        shutil.rmtree(self.profile_dir, ignore_errors=True)
        return killed


    def _quit_engines(self, quit_fn: Any, wait: float = 3.0) -> None:
        engines = [psutil.Process(pid) for pid in self.launcher_pids()["engines"]
                   if _running(pid)]
        for proc in engines:
            if _stopped(proc):   # SIGSTOPped: it cannot quit (nor handle SIGTERM)
                proc.kill()
        for engine_id in self.ids:
            try:
                self.client[engine_id].apply_async(quit_fn)
            except Exception as err:  # a dead engine: ipyparallel stops the rest
                log.debug("could not ask engine %s to quit: %s", engine_id, err)
        _wait_gone(engines, wait)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until ``procs`` exit (zombies count as gone: PID 1 of a container may be slow
    to reap orphans); return those still running after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _alive(p)]
    return alive


def _reap(procs: list[psutil.Process], timeout: float) -> list[int]:
    """Wait for ``procs`` to exit; SIGKILL whatever is left after ``timeout``."""
    killed = []
    for proc in _wait_gone(procs, timeout):
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    _wait_gone(procs, 3.0)
    return killed


def _tail(paths: list[str], lines: int = 20) -> str:
    text = []
    for path in paths:
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            text += [f"  {line.rstrip()}" for line in f.readlines()[-lines:]]
    return "\n".join(text) or "  (empty)"


def _glob_logs(profile_dir: str, prefix: str) -> list[str]:
    folder = os.path.join(profile_dir, "log")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names if n.startswith(prefix)]
