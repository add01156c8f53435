"""Several hosts on one machine: a bed of Linux network namespaces for multi-host tests.

One bridge on this machine (the kernel's side, address .1) and, per simulated host, a network
namespace joined to it by a veth pair with its own address (.11, .12, ...), optionally a
``tc netem`` delay and rate on its link (``tbf`` for a rate alone where the kernel has no
netem). Processes started on a host run under
``ip netns exec NS unshare --uts --pid --fork --kill-child --mount-proc`` with the hostname
``hostN``: their own network stack, hostname and PID space. Hosts listed in ``shared`` keep
this machine's hostname and PID space (only their network is theirs): the case where names
and pids cannot tell hosts apart.

``start_cluster`` runs ``ipcluster start`` in a profile whose controller listens on
the bridge address and whose engine command places each engine on a host that has none (so
``ipcluster``'s own launcher starts, stops and restarts the remote engines: nbdist's
``%distribute stop`` and ``restart`` restart them for real). With ``ssh=True`` every host
also runs an sshd and the profile's engines are started over ssh by ipyparallel's own
``SSHEngineSetLauncher`` instead (tests/hostbed_ssh.py). The kernel and the controller stay
on this machine, as a user's notebook and controller would.

Every name carries ``nbd<pid>`` (the pid of the process that owns the bed); ``down`` removes
every namespace, link and process of the bed, and each new bed first removes those of beds
whose owner died (a crashed run). A bed started by hand (``python3 tests/hostbed.py up 3``)
is kept until ``python3 tests/hostbed.py down``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import hostbed_ssh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "nbd"
#: Beds started by hand record themselves here (kept until `hostbed.py down`).
KEEP_DIR = "/run/nbdist-hostbed"
ENGINE_WRAPPER = "ipengine-on-a-free-host"
PR_SET_CHILD_SUBREAPER = 36   # prctl(2)
#: ``IPClusterEngines.early_shutdown``, ipyparallel's default: its ``ipcluster start`` ends the
#: whole cluster if its engines stop that soon after starting.
EARLY_SHUTDOWN_S = 30


def skip_reason() -> str | None:
    """Why this machine cannot run the bed, or None."""
    if sys.platform != "linux":
        return "the host bed needs Linux network namespaces"
    missing = [t for t in ("ip", "tc", "unshare") if shutil.which(t) is None]
    if missing:
        return f"the host bed needs {', '.join(missing)} (iproute2, util-linux)"
    if os.geteuid() != 0:
        return "the host bed needs root (network namespaces, veth pairs, a bridge)"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie is gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_namespace_processes(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def _free_subnet() -> str:
    """A 10.77.K.0/24 no interface of this machine uses (K from the pid, then the next)."""
    used = _ip("-4", "-o", "addr").stdout
    k = os.getpid() % 200 + 20
    for step in range(230):
        third = (k + step) % 230 + 20
        if f" 10.77.{third}." not in used:
            return f"10.77.{third}"
    raise RuntimeError("no free 10.77.K.0/24 subnet for the host bed")


def remove_stale(keep_owner: int | None = None) -> list[str]:
    """Remove namespaces and links of beds whose owner process died (and which were not
    started by hand). Returns what was removed."""
    kept = set()
    if os.path.isdir(KEEP_DIR):
        kept = {int(n.split(".")[0]) for n in os.listdir(KEEP_DIR) if n[0].isdigit()}

    def stale(name: str) -> bool:
        found = re.match(rf"{PREFIX}(\d+)(h\d+|br|v\d+)$", name)
        if not found:
            return False
        owner = int(found.group(1))
        return owner != keep_owner and owner not in kept and not _alive(owner)

    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if stale(ns):
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if stale(name):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def rate_bytes(rate: str) -> float:
    """A ``tc`` rate (``1gbit``, ``100mbit``, ``125mbps``) in bytes per second: ``bit`` units
    are bits/s, ``bps`` units bytes/s, the prefixes k, m, g, t powers of 1000, as tc reads them."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(bit|bps)\s*", rate.lower())
    if not found:
        raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 1gbit, 100mbit or 125mbps")
    value = float(found.group(1)) * 1000 ** " kmgt".index(found.group(2) or " ")
    return value / 8 if found.group(3) == "bit" else value


@functools.lru_cache(maxsize=1)
def netem_missing() -> str | None:
    """Why ``tc netem`` cannot shape a link here (e.g. a kernel built without sch_netem), or
    None. Tried once, on a veth pair in a namespace of its own."""
    probe = f"{PREFIX}probe{os.getpid()}"
    _ip("netns", "add", probe)
    try:
        _ip("-n", probe, "link", "add", "probe0", "type", "veth", "peer", "name", "probe1")
        done = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "probe0",
                               "root", "netem", "delay", "1ms"], capture_output=True, text=True,
                              timeout=30)
        if done.returncode != 0:
            return f"this kernel has no tc netem ({done.stderr.strip()})"
        return None
    finally:
        _ip("netns", "del", probe, check=False)


class HostBed:
    """``n`` simulated hosts joined by a bridge; a context manager that removes them all."""

    def __init__(self, n: int, *, delay_ms: float | None = None, rate: str | None = None,
                 shared: tuple[int, ...] = (), owner: int | None = None, ssh: bool = False):
        self.n = n
        self.ssh = ssh
        self.delay_ms, self.rate, self.shared = delay_ms, rate, tuple(shared)
        self.owner = owner or os.getpid()
        tag = f"{PREFIX}{self.owner}"
        self.bridge = f"{tag}br"
        self.namespaces = [f"{tag}h{i + 1}" for i in range(n)]
        self.links = [f"{tag}v{i + 1}" for i in range(n)]
        self.hostnames = [socket.gethostname() if i in self.shared else f"host{i + 1}"
                          for i in range(n)]
        self.subnet = ""
        self.bridge_ip = ""
        self.ips: list[str] = []
        self.workdir = ""
        self.profile_dir = ""
        self.ipcluster_process: subprocess.Popen | None = None
        self.sshd: hostbed_ssh.SshHosts | None = None
        self.cluster_started = 0.0   # time.time() of `ipcluster start`
        self.early_shutdown = EARLY_SHUTDOWN_S
        self._reaping: threading.Event | None = None

    def __enter__(self) -> HostBed:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- network ---------------------------------------------------------------------------
    def up(self) -> None:
        if self.rate is not None:
            rate_bytes(self.rate)   # a bad rate fails before anything is made
        if self.delay_ms and netem_missing():
            raise RuntimeError(f"a link delay needs tc netem, and {netem_missing()}: leave "
                               "the delay out (a rate alone is shaped with tbf)")
        remove_stale(keep_owner=self.owner)
        self.workdir = tempfile.mkdtemp(prefix=f"nbdist-hostbed-{self.owner}-")
        self.subnet = _free_subnet()
        self.bridge_ip = f"{self.subnet}.1"
        self.ips = [f"{self.subnet}.{11 + i}" for i in range(self.n)]
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for ns, link, ip in zip(self.namespaces, self.links, self.ips, strict=True):
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.bridge_ip)
            self._shape(ns)
        if self.ssh:
            self.sshd = hostbed_ssh.SshHosts(self)
            self.sshd.start()

    def _shape(self, ns: str) -> None:
        """The delay and rate of the host's outgoing traffic (on its side of the link): netem;
        where the kernel has no netem, a rate alone with tbf (a 1 ms burst, at least 16 KB)."""
        if self.delay_ms is None and self.rate is None:
            return
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root"]
        if not netem_missing():
            tc.append("netem")
            if self.delay_ms is not None:
                tc += ["delay", f"{self.delay_ms}ms"]
            if self.rate is not None:
                tc += ["rate", self.rate]
        elif self.rate is not None:
            burst = max(int(rate_bytes(self.rate) / 1000), 16384)
            tc += ["tbf", "rate", self.rate, "burst", str(burst), "latency", "50ms"]
        else:
            return   # delay 0 without netem: nothing to do
        done = subprocess.run(tc, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(tc[4:])}: {done.stderr.strip()}")

    def down(self) -> None:
        """Stop the cluster, kill every process on the hosts, remove namespaces and links."""
        if self.profile_dir:
            self._stop_cluster()
        for ns in self.namespaces:
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
        if self.sshd is not None:
            self.sshd.stop()
        for name in [*self.links, self.bridge]:
            _ip("link", "del", name, check=False)
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        try:
            os.remove(os.path.join(KEEP_DIR, f"{self.owner}.json"))
        except OSError:
            pass

    def partition(self, i: int) -> None:
        """Take host ``i``'s link down (0-based): it keeps running but reaches no one."""
        _ip("link", "set", self.links[i], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.links[i], "up")

    def on_host(self, i: int, argv: list[str]) -> list[str]:
        """The command line that runs ``argv`` on host ``i`` (0-based)."""
        enter = ["ip", "netns", "exec", self.namespaces[i]]
        if i in self.shared:
            return [*enter, *argv]
        return [*enter, "unshare", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
                "sh", "-c", f'hostname {self.hostnames[i]} && "$@"', "sh", *argv]

    def processes_on(self, i: int) -> list[int]:
        """Pids of the processes running on host ``i``."""
        return [int(p) for p in _ip("netns", "pids", self.namespaces[i]).stdout.split()]

    # -- an ipyparallel cluster with engines on the hosts ----------------------------------
    def start_cluster(self, engines: int | None = None, env: dict | None = None,
                      early_shutdown: float = EARLY_SHUTDOWN_S) -> str:
        """``ipcluster start``: controller on the bridge address, one engine on each of the
        first ``engines`` hosts, started by ipyparallel's SSH launcher on a bed with sshd
        (``ssh=True``), else by an engine command that enters a free host. Returns the profile
        directory."""
        engines = self.n if engines is None else engines
        self.profile_dir = profile = os.path.join(self.workdir, "profile")
        os.makedirs(profile, exist_ok=True)
        with open(os.path.join(profile, "ipcontroller_config.py"), "w") as f:
            f.write(f"c.IPController.ip = {self.bridge_ip!r}\n"
                    # the hub admits engines at its heartbeat (3 s by default)
                    "c.HeartMonitor.period = 500\nc.HeartMonitor.max_heartmonitor_misses = 20\n")
        if self.sshd is not None:
            config = self.sshd.ipcluster_config(
                {alias: 1 for alias in self.sshd.aliases[:engines]},
                {"PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
        else:
            config = (f"c.EngineLauncher.engine_cmd = [{self._write_engine_wrapper()!r}]\n"
                      "c.LocalEngineSetLauncher.delay = 0.1\n")
        with open(os.path.join(profile, "ipcluster_config.py"), "w") as f:
            f.write(config + f"c.IPClusterEngines.early_shutdown = {early_shutdown}\n")
        self.early_shutdown = early_shutdown
        # Engines over ssh: `--daemonize`, as users start such clusters; ipcluster exits once
        # they run. A foreground ipcluster would also watch them and race the kernel (which
        # restarts them) for each stopped engine's output file on its host.
        daemonize = ["--daemonize"] if self.sshd is not None else []
        if not daemonize:
            # In the foreground, as this process's child: ipcluster then reaps the engine
            # processes it stops at once (an orphan waits for the machine's init, which may
            # be slow). Engine launchers orphaned by another process (a kernel
            # that restarted engines, then exited) come to this one and are reaped too.
            self._reap_orphaned_launchers()
        log = open(os.path.join(self.workdir, "ipcluster.log"), "ab")
        self.cluster_started = time.time()
        self.ipcluster_process = subprocess.Popen(
            [sys.executable, "-m", "ipyparallel.cluster", "start", f"--n={engines}",
             f"--profile-dir={profile}", *daemonize], env=self._env(env), stdout=log,
            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        cluster_file = os.path.join(profile, "security", "cluster-.json")
        wait_s = 60 + (60 if daemonize else 30) * engines   # each over several ssh commands
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.ipcluster_process.poll() not in (None, *([0] if daemonize else [])):
                raise RuntimeError(f"ipcluster start failed: {self.ipcluster_log(2000)}")
            try:
                with open(cluster_file) as f:
                    if (json.load(f).get("engines") or {}).get("sets"):
                        return profile
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError("ipcluster start wrote no cluster file with engines within "
                           f"{wait_s} s: {self.ipcluster_log(2000)}")

    def ipcluster_log(self, tail: int = 3000) -> str:
        try:
            with open(os.path.join(self.workdir, "ipcluster.log")) as f:
                return f.read()[-tail:]
        except OSError as err:
            return str(err)

    def _reap_orphaned_launchers(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return
        self._reaping = threading.Event()
        state = os.path.join(self.workdir, "engines.json")

        def reap() -> None:
            while not self._reaping.wait(0.1):
                try:
                    with open(state) as f:
                        pids = list(json.load(f).values())
                except (OSError, ValueError):
                    continue
                for pid in pids:
                    try:   # only our own orphaned launchers: never a subprocess' child
                        with open(f"/proc/{pid}/stat") as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                        if fields[0] == "Z" and int(fields[1]) == os.getpid():
                            os.waitpid(pid, os.WNOHANG)
                    except (OSError, ValueError):
                        pass

        threading.Thread(target=reap, name="hostbed-reaper", daemon=True).start()

    def _env(self, env: dict | None = None) -> dict:
        return dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))

    def ipcluster(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ipyparallel.cluster", *args,
                               f"--profile-dir={self.profile_dir}"], env=self._env(env),
                              capture_output=True, text=True, timeout=90)

    def _write_engine_wrapper(self) -> str:
        """An engine command that takes a host with no engine. It stays the parent of what
        runs on the host, so that ipcluster's signals reach the engine: SIGTERM is passed on
        (``unshare --fork`` ignores it), then the host's processes are killed half a second later
        (an engine blocked in TensorFlow does not run its SIGTERM handler)."""
        hosts = [self.on_host(i, [sys.executable, "-m", "ipyparallel.engine"])
                 for i in range(self.n)]
        path = os.path.join(self.workdir, ENGINE_WRAPPER)
        state = os.path.join(self.workdir, "engines.json")
        with open(path, "w") as f:
            f.write(f"""#!{sys.executable}
import fcntl, json, os, signal, subprocess, sys, time
import psutil
HOSTS = {hosts!r}
STATE = {state!r}
def alive(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
deadline = time.monotonic() + 20
while True:
    with open(STATE + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = json.load(open(STATE)) if os.path.exists(STATE) else {{}}
        free = [i for i in range(len(HOSTS)) if not alive(taken.get(str(i), -1))]
        if free:
            taken[str(free[0])] = os.getpid()
            json.dump(taken, open(STATE, "w"))
            argv = HOSTS[free[0]] + sys.argv[1:]
            break
    if time.monotonic() > deadline:
        sys.exit("no host without an engine")
    time.sleep(0.2)
child = subprocess.Popen(argv)
def engine():
    top = psutil.Process(child.pid)
    if top.name() != "unshare":
        return [top]
    return [g for c in top.children() for g in c.children()]
def forward(sig, frame):
    for p in engine():
        p.send_signal(sig)
    if sig == signal.SIGTERM:
        try:
            child.wait(0.5)
        except subprocess.TimeoutExpired:
            child.kill()
signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
sys.exit(child.wait())
""")
        os.chmod(path, 0o755)
        return path

    def _stop_cluster(self) -> None:
        try:
            self.ipcluster("stop")
        except (subprocess.TimeoutExpired, OSError):
            pass
        if self._reaping is not None:
            self._reaping.set()
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        if self.ipcluster_process is not None:
            self.ipcluster_process.terminate()
            try:
                self.ipcluster_process.wait(10)
            except subprocess.TimeoutExpired:
                self.ipcluster_process.kill()
                self.ipcluster_process.wait()
        for name in os.listdir(os.path.join(self.profile_dir, "security")) \
                if os.path.isdir(os.path.join(self.profile_dir, "security")) else []:
            if name.startswith("cluster-") and name.endswith(".json"):
                with open(os.path.join(self.profile_dir, "security", name)) as f:
                    pid = (json.load(f).get("controller") or {}).get("state", {}).get("pid")
                if pid and _alive(pid):
                    os.kill(pid, signal.SIGKILL)

    def describe(self) -> dict:
        return {"owner": self.owner, "n": self.n, "bridge": self.bridge,
                "bridge_ip": self.bridge_ip, "namespaces": self.namespaces, "ips": self.ips,
                "hostnames": self.hostnames, "links": self.links, "workdir": self.workdir,
                "profile_dir": self.profile_dir, "shared": self.shared}


def _main(argv: list[str]) -> int:
    """``up N [--delay MS] [--rate RATE] [--shared I ...] [--ssh]`` or ``down``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 tests/hostbed.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start N hosts and an ipyparallel cluster on them")
    up.add_argument("n", type=int)
    up.add_argument("--delay", type=float, help="netem delay on each host's link, ms")
    up.add_argument("--rate", help="rate of each host's link, e.g. 1gbit (netem, else tbf)")
    up.add_argument("--shared", type=int, nargs="*", default=[], metavar="I",
                    help="hosts (1-based) that keep this machine's hostname and PID space")
    up.add_argument("--ssh", action="store_true",
                    help="run sshd on every host; ipcluster starts the engines over ssh "
                         "(ipyparallel's SSHEngineSetLauncher)")
    sub.add_parser("down", help="remove every bed started by hand")
    args = parser.parse_args(argv)
    reason = skip_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    os.makedirs(KEEP_DIR, exist_ok=True)
    if args.command == "down":
        for name in os.listdir(KEEP_DIR):
            with open(os.path.join(KEEP_DIR, name)) as f:
                d = json.load(f)
            bed = HostBed(d["n"], owner=d["owner"], shared=tuple(d["shared"]))
            bed.workdir, bed.profile_dir = d["workdir"], d["profile_dir"]
            bed.down()
            print(f"removed the bed of {d['n']} hosts on {d['bridge_ip']}/24")
        return 0
    if args.ssh and hostbed_ssh.skip_reason():
        print(hostbed_ssh.skip_reason(), file=sys.stderr)
        return 1
    bed = HostBed(args.n, delay_ms=args.delay, rate=args.rate,
                  shared=tuple(i - 1 for i in args.shared), ssh=args.ssh)
    with open(os.path.join(KEEP_DIR, f"{bed.owner}.json"), "w") as f:
        json.dump(bed.describe(), f)   # first, so that a failing `up` is still found by `down`
    try:
        bed.up()
        bed.start_cluster()
    except BaseException:
        bed.down()
        raise
    with open(os.path.join(KEEP_DIR, f"{bed.owner}.json"), "w") as f:
        json.dump(bed.describe(), f)
    print(f"{args.n} hosts {', '.join(bed.hostnames)} at {', '.join(bed.ips)}; kernel side "
          f"{bed.bridge_ip}.\nIn a notebook on this machine:\n"
          f"  %distribute multiworker --cluster {bed.profile_dir}\n"
          + (f"A shell on host1: ssh -F {bed.sshd.ssh_config} host1\n"
             f"The profile's engines: {os.path.join(bed.profile_dir, 'ipcluster_config.py')}\n"
             if bed.sshd else f"A shell on host1: {shlex.join(bed.on_host(0, ['bash']))}\n") +
          "Remove it all: python3 tests/hostbed.py down")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
