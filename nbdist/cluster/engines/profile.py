"""Workers on the engines of an existing ipyparallel cluster: ``--cluster PROFILE``.

The user started the cluster (``ipcluster start --profile NAME``, or any launcher: SSH, MPI,
Slurm...); nbdist neither starts nor kills its controller. ``ProfileEngines`` finds it from
the profile's cluster file (``ipyparallel.Cluster.from_file``; ``NAME@CLUSTER_ID`` picks one
of several clusters in a profile), or, for a controller started by hand, its
``ipcontroller-client.json`` (``ipyparallel.Client(profile_dir=...)``). The workers are the
engines registered there, in engine-id order (``--workers N``: the first N).

Addresses. Each engine reports its host name, process and the IP it uses to reach the
controller, and its kernel instance and namespaces (``hosts``). When every engine shares this
process's network stack, TF_CONFIG uses 127.0.0.1 and the telemetry channel binds 127.0.0.1.
Otherwise each worker is addressed by that IP (an engine in this process's network stack by
this machine's IP toward the others) and the channel binds the kernel's IP toward the engines:
the workers must be able to open TCP connections to it (its messages are HMAC-signed; nothing
on it is trusted without the session key). TF_CONFIG ports are chosen on each engine's host.

Stopping. TensorFlow allows one MultiWorkerMirroredStrategy per process (a second one, with a
new TF_CONFIG, hangs: checked with TF 2.21), and a parameter_server task's
``tf.distribute.Server`` cannot be stopped, so an engine that served as a worker cannot serve
another session. ``stop`` first brings up the links ``inject partition`` cut (``links``), then
ends the engines nbdist used and restarts the cluster's engines through ipyparallel
(``Cluster.restart_engines``: the same launcher, the same number of engines, fresh processes
with new engine ids); the controller keeps running. ipyparallel restarts engines by engine
*set*, so unused engines of those sets are restarted too (after a foreground ipcluster's
early-shutdown window, ``earlystop``). Without a cluster file (a hand-started controller)
nbdist cannot restart engines: it resets their namespaces, closes its channel and says that
they must be restarted before nbdist can use them again; a later session refuses such engines
with that advice, and restarts them by itself when it can. At interpreter exit nbdist only
lets go of the engines (no processes are started from a dying kernel); the next session
restarts them. `ipcluster stop` stops restarted engines (the cluster file lists
them); after an interrupted `ipcluster start` they exit when the controller's heartbeats stop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Any

import psutil

from ...errors import ConfigError
from ...hooks.ipyparallel import client_config
from ...words import count
from .. import tfconfig
from ..inengine.identity import identify, release_engine
from .base import ClusterStartError
from .hosts import is_local, is_loopback, shares_network, worker_hosts
from .links import LinkControl
from .lookup import find_cluster, hand_back, missing_engines, resolve_profile
from .restart import restart_engines
from .retired import retired

log = logging.getLogger("nbdist.cluster")

#: Seconds to wait for a cluster's engines to register (after a start or a restart).
REGISTER_TIMEOUT_S = 60.0
#: Seconds ``stop`` waits for engines it cannot restart to reset their namespaces.
RELEASE_S = 3.0


class ProfileEngines:
    """The engines of a cluster the user runs (``EngineSet``). nbdist uses them, never kills
    the cluster."""

    owned = False

    def __init__(self, name: str, n: int | None = None, timeout: float | None = None,
                 asked: str | None = None):
        self.name = name
        self.wanted = n
        self.asked = asked or f"--workers {n}"   # how the user asked for n engines
        self.timeout = REGISTER_TIMEOUT_S if timeout is None else timeout
        self.profile_dir, self.cluster_id = resolve_profile(name)
        self.cluster: Any = None          # ipyparallel.Cluster, when the profile has one
        self.client: Any = None
        self.ids: list[int] = []          # engine id of worker i
        self.idents: list[dict[str, Any]] = []
        self.local: list[bool] = []      # its pid is a process of this machine
        self.remote: list[bool] = []     # it does not share this process's network stack
        self.hosts: list[str] = []
        self.channel_host = "127.0.0.1"
        self.unisolated: str | None = None   # the user's cluster, secured as they set it up
        self.exiting = False              # set at interpreter exit: no restart then
        self.touched = False              # nbdist ran its code there (preflight onwards)
        self.links = LinkControl([])      # %distribute inject partition / heal

    # -- start -----------------------------------------------------------------------------
    @property
    def restartable(self) -> bool:
        return self.cluster is not None and bool(self.cluster.engines)

    def expected_engines(self) -> int:
        """Engines the cluster file says were started (0 if unknown)."""
        if self.cluster is None:
            return 0
        return sum(getattr(es, "n", 0) or 0 for es in self.cluster.engines.values())

    def start(self) -> None:
        """Connect to the cluster, pick the engines, learn where they run."""
        import ipyparallel as ipp

        self.cluster = find_cluster(self.profile_dir, self.cluster_id, self.name)
        if self.cluster is not None:
            self.client = self.cluster.connect_client_sync()
        else:
            self.client = ipp.Client(profile_dir=self.profile_dir,
                                     cluster_id=self.cluster_id or "")
        if self.restartable and missing_engines(self.cluster):
            self._bring_back(missing_engines(self.cluster))
        self._wait_for_engines()
        self._choose()
        if any(d["used"] for d in self.idents):
            self._restart_spent()
        self.local = [is_local(d) for d in self.idents]
        self.remote = [not shares_network(d) for d in self.idents]
        self.hosts, self.channel_host = worker_hosts(self.idents,
                                                     [not r for r in self.remote])
        self.links = LinkControl(self.idents)

    def _controller_host(self) -> str:
        cfg = client_config(self.client)
        host = (cfg.get("interface") or "tcp://127.0.0.1").split("://")[-1]
        if host in ("*", "0.0.0.0", ""):
            host = cfg.get("location") or "127.0.0.1"
        return host

    def _usable_ids(self) -> list[int]:
        """Registered engines, less those nbdist restarted away (``retired``)."""
        return sorted(set(self.client.ids) - retired(self.client, self.profile_dir))

    def _wait_for_engines(self, at_least: int = 1) -> None:
        want = max(at_least, min(self.expected_engines(), self.wanted or 10**6), 1)
        deadline = time.monotonic() + self.timeout
        while len(self._usable_ids()) < want and time.monotonic() < deadline:
            time.sleep(0.1)
        if len(self._usable_ids()) < want:   # fewer engines may still be enough
            if len(self._usable_ids()) < max(at_least, 1):
                raise ClusterStartError(
                    f"--cluster {self.name}: only {count(len(self._usable_ids()), 'engine')} "
                    f"registered with the controller within {self.timeout:.0f} s. Start "
                    f"engines, e.g. `ipcluster engines --profile-dir {self.profile_dir} --n 2 "
                    "--daemonize`, "
                    "and check their logs in the profile's log/ directory."
                ) from None

    def _bring_back(self, missing: int) -> None:
        """Restart the engine sets when some of their engines died (e.g. one started while
        its host was cut off, by the restart at a partition, gave up registering): once the
        host is back, it gets an engine again."""
        print(f"nbdist: {missing} of the {self.expected_engines()} engines of profile "
              f"{self.name!r} no longer run (an engine started while its host was cut off "
              "gives up registering); restarting the cluster's engines to bring them back.",
              file=sys.stderr)
        self._restart()

    def _choose(self) -> None:
        available = self._usable_ids()
        if self.wanted is not None and self.wanted > len(available):
            raise ConfigError(
                f"{self.asked}: the cluster of profile {self.name!r} has "
                f"{count(len(available), 'engine')}. Ask for at most {len(available)}, drop "
                f"--workers to use them all, or start more engines (`ipcluster engines "
                f"--profile-dir {self.profile_dir} --n {self.wanted - len(available)} "
                "--daemonize`)."
            )
        self.ids = available[: self.wanted or len(available)]
        host = self._controller_host()
        self.idents = self.client[self.ids].apply_sync(identify, host)

    def _restart_spent(self) -> None:
        spent = [eid for eid, d in zip(self.ids, self.idents, strict=True) if d["used"]]
        if not self.restartable:
            raise ClusterStartError(
                f"{_engines(spent).capitalize()} of profile {self.name!r} already "
                "hosted nbdist's workers; TensorFlow's cluster state (a "
                "MultiWorkerMirroredStrategy, a parameter-server gRPC server) lasts as long as "
                "the process, and this cluster has no cluster file through which nbdist could "
                "restart its engines. Restart those engines yourself (stop and start their "
                "`ipengine` processes), then run this line again."
            )
        print(f"nbdist: {_engines(spent)} of profile {self.name!r} "
              "already hosted nbdist's workers; restarting the cluster's engines "
              "(TensorFlow's cluster state lasts as long as the process).", file=sys.stderr)
        from ..inengine.worker import exit_soon

        self._restart(exit_soon)
        self._wait_for_engines()
        self._choose()

    def _restart(self, quit_fn: Any = None) -> None:
        restart_engines(self.cluster, self.client, self.profile_dir, self.name, self.ids,
                        quit_fn)

    def task_addresses(self) -> list[str]:
        """Each engine's address for a TensorFlow server: its host, a port free there (asked
        on that host)."""
        by_host: dict[str, list[int]] = {}
        for i, host in enumerate(self.hosts):
            by_host.setdefault(host, []).append(i)
        ports: dict[int, int] = {}
        for host, workers in by_host.items():
            bind = "127.0.0.1" if is_loopback(host) else "0.0.0.0"
            found = self.client[self.ids[workers[0]]].apply_sync(
                tfconfig.free_ports, len(workers), bind)
            ports.update(zip(workers, found, strict=True))
        return [f"{host}:{ports[i]}" for i, host in enumerate(self.hosts)]

    def describe(self) -> str:
        places = {(d["host"], d.get("boot_id"), d.get("netns")) for d in self.idents}
        where = ("on this machine" if all(shares_network(d) for d in self.idents) else
                 f"on {count(len(places), 'host')} {', '.join(sorted({p[0] for p in places}))}")
        return (f"{len(self.ids)} engines {list(self.ids)} of ipyparallel profile "
                f"{self.name!r} ({self.profile_dir}), {where}; not started by nbdist")

    def kernel_server_network(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()   # the engines reach the kernel as the user set up

    def mark_used(self) -> None:
        self.touched = True   # from here on stop must restart the engines

    @property
    def pids(self) -> dict[int, int]:
        """Empty: nbdist started none of these engines (they may run on other machines,
        under ipyparallel's nanny), so it does not watch them by pid while it sets them up;
        a dead engine is noticed through ipyparallel (its nanny, or the controller's
        heartbeats, unregister it). Once the workers report themselves at setup, those on
        this machine are watched by the pid they report."""
        return {}

    def kill_blocked(self, pids: list[int]) -> None:
        pass   # a user's engines are restarted at stop instead

    def controller_gone(self) -> int | None:
        return None   # not started by nbdist, perhaps on another machine: not watched

    def restart_advice(self, family: str) -> str:
        return (f"restart the engines of profile {self.name!r} with that environment "
                f"(`ipcluster stop --profile-dir {self.profile_dir}`, then `ipcluster start` "
                f"as before) and run `%distribute {family} --cluster {self.name}` again")

    # -- processes (none are ours) ---------------------------------------------------------
    def remember_processes(self) -> None:
        """Nothing to remember: nbdist owns no process of this cluster."""

    def processes(self) -> list[psutil.Process]:
        return []   # nbdist started none

    def send_signal(self, sig: int, engine_ids: list[int]) -> None:
        """Signal engines through ipyparallel (their nanny); local ones directly if that
        fails (engines started without a nanny)."""
        if self.client is None or not engine_ids:
            return
        try:
            self.client.send_signal(sig, targets=engine_ids, block=True)
        except Exception as err:
            log.debug("ipyparallel could not signal engines %s: %s", engine_ids, err)
            for i, eid in enumerate(self.ids):
                if eid in engine_ids and i < len(self.local) and self.local[i]:
                    try:
                        os.kill(self.idents[i]["pid"], sig)
                    except OSError:
                        pass

    # -- stop ------------------------------------------------------------------------------
    def stop(self, timeout: float = 1.0, quit_fn: Any = None) -> list[int]:
        """Leave the cluster running and clean: restart its engines (or reset them when
        that is impossible). Returns [] as nbdist kills nothing here."""
        self.links.heal_all()   # first: no host of the user's cluster stays cut off
        if self.client is None:
            return []
        try:
            if self.exiting:
                pass   # the kernel is exiting: the next session restarts the spent engines
            elif not self.touched:
                pass   # e.g. --workers too large: nothing ran on the engines
            elif self.restartable and self.ids:
                self._restart(quit_fn)
                hand_back(self.cluster)
                print(f"nbdist: restarted the engines of profile {self.name!r} (fresh "
                      "processes, empty namespaces); the cluster keeps running.")
            elif self.ids:
                self._release()
        finally:
            try:
                self.client.close(linger=0)
            except Exception:  # closing is best effort
                pass
            self.client = None
        return []

    def _release(self) -> None:
        """Reset the engines' namespaces, waiting at most ``RELEASE_S``: an engine still
        blocked in a collective (after a stall) or cut off (a partition) cannot answer, and
        ``stop`` must return. Its request is withdrawn; it is named and left as it is."""
        silent: list[int] = []
        try:
            pending = {eid: self.client[eid].apply_async(release_engine) for eid in self.ids}
            deadline = time.monotonic() + RELEASE_S
            for ar in pending.values():
                ar.wait(max(deadline - time.monotonic(), 0))
            silent = [eid for eid, ar in pending.items() if not ar.ready()]
            for eid in silent:
                try:
                    self.client.abort(pending[eid], block=False)
                except Exception as err:   # best effort: the engine may be unreachable
                    log.debug("could not withdraw the release from %s: %s", eid, err)
        except Exception as err:
            log.debug("could not release engines %s: %s", self.ids, err)
        if silent:
            print(f"nbdist: {_engines(silent)} of profile {self.name!r} "
                  f"did not answer within {RELEASE_S:g} s (blocked in TensorFlow, or their "
                  "host is unreachable) and were left as they are.", file=sys.stderr)
        print(f"nbdist: engines {self.ids} of profile {self.name!r} are released (namespaces "
              "reset) but still hold TensorFlow state that lasts as long as the process (a "
              "MultiWorkerMirroredStrategy or a parameter-server gRPC server); nbdist cannot "
              "restart them (no cluster file). Restart them before nbdist uses this "
              "profile again.", file=sys.stderr)


def _engines(ids: list[int]) -> str:
    """``"engine 3"`` or ``"engines 1, 2"``."""
    return f"engine{'s' if len(ids) != 1 else ''} {', '.join(map(str, ids))}"
