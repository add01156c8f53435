"""An sshd on every host of a bed (tests/hostbed.py), and an ipyparallel profile whose engines
ipyparallel's own SSH launcher starts there: ``SSHEngineSetLauncher``, as a user with several
machines would configure it.

Each host gets what a real machine has: its own ``/run`` (sshd's privilege-separation
directory, its host key and authorized keys live there) and its own ``/tmp`` (so the profile
ipyparallel creates on the host and the connection file it copies there with ``scp`` are the
host's own, not the kernel's). Python, nbdist and the rest of the file system are shared, as
on machines with a common software installation (a checkout or Python under ``/tmp`` is bound
back into the host's ``/tmp``). Keys are throwaway ones made per bed in its
work directory; nothing of this machine's ssh set-up (``/etc/ssh``, ``~/.ssh``, a system
sshd) is read or changed: the client uses the bed's ``ssh_config`` (``ssh -F``) with the bed's
``known_hosts``, so host keys are checked, not ignored.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SSHD = "/usr/sbin/sshd"   # sshd re-executes itself, so it must be started by absolute path
#: Where each host keeps its sshd files (in its own /run).
HOST_SSH_DIR = "/run/nbdist-ssh"


def skip_reason() -> str | None:
    """Why the bed cannot run sshd on its hosts, or None."""
    missing = [p for p in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen"),
                           shutil.which("scp")) if not p or not os.access(p, os.X_OK)]
    if missing:
        return ("the SSH host bed needs OpenSSH's sshd, ssh, scp and ssh-keygen "
                "(`apt-get install openssh-server openssh-client`)")
    return None


def _keygen(path: str, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                   check=True, capture_output=True, timeout=30)
    with open(path + ".pub") as f:
        return f.read().strip()


class SshHosts:
    """Keys, configurations and the sshd processes of a bed's hosts (``bed``: a HostBed that
    is up). ``ssh_config`` is the client configuration naming the hosts ``host1``..``hostN``."""

    def __init__(self, bed):
        self.bed = bed
        self.dir = os.path.join(bed.workdir, "ssh")
        self.ssh_config = os.path.join(self.dir, "ssh_config")
        self.aliases = [f"host{i + 1}" for i in range(bed.n)]
        self.processes: list[subprocess.Popen] = []

    def start(self, timeout: float = 30.0) -> None:
        os.makedirs(self.dir, mode=0o700)
        client_key = os.path.join(self.dir, "id_ed25519")
        authorized = _keygen(client_key, f"nbdist-hostbed-{self.bed.owner}")
        known = []
        for i, (alias, ip) in enumerate(zip(self.aliases, self.bed.ips, strict=True)):
            host_dir = os.path.join(self.dir, alias)
            os.makedirs(host_dir, mode=0o700)
            known.append(f"{ip} {_keygen(os.path.join(host_dir, 'host_key'), alias)}")
            with open(os.path.join(host_dir, "authorized_keys"), "w") as f:
                f.write(authorized + "\n")
            with open(os.path.join(host_dir, "sshd_config"), "w") as f:
                f.write(self._sshd_config(ip))
            self.processes.append(self._start_sshd(i, host_dir))
        with open(os.path.join(self.dir, "known_hosts"), "w") as f:
            f.write("\n".join(known) + "\n")
        with open(self.ssh_config, "w") as f:
            f.write(self._client_config(client_key))
        for alias, process in zip(self.aliases, self.processes, strict=True):
            self._wait_for_login(alias, process, timeout)

    @staticmethod
    def _sshd_config(ip: str) -> str:
        return "\n".join([
            f"ListenAddress {ip}", "Port 22",
            f"HostKey {HOST_SSH_DIR}/host_key",
            f"AuthorizedKeysFile {HOST_SSH_DIR}/authorized_keys",
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "StrictModes no", "UseDNS no", "PrintMotd no", "PidFile none",
            # scp speaks SFTP since OpenSSH 9
            "Subsystem sftp internal-sftp", "LogLevel ERROR", ""])

    def _client_config(self, key: str) -> str:
        hosts = [f"Host {alias}\n  HostName {ip}\n"
                 for alias, ip in zip(self.aliases, self.bed.ips, strict=True)]
        return "".join(hosts) + (
            f"Host *\n  User root\n  IdentityFile {key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {os.path.join(self.dir, 'known_hosts')}\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n"
            "  LogLevel ERROR\n")

    def _start_sshd(self, i: int, host_dir: str) -> subprocess.Popen:
        """sshd on host ``i`` with its own /run (its files copied there) and its own /tmp."""
        # Software stays shared: a checkout (or Python) under /tmp, as in CI on a fresh clone,
        # is bound back into the host's own /tmp (engines import nbdist from it).
        shared = [path for path in {_REPO, sys.prefix} if path.startswith("/tmp/")]
        keep = "".join(f"mkdir -p /run/nbdist-keep/{n} && mount --bind {shlex.quote(p)} "
                       f"/run/nbdist-keep/{n} && " for n, p in enumerate(shared))
        back = "".join(f"mkdir -p {shlex.quote(p)} && mount --bind /run/nbdist-keep/{n} "
                       f"{shlex.quote(p)} && " for n, p in enumerate(shared))
        script = (
            "mount -t tmpfs -o mode=755 nbdist-run /run && mkdir -p /run/sshd "
            f"{HOST_SSH_DIR} && cp {shlex.quote(host_dir)}/* {HOST_SSH_DIR}/ && {keep}"
            f"mount -t tmpfs -o mode=1777 nbdist-tmp /tmp && {back}"
            f"exec {SSHD} -D -e -f {HOST_SSH_DIR}/sshd_config")
        log = open(os.path.join(host_dir, "sshd.log"), "ab")
        try:
            return subprocess.Popen(self.bed.on_host(i, ["sh", "-c", script]), stdout=log,
                                    stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def _wait_for_login(self, alias: str, process: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = self.ssh(alias, "true", check=False, timeout=10)
            if done.returncode == 0:
                return
            if process.poll() is not None or time.monotonic() > deadline:
                log = os.path.join(self.dir, alias, "sshd.log")
                with open(log) as f:
                    raise RuntimeError(f"sshd on {alias} does not let the bed's key in: "
                                       f"{done.stderr.strip()}; sshd: {f.read()[-1500:]}")
            time.sleep(0.2)

    def ssh(self, alias: str, command: str, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a shell ``command`` on host ``alias`` over ssh."""
        return subprocess.run(["ssh", "-F", self.ssh_config, alias, command], check=check,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        """Reap the sshd processes (the bed kills every process on its hosts)."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        self.processes = []

    def ipcluster_config(self, engines: dict[str, int], environment: dict[str, str]) -> str:
        """The ``ipcluster_config.py`` a user writes for engines on several machines."""
        return (
            "c.Cluster.engine_launcher_class = 'ssh'\n"
            f"c.SSHEngineSetLauncher.engines = {engines!r}\n"
            f"c.SSHLauncher.ssh_args = ['-F', {self.ssh_config!r}]\n"
            f"c.SSHLauncher.scp_args = ['-F', {self.ssh_config!r}]\n"
            f"c.SSHLauncher.remote_python = {sys.executable!r}\n"
            f"c.SSHLauncher.environment = {environment!r}\n")
