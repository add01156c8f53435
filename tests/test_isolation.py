"""Local clusters that no other host can reach: each local family is started in its own
process (tests/isolation_scenario.py) while a network namespace standing for another host on
the same network (a veth pair to this machine's namespace, a default route through it) tries
every TCP port the kernel and its children listen on, at every address of this machine.
With isolation none answers; with isolation off (``NBDIST_ISOLATION=0``) TensorFlow's ports
answer, and the start and ``%distribute status`` say which ones and how to close them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import psutil
import pytest
from hostbed import skip_reason

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILIES = ["multiworker --workers 2", "parameter_server --workers 1 --ps 1"]
START_TIMEOUT_S = 300

# Run inside the other host's namespace: which (address, port) pairs accept a connection.
PROBE = """
import json, socket, sys
targets = json.loads(sys.argv[1])
found = []
for host, port in targets:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
        found.append([host, port])
    except OSError:
        pass
print(json.dumps(found))
"""

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def other_host():
    """A network namespace linked to this one as another host of its network would be."""
    name = f"nbdhost{os.getpid()}"
    used = _ip("-4", "-o", "addr").stdout
    subnet = next(f"10.78.{k}" for k in range(20, 250) if f" 10.78.{k}." not in used)
    _ip("netns", "add", name)
    try:
        _ip("link", "add", f"{name}a", "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("addr", "add", f"{subnet}.1/24", "dev", f"{name}a")
        _ip("link", "set", f"{name}a", "up")
        for args in (["addr", "add", f"{subnet}.2/24", "dev", "eth0"],
                     ["link", "set", "eth0", "up"], ["link", "set", "lo", "up"],
                     ["route", "add", "default", "via", f"{subnet}.1"]):
            _ip("-n", name, *args)
        yield name
    finally:
        _ip("link", "del", f"{name}a", check=False)
        _ip("netns", "del", name, check=False)
    assert name not in _ip("netns", "list").stdout


def this_machine() -> list[str]:
    """Every IPv4 address of this namespace another host could aim at (not loopback)."""
    addresses = []
    for line in _ip("-4", "-o", "addr").stdout.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            addresses.append(address)
    return addresses


def answering(host_ns: str, ports: set[int]) -> list[list]:
    targets = [[address, port] for address in this_machine() for port in sorted(ports)]
    done = subprocess.run(["ip", "netns", "exec", host_ns, sys.executable, "-c", PROBE,
                           json.dumps(targets)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def start(line: str, isolation: str | None) -> tuple[subprocess.Popen, dict]:
    """``isolation``: NBDIST_ISOLATION's value (None: unset, the default)."""
    env = {k: v for k, v in os.environ.items() if k != "NBDIST_ISOLATION"}
    env["PYTHONPATH"] = os.path.dirname(HERE)
    if isolation is not None:
        env["NBDIST_ISOLATION"] = isolation
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "isolation_scenario.py"), line],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                            cwd=HERE)
    for out in proc.stdout:
        if out.startswith("READY:"):
            return proc, json.loads(out[len("READY:"):])
    proc.wait(10)
    raise AssertionError(f"`%distribute {line}` did not start (exit code {proc.returncode})")


def stop(proc: subprocess.Popen) -> dict:
    proc.stdin.write("\n")
    proc.stdin.flush()
    stopped = {}
    for out in proc.stdout:
        if out.startswith("STOPPED:"):
            stopped = json.loads(out[len("STOPPED:"):])
    proc.wait(30)
    return stopped


@pytest.mark.parametrize("line", FAMILIES)
def test_no_port_of_a_local_cluster_answers_another_host(other_host, line):
    proc, seen = start(line, "1")
    try:
        ports = {port for _, _, port in seen["listening"]}
        assert len(ports) >= 2, seen["listening"]   # TensorFlow's servers at least
        # the probe can see the machine: a port opened here for the test answers it
        with socket.create_server(("0.0.0.0", 0)) as control:
            port = control.getsockname()[1]
            reached = answering(other_host, ports | {port})
        assert [p for _, p in reached] == [port] * len(this_machine()), reached
        assert "open to the network" not in seen["started"] + seen["status"]
        assert "no port is open to other hosts" in seen["status"], seen["status"]
        assert seen["holder"] is not None
    finally:
        stopped = stop(proc)
    assert stopped["left"] == []
    assert not psutil.pid_exists(seen["holder"])
    if seen["link"]:
        assert _ip("link", "show", seen["link"], check=False).returncode != 0


@pytest.mark.parametrize("line", FAMILIES)
def test_with_isolation_off_the_start_and_status_name_the_open_ports(other_host, line):
    proc, seen = start(line, "0")
    try:
        ports = {port for _, _, port in seen["listening"]}
        reached = {port for _, port in answering(other_host, ports)}
        assert reached, "TensorFlow's servers should answer without isolation"
        said = re.search(r"nbdist: ports ([\d, ]+) of this machine are open to the network",
                         seen["started"])
        assert said, seen["started"]
        named = {int(p) for p in said.group(1).split(", ")}
        assert reached <= named <= ports, (reached, named, seen["listening"])
        assert "NBDIST_ISOLATION is 0" in seen["started"]
        assert "unset NBDIST_ISOLATION" in seen["started"]
        assert f"network    ports {said.group(1)} of this machine" in seen["status"]
        assert seen["holder"] is None
    finally:
        stopped = stop(proc)
    assert stopped["left"] == []


def test_by_default_multiworker_is_isolated_and_parameter_server_says_how(other_host):
    """Unset, NBDIST_ISOLATION isolates multiworker; a parameter-server cluster (its tasks'
    namespace linked to the kernel, isolated on request) says its ports and the setting."""
    proc, seen = start(FAMILIES[0], None)
    try:
        assert "no port is open to other hosts" in seen["status"], seen["status"]
    finally:
        assert stop(proc)["left"] == []
    proc, seen = start(FAMILIES[1], None)
    try:
        assert re.search(r"nbdist: ports [\d, ]+ of this machine are open to the network",
                         seen["started"]), seen["started"]
        assert "NBDIST_ISOLATION is not 1: under parameter_server" in seen["started"]
        assert "set NBDIST_ISOLATION=1 in the kernel's environment" in seen["started"]
    finally:
        assert stop(proc)["left"] == []

