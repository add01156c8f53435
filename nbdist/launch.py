"""``python -m nbdist.launch --workers N train.py [args]``: run a script as a local job.

Starts N processes of ``train.py``, each with its own TF_CONFIG on free 127.0.0.1 ports (as a
Slurm or Kubernetes job gives each of its processes; see docs/guide/export-and-launch.md), in one
process group.
Their output lines are prefixed with ``[worker i]``. When one fails, or on Ctrl-C, all are
stopped; the exit code is non-zero if any failed. With ``--ps M`` the job is a
parameter-server one: a chief (the coordinator), N workers and M parameter servers, which
serve until the chief is done.

A script ``%distribute export`` wrote says which of its strategies make one job of several
processes (``MULTI_PROCESS``) and its default (``DEFAULT_STRATEGY``): a launch that would run
it as N separate single-machine trainings (``mirrored``, say, which ignores TF_CONFIG), or
mismatch ``--ps`` and the strategy, is refused before anything starts, with the command that
runs one job.
"""

from __future__ import annotations

import argparse
import ast
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

_GRACE_S = 5.0


@dataclass
class Task:
    kind: str        # "worker", "chief" or "ps"
    index: int
    process: Any = None

    @property
    def label(self) -> str:
        return "chief" if self.kind == "chief" else f"{self.kind} {self.index}"


def free_ports(n: int) -> list[int]:
    """n ports nothing listens on now (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cluster_spec(workers: int, ps: int) -> tuple[dict[str, list[str]], list[Task]]:
    """The TF_CONFIG cluster and its tasks: N workers, or a chief, N workers and M ps."""
    kinds = [("chief", 1)] if ps else []
    kinds += [("worker", workers)] + ([("ps", ps)] if ps else [])
    ports = iter(free_ports(sum(n for _, n in kinds)))
    cluster = {kind: [f"127.0.0.1:{next(ports)}" for _ in range(n)] for kind, n in kinds}
    tasks = [Task(kind, i) for kind, n in kinds for i in range(n)]
    return cluster, tasks


def _forward(task: Task, stream: Any) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.write(f"[{task.label}] {line.decode(errors='replace')}")
        sys.stdout.flush()


def _stop_group(pgid: int) -> None:
    """SIGTERM the job's process group, SIGKILL what is left after a grace period."""
    for sig, wait in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def launch(script: str, args: list[str], workers: int, ps: int = 0) -> int:
    """Run the job; return its exit code (0 when every task that must finish did)."""
    cluster, tasks = cluster_spec(workers, ps)
    must_finish = [t for t in tasks if t.kind != "ps" and (not ps or t.kind == "chief")]
    pgid = 0
    threads = []
    try:
        for task in tasks:
            env = {**os.environ, "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": task.kind, "index": task.index}})}
            task.process = subprocess.Popen(
                [sys.executable, "-u", script, *args], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=functools.partial(os.setpgid, 0, pgid))   # one group: one kill
            pgid = pgid or task.process.pid
            thread = threading.Thread(target=_forward, args=(task, task.process.stdout),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        return _wait(tasks, must_finish)
    except KeyboardInterrupt:
        print("nbdist.launch: interrupted; stopping every process of the job", file=sys.stderr)
        return 130
    finally:
        if pgid:
            _stop_group(pgid)
        for thread in threads:
            thread.join(timeout=2)


def _wait(tasks: list[Task], must_finish: list[Task]) -> int:
    while True:
        for task in tasks:
            code = task.process.poll()
            if code not in (None, 0):
                print(f"nbdist.launch: {task.label} (pid {task.process.pid}) exited with "
                      f"{code}; stopping the others", file=sys.stderr)
                return code if code > 0 else 128 - code
        if all(t.process.poll() == 0 for t in must_finish):
            return 0
        time.sleep(0.1)


def exported_strategies(script: str) -> dict[str, Any] | None:
    """What a script ``%distribute export`` wrote says about its strategies: its default
    (``DEFAULT_STRATEGY``), those that make one job of several processes (``MULTI_PROCESS``)
    and those a coordinator drives (``COORDINATED``); None for any other script."""
    wanted = {"DEFAULT_STRATEGY", "MULTI_PROCESS", "COORDINATED"}
    try:
        with open(script, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and node.targets[0].id in wanted:
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                return None
    return found if found.keys() == wanted else None


def _strategy_flag(args: list[str]) -> tuple[str | None, list[str]]:
    """The script's ``--strategy`` among its arguments (argparse's forms: ``--strategy X``,
    ``--strategy=X``, an unambiguous prefix such as ``--str``), or None; and the others."""
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if len(flag) >= 5 and "--strategy".startswith(flag):
            if eq:
                return value, args[:i] + args[i + 1:]
            return (args[i + 1] if i + 1 < len(args) else None), args[:i] + args[i + 2:]
    return None, args


def job_problem(script: str, args: list[str], workers: int, ps: int) -> str | None:
    """Why this launch would not train one job with an exported script, with the flags that
    make it one; None when it does (or the script is not one nbdist exported)."""
    exported = exported_strategies(script)
    if exported is None or (workers == 1 and not ps):
        return None
    given, rest = _strategy_flag(args)
    strategy = given or exported["DEFAULT_STRATEGY"]
    which = (f"--strategy {strategy}" if given else
             f"`{strategy}`, the strategy the script was exported with,")
    flags = f"--workers {workers}" + (f" --ps {ps}" if ps else "")
    coordinated = [s for s in exported["MULTI_PROCESS"] if s in exported["COORDINATED"]]
    synchronous = [s for s in exported["MULTI_PROCESS"] if s not in exported["COORDINATED"]]
    again = f"python -m nbdist.launch {flags} {script} --strategy {{}}" + \
        "".join(f" {shlex.quote(a)}" for a in rest)
    if strategy not in exported["MULTI_PROCESS"]:
        fix = (coordinated if ps else synchronous)[:1] or exported["MULTI_PROCESS"][:1]
        if not fix:
            return None
        return (f"{script} under {which} would train {workers + (ps + 1 if ps else 0)} "
                f"separate single-machine runs, one per process, not one job of {workers} "
                f"workers: that strategy ignores TF_CONFIG. Add --strategy {fix[0]} after the "
                f"script: {again.format(fix[0])}")
    if strategy in exported["COORDINATED"] and not ps:
        return (f"{script} under --strategy {strategy} needs parameter servers and a chief "
                f"that coordinates: add --ps 1 before the script: python -m nbdist.launch "
                f"--workers {workers} --ps 1 {script} " + shlex.join(args))
    if ps and strategy not in exported["COORDINATED"] and coordinated:
        return (f"--ps {ps} starts parameter servers and a chief, which only --strategy "
                f"{coordinated[0]} uses, but {script} would run {which}. Add --strategy "
                f"{coordinated[0]} after the script ({again.format(coordinated[0])}), or "
                "drop --ps.")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nbdist.launch", description=__doc__.split("\n\n")[0],
        epilog="Example: python -m nbdist.launch --workers 2 train.py --strategy multiworker")
    parser.add_argument("--workers", type=int, default=2, metavar="N",
                        help="worker processes (default: 2)")
    parser.add_argument("--ps", type=int, default=0, metavar="M",
                        help="parameter servers; adds a chief that coordinates (default: 0)")
    parser.add_argument("script", help="the Python script every process runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    if options.workers < 1 or options.ps < 0:
        parser.error("--workers must be at least 1 and --ps at least 0")
    if not os.path.isfile(options.script):
        parser.error(f"{options.script}: no such file")
    problem = job_problem(options.script, options.args, options.workers, options.ps)
    if problem:
        parser.error(problem)
    return launch(options.script, options.args, options.workers, options.ps)


if __name__ == "__main__":
    sys.exit(main())
