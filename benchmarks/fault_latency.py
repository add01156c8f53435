"""Time from a fault in a worker to the cell's error, under `%distribute multiworker`.

Four faults, each injected REPEAT times into a long step-mode run (fresh workers each time);
the first three on 2 local workers, the partition on 2 simulated hosts:

* kill: `%distribute inject kill 1 --at-step 30` (SIGKILL); the fault's time is when the
  process is seen gone (psutil, every 10 ms).
* SIGSTOP: `%distribute inject stop 1 --at-step 30`; the fault's time is when the process is
  seen stopped.
* stuck input: worker 1's `from_generator` source sleeps for an hour at its 30th batch; the
  fault's time is written by the generator just before it sleeps.
* controller: the ipyparallel controller killed (SIGKILL) once the run has 30 rows; the
  fault's time is when its process is seen gone.
* partition: `%distribute inject partition I --at-step 30` for the worker on host2 of a fresh
  bed of 2 hosts (tests/hostbed.py; skipped with the reason without root); the fault's time
  is when the kernel took the link down.

For each: the median, min and max of fault -> error, and for the two found by the stall rule
(SIGSTOP, stuck) the same less the stall limit the error states, i.e. detection -> error
(the spec: <= 10 s); and what `%distribute restart` took each time before the next fault
(then the setup cell), with the machine's load average.

    python benchmarks/fault_latency.py [--repeat 5] [--only partition]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import cluster_cells  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# the cells of the cluster tests (tests/cluster_cells.py); worker 1's input sticks at its
# 30th batch of GLOBAL_BATCH / 2
SETUP = cluster_cells.SETUP + cluster_cells.stuck_input("GLOBAL_BATCH // 2 * 30")
STEP = cluster_cells.STEP.replace("{flags}", "--steps 100000")


LOCAL = ("kill", "SIGSTOP", "stuck input", "controller")
#: Seconds each `%distribute restart` took (and the setup cell after it).
RESTARTS: list[tuple[float, float]] = []


def _watch(ready) -> list[float]:
    """A daemon thread appending the monotonic time at which ``ready()`` first holds."""
    seen: list[float] = []

    def run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if ready():
                    seen.append(time.monotonic())
                    return
            except Exception:
                seen.append(time.monotonic())
                return
            time.sleep(0.01)

    threading.Thread(target=run, daemon=True).start()
    return seen


def one(shell, kind: str, stall_file: str) -> tuple[float, float | None]:
    """(fault -> error, stall limit stated by the error or None)."""
    import psutil

    from nbdist.session import current_session

    backend = current_session().backend
    if backend.broken:
        started = time.monotonic()
        shell.run_line_magic("distribute", "restart")
        restarted = time.monotonic()
        backend = current_session().backend
        shell.run_line_magic("distribute", "push STALL_FILE")   # fresh workers: empty
        _ok(shell.run_cell(SETUP, store_history=False))
        RESTARTS.append((restarted - started, time.monotonic() - restarted))
    victim = psutil.Process(backend.info[1]["pid"])
    if os.path.exists(stall_file):
        os.remove(stall_file)
    if kind == "kill":
        shell.run_line_magic("distribute", "inject kill 1 --at-step 30")
        seen = _watch(lambda: victim.status() == psutil.STATUS_ZOMBIE)
    elif kind == "SIGSTOP":
        shell.run_line_magic("distribute", "inject stop 1 --at-step 30")
        seen = _watch(lambda: victim.status() == psutil.STATUS_STOPPED)
    elif kind == "controller":
        import nbdist

        controller = psutil.Process(backend.engines.controller_pid)
        before = len(nbdist.runs)
        seen = _watch(lambda: len(nbdist.runs) > before and nbdist.runs[-1].n_rows >= 30
                      and (controller.kill() or True))
    else:
        seen = []
    result = shell.run_cell(STEP.format(data="stuck_ds" if kind == "stuck input" else "long_ds"),
                            store_history=False)
    ended = time.monotonic()
    err = result.error_in_exec
    if err is None:
        raise SystemExit(f"{kind}: the cell did not fail")
    if kind == "stuck input":
        fault = ended - (time.time() - float(open(stall_file).read()))
    else:
        fault = seen[0]
    limit = re.search(r"= ([\d.]+) s\)", str(err))
    return ended - fault, float(limit.group(1)) if limit else None


def partitions(shell, repeat: int) -> list[tuple[float, float | None]]:
    """Fault -> error of a partition, each on a fresh bed of 2 hosts ([] without a bed)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import hostbed

    from nbdist.session import current_session

    reason = hostbed.skip_reason()
    if reason:
        print(f"partition: skipped, {reason}", file=sys.stderr)
        return []
    rows: list[tuple[float, float | None]] = []
    for _ in range(repeat):
        with hostbed.HostBed(2) as bed:
            bed.start_cluster()
            try:
                shell.run_line_magic("distribute", f"multiworker --cluster {bed.profile_dir}")
                _ok(shell.run_cell(SETUP, store_history=False))
                backend = current_session().backend
                victim = [info["host"] for info in backend.info].index("host2")
                shell.run_line_magic("distribute", f"inject partition {victim} --at-step 30")
                result = shell.run_cell(STEP.format(data="long_ds"), store_history=False)
                ended = time.monotonic()
                if result.error_in_exec is None:
                    raise SystemExit("partition: the cell did not fail")
                rows.append((ended - backend.monitor.injections[-1]["cut_at"], None))
                print(f"MEASURED partition: fault -> error {rows[-1][0]:.2f} s",
                      file=sys.stderr)
            finally:
                shell.run_line_magic("distribute", "stop")
    return rows


def _ok(result) -> None:
    if result.error_before_exec or result.error_in_exec:
        raise SystemExit(f"setup failed: {result.error_before_exec or result.error_in_exec!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", choices=(*LOCAL, "partition"), help="one fault only")
    args = parser.parse_args()
    from common import ipython_shell

    shell = ipython_shell()
    shell.run_line_magic("load_ext", "nbdist")
    stall_file = os.path.join(tempfile.mkdtemp(prefix="nbdist-fault-"), "stalled")
    shell.user_ns["STALL_FILE"] = stall_file
    results: dict[str, list[tuple[float, float | None]]] = {}
    local = [k for k in LOCAL if args.only in (None, k)]
    if local:
        shell.run_line_magic("distribute", "multiworker --workers 2")
        shell.run_line_magic("distribute", "push STALL_FILE")
        _ok(shell.run_cell(SETUP, store_history=False))
    try:
        for kind in local:
            for _ in range(args.repeat):
                results.setdefault(kind, []).append(one(shell, kind, stall_file))
                print(f"MEASURED {kind}: fault -> error {results[kind][-1][0]:.2f} s",
                      file=sys.stderr)
    finally:
        shell.run_line_magic("distribute", "stop")
    if args.only in (None, "partition"):
        results["partition"] = partitions(shell, args.repeat)
    results = {kind: rows for kind, rows in results.items() if rows}
    print(f"\nfault -> cell error, median (min..max) of {args.repeat}, 2 workers (local; "
          "partition: 2 simulated hosts):")
    for kind, rows in results.items():
        total = [t for t, _ in rows]
        line = (f"  {kind:<12} {statistics.median(total):5.1f} s "
                f"({min(total):.1f}..{max(total):.1f})")
        after = [t - limit for t, limit in rows if limit is not None]
        if after:
            line += (f"   detection -> error {statistics.median(after):4.1f} s "
                     f"({min(after):.1f}..{max(after):.1f}); spec <= 10 s, ratio "
                     f"{statistics.median(after) / 10:.2f}")
        print(line)
    if RESTARTS:
        restart, setup = [r for r, _ in RESTARTS], [t for _, t in RESTARTS]
        print(f"  %distribute restart {statistics.median(restart):5.1f} s "
              f"({min(restart):.1f}..{max(restart):.1f}), then the setup cell "
              f"{statistics.median(setup):.1f} s; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
