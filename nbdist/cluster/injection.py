"""``%distribute inject FAULT WORKER``: real faults on purpose, for tests, tutorials and
drills; the kernel's half (checks, the log ``%distribute status`` shows). The kinds of fault,
and what each takes, are ``protocol.FAULT_KINDS``; the worker's half is ``inengine.faults``.

The kinds that change a link (``partition`` takes the worker's network link down, a pulled
cable: the process runs on and reaches no one) are the kernel's to apply, and only where
nbdist can cut one worker off (``engines.links``: a ``--cluster`` engine in a network
namespace of its own on this machine, as on the hosts of tests/hostbed.py); refused, saying
why, elsewhere. The link comes back up with ``heal WORKER``, and at ``%distribute stop`` /
``restart``.

``--at-step N``: once the worker has done N steps of its run (for a link the worker says
when, and the kernel cuts); without it, at once.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import ConfigError
from . import protocol
from .engines.base import EngineSet
from .failures import ClusterError
from .protocol import FAULT_KINDS, fault_help, fault_usage

NO_PARTITION = (
    "`%distribute inject partition` cuts one worker's network link, which needs each worker "
    "in a network namespace of its own on this machine (a container, a host of the test bed "
    "in tests/hostbed.py), reached with `--cluster PROFILE`. These workers share this "
    "machine's network stack (nbdist started them here), so they cannot be cut off one by "
    "one. To take a worker away use `kill` (it dies) or `stop` (it freezes)."
)


def check(fault: str | None, worker: str | None, workers: int, at_step: int | None,
          delay: float | None) -> tuple[str, int, float | None]:
    """Validate an inject line; return (fault, worker index, delay). Raises ConfigError."""
    usage = f"`%distribute inject {fault_usage()}`"
    kind = FAULT_KINDS.get(fault or "")
    if kind is None:
        raise ConfigError(f"inject: {fault!r} is not a fault; use {usage}, e.g. "
                          f"`%distribute inject kill 1 --at-step 20`. The faults:\n"
                          f"{fault_help()}")
    if worker is None or not worker.isdigit() or not 0 <= int(worker) < workers:
        raise ConfigError(f"inject {fault}: give the worker, 0..{workers - 1} (got "
                          f"{worker!r}): {usage}.")
    if at_step is not None and at_step < 0:
        raise ConfigError(f"--at-step {at_step}: give the number of steps after which the "
                          "fault happens (0 or more), or drop it for at once.")
    if delay is not None and kind.delay is None:
        delayed = " or ".join(f"`{k.name}`" for k in FAULT_KINDS.values()
                              if k.delay is not None)
        raise ConfigError(f"--delay is the per-step delay of {delayed}, not of `{fault}`.")
    if delay is not None and not delay >= 0:
        raise ConfigError(f"--delay {delay}: give the seconds added to every step (0 ends a "
                          "slow-down).")
    if at_step is not None and not kind.at_step:
        raise ConfigError(f"`inject {fault}` takes effect at once: drop --at-step.")
    if kind.delay is not None:
        return kind.name, int(worker), kind.delay if delay is None else delay
    return kind.name, int(worker), None


def send(send_to: Any, log: list[dict[str, Any]], fault: str, worker: int,
         at_step: int | None, delay: float | None) -> str:
    """Send a checked fault to the worker (``send_to(worker, message)``) and log it."""
    e = entry(fault, worker, at_step, delay)
    log.append(e)   # before sending: the worker's INJECTED answer finds it
    if not send_to(worker, {"type": protocol.INJECT, "fault": fault, "at_step": at_step,
                            "delay": delay}):
        log.remove(e)
        raise ClusterError(f"worker {worker} is not connected (dead?): nothing was injected.")
    return f"nbdist: {what(e)}."


def links_of(engines: EngineSet | None) -> Any:
    """The engine set's ``links.LinkControl``, or a ConfigError saying why there is none."""
    links = engines.links if engines is not None else None
    if links is None:
        raise ConfigError(NO_PARTITION)
    return links


def cut_now(links: Any, worker: int, e: dict[str, Any]) -> None:
    """Take ``worker``'s link down for the log entry ``e`` (at once, or when the worker said
    it reached ``--at-step``: then on the channel's thread, so a failure goes into ``e``)."""
    links.partition(worker)
    e["applied_step"] = -1 if e["applied_step"] is None else e["applied_step"]
    e["cut_at"] = time.monotonic()


def links_fault(engines: EngineSet | None, send_to: Any, monitor: Any, fault: str,
                worker: int, at_step: int | None) -> str:
    """A kind with a ``link`` (``partition`` / ``heal``): the kernel changes the link
    (``engines.links``); with ``--at-step`` when the worker says it got there
    (``monitor.cut_link``)."""
    links, log = links_of(engines), monitor.injections
    monitor.cut_link = lambda w, e: cut_now(links, w, e)
    if FAULT_KINDS[fault].link == "up":
        links.heal(worker)
        log.append(entry(fault, worker, None, None, applied_step=-1))
        return f"nbdist: {what(log[-1])}: its link is up again."
    links.peer(worker)   # refuses before anything is sent
    if at_step is not None:
        return send(send_to, log, fault, worker, at_step, None) + (
            " The kernel cuts the link when the worker says it got there.")
    e = entry(fault, worker, None, None)
    cut_now(links, worker, e)
    log.append(e)
    return (f"nbdist: {what(e)}: its link is down (`%distribute inject heal {worker}`, stop "
            "or restart bring it back up).")


def entry(fault: str, worker: int, at_step: int | None, delay: float | None,
          applied_step: int | None = None) -> dict[str, Any]:
    """One line of the injection log (``applied_step``: None until the worker applied it)."""
    return {"fault": fault, "worker": worker, "at_step": at_step, "delay": delay,
            "applied_step": applied_step, "time": time.strftime("%H:%M:%S")}


def what(e: dict[str, Any]) -> str:
    """'kill worker 1 at step 20', 'slow worker 0 (+0.5 s per step) at once'."""
    delay = f" (+{e['delay']:g} s per step)" if e["delay"] is not None else ""
    when = "at once" if e["at_step"] is None else f"after step {e['at_step']}"
    return f"{e['fault']} worker {e['worker']}{delay} {when}"


def status_lines(entries: list[dict[str, Any]]) -> list[str]:
    """``%distribute status``: what was injected, and whether it happened yet."""
    lines = []
    for i, e in enumerate(entries):
        done = e.get("applied_step")
        state = (f"FAILED: {e['error']}" if e.get("error") else "pending" if done is None
                 else "applied" if done < 0
                 else f"applied after step {done}" if e["at_step"] is not None
                 else f"applied (the worker had done {done} steps of its run)")
        lines.append(f"{'injected' if i == 0 else '':<10} {what(e)}, sent {e['time']}: {state}")
    return lines
