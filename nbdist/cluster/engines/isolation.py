"""A private network namespace for the engines of a local cluster, so that no other host can
reach the TensorFlow gRPC servers they run.

TensorFlow binds its servers to every interface whatever host ``TF_CONFIG`` names, and they
run whatever graph they are sent. Inside a network namespace of their own, with only a
loopback interface, "every interface" is that loopback: the servers reach each other and
nothing outside does. The engines still reach the controller and the telemetry channel,
which listen on Unix sockets (files cross namespaces; ports do not).

``Namespace.open`` starts one small holder process in a new network namespace (as root:
``unshare --net``; as another user: ``unshare --map-root-user --net``, a user namespace of
one's own, where the kernel allows them); engines join it with ``nsenter``. The holder ends
when the kernel does (its stdin is a pipe from the kernel), and the namespace with it.

Set ``NBDIST_ISOLATION=0`` to run local engines in the kernel's own network namespace
instead (the start then says which ports are open to the network). A parameter-server
cluster is isolated only with ``NBDIST_ISOLATION=1`` (and as root): see ``LINKED_ON_REQUEST``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

#: Environment variable that turns isolation off ("0") for local clusters.
ENV = "NBDIST_ISOLATION"

_CLONE_NEWNET = 0x40000000   # sched.h

#: Isolation unless ``ENV`` says otherwise.
DEFAULT = "1"

#: Why a parameter-server cluster is not isolated unless ``ENV`` is 1: its tasks' namespace is
#: linked to the kernel (the coordinator), and its fault handling (a parameter server's death,
#: a stopped worker, the controller's death) is not yet checked through that link.
LINKED_ON_REQUEST = (f"{ENV} is not 1: under parameter_server nbdist isolates the tasks only "
                     "on request, as root")

#: Seconds the holder may take to create the namespace and bring its loopback up.
OPEN_TIMEOUT_S = 10.0

# Run in the new namespace: bring its loopback interface up (it starts down), say so, then
# wait for the kernel's end of the pipe to close. Standard library only: starts in ~30 ms.
_HOLDER = """
import fcntl, socket, struct, sys
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    req = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
print("ready", flush=True)
sys.stdin.read()
"""


class IsolationUnavailable(Exception):
    """This machine (or this user) cannot create a private network namespace."""


@dataclass
class Namespace:
    """A network namespace held open by ``holder``: its loopback interface, and with
    ``link`` a veth pair to this namespace whose far end has ``address``."""

    holder: subprocess.Popen[str]
    user: bool   # a user namespace too (not root): joining it needs --user
    address: str = "127.0.0.1"   # where this namespace reaches the engines' servers
    link: str | None = None      # this namespace's end of the veth pair

    @classmethod
    def open(cls, linked: bool = False) -> Namespace:
        """A new namespace (``linked``: that this one reaches over TCP); raises
        ``IsolationUnavailable`` with the reason."""
        if os.environ.get(ENV, DEFAULT) == "0":
            raise IsolationUnavailable(f"{ENV} is 0")
        if linked and os.environ.get(ENV) != "1":
            raise IsolationUnavailable(LINKED_ON_REQUEST)
        if linked and os.geteuid() != 0:
            raise IsolationUnavailable(
                "this kernel coordinates the tasks over TCP, and only root can link their "
                "private network namespace to the kernel's")
        if linked and shutil.which("ip") is None:
            raise IsolationUnavailable("ip (iproute2) not found: it links the tasks' network "
                                       "namespace to the kernel's")
        missing = [tool for tool in ("unshare", "nsenter") if shutil.which(tool) is None]
        if missing:
            raise IsolationUnavailable(f"{' and '.join(missing)} (util-linux) not found")
        user = os.geteuid() != 0
        command = ["unshare", *(["--map-root-user"] if user else []), "--net", "--",
                   sys.executable, "-I", "-c", _HOLDER]
        holder = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert holder.stdout is not None
        try:
            ready = holder.stdout.readline().strip() == "ready"
            if not ready:
                holder.wait(OPEN_TIMEOUT_S)
        except BaseException:
            holder.kill()
            raise
        if not ready:
            err = holder.stderr.read().strip() if holder.stderr else ""
            holder.kill()
            raise IsolationUnavailable(err.splitlines()[-1] if err else
                                       f"unshare exited with {holder.returncode}")
        namespace = cls(holder, user)
        if linked:
            try:
                namespace._link()
            except BaseException:
                namespace.close()
                raise
        return namespace

    def _link(self) -> None:
        """A veth pair on a random link-local /30 (169.254.0.0/16, which routers never
        forward). The namespace gets no default route: it answers its peer only."""
        taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        for _ in range(20):
            a, b = random.randint(1, 254), random.randrange(0, 256, 4)
            if a != 169 and f"169.254.{a}.{b + 1}/" not in taken:
                break
        name = f"nbd{self.holder.pid}"
        steps = [["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0",
                  "netns", str(self.holder.pid)],
                 ["ip", "addr", "add", f"169.254.{a}.{b + 1}/30", "dev", name],
                 ["ip", "link", "set", name, "up"],
                 self.command(["ip", "addr", "add", f"169.254.{a}.{b + 2}/30", "dev", "eth0"]),
                 self.command(["ip", "link", "set", "eth0", "up"])]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if step is steps[0]:
                self.link = name
            if done.returncode:
                raise IsolationUnavailable(f"`{' '.join(step)}` failed: {done.stderr.strip()}")
        self.address = f"169.254.{a}.{b + 2}"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace."""
        return ["nsenter", f"--target={self.holder.pid}", "--net",
                *(["--user", "--preserve-credentials"] if self.user else []), "--", *argv]

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run the block's thread in this namespace (a thread's own network namespace, see
        setns(2)): sockets it opens listen there, out of other hosts' reach, and the engines
        reach them on its loopback. Threads it starts stay in it. Root only (``linked``)."""
        libc = ctypes.CDLL(None, use_errno=True)
        with open("/proc/thread-self/ns/net") as home, \
                open(f"/proc/{self.holder.pid}/ns/net") as there:
            if libc.setns(there.fileno(), _CLONE_NEWNET):
                raise OSError(ctypes.get_errno(), "setns into the engines' network namespace")
            try:
                yield
            finally:
                if libc.setns(home.fileno(), _CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), "setns back into the kernel's network "
                                  "namespace")

    def close(self) -> None:
        """End the holder: the namespace goes once no engine is left in it (and the veth
        pair with it; it is deleted here at once)."""
        if self.link is not None:
            subprocess.run(["ip", "link", "del", self.link], capture_output=True)
            self.link = None
        with contextlib.suppress(OSError, ValueError):
            if self.holder.stdin is not None:
                self.holder.stdin.close()
        try:
            self.holder.wait(2)
        except subprocess.TimeoutExpired:
            self.holder.kill()
            self.holder.wait()
        for stream in (self.holder.stdout, self.holder.stderr):
            if stream is not None:
                stream.close()


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("/")


def network_of(pid: int) -> str | None:
    """The network namespace of process ``pid`` (None: gone, or not ours to read)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def listening(processes: list[Any]) -> set[tuple[int, int]]:
    """(pid, port) of the TCP sockets ``processes`` (psutil) listen on in this process's
    network namespace, on an address other hosts can reach (not loopback)."""
    here = network_of(os.getpid())
    found = set()
    for proc in processes:
        try:
            if network_of(proc.pid) != here:
                continue
            for conn in proc.net_connections("tcp"):
                if conn.status == "LISTEN" and not _loopback(conn.laddr.ip):
                    found.add((proc.pid, conn.laddr.port))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def how_to_close(reason: str) -> str:
    """The one command or setting that lets nbdist isolate local clusters here."""
    if reason == LINKED_ON_REQUEST:
        return (f"set {ENV}=1 in the kernel's environment (as root) and run the `%distribute` "
                "line again")
    if reason.startswith(ENV):
        return f"unset {ENV} (or set it to 1) and run the `%distribute` line again"
    for path, value, setting in _SYSCTLS:
        try:
            with open(path) as f:
                if f.read().strip() == value:
                    return (f"allow unprivileged user namespaces (`sudo sysctl -w {setting}`), "
                            "then run the `%distribute` line again")
        except OSError:
            continue
    return ("block them from other hosts with a firewall (see the security guide), or run "
            "JupyterLab in a container or VM without a public network")


# The settings distributions use to turn unprivileged user namespaces off: (file, the value
# that means off, the sysctl that turns them on).
_SYSCTLS = [
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "kernel.apparmor_restrict_unprivileged_userns=0"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone=1"),
    ("/proc/sys/user/max_user_namespaces", "0", "user.max_user_namespaces=15000"),
]


def exposure_line(ports: list[int], reason: str | None) -> str:
    """What the user must know about ``ports`` open to the network (why: ``reason``)."""
    why = f"nbdist could not isolate them ({reason})" if reason else "they were opened anyway"
    return (f"nbdist: ports {', '.join(map(str, sorted(set(ports))))} of this machine are open "
            "to the network (TensorFlow gRPC servers: no authentication, they run any graph "
            f"they are sent, so whoever reaches them can run code as you); {why}. To close "
            f"them: {how_to_close(reason or '')}.")
