"""Multiworker cold start: `%distribute multiworker --workers 2` + the first step cell in a fresh
IPython process, vs a bare 2-process MultiWorkerMirroredStrategy script doing the same first
step (the twin in benchmarks/multiworker.py: same model, data, batch, tf_keras).

Each side is timed from launching its process(es) to the end of the first training step
(wall), and by CPU time (user+sys) of every process it started (``RUSAGE_CHILDREN`` after they
exit). The nbdist side also prints a timeline: when each phase of the start began and ended
(ms from launch), in the kernel and, from their own clocks, in the engines (Python up,
TensorFlow imported), and the bare workers' milestones (TensorFlow imported, strategy built).

    python benchmarks/cold_start.py [--rounds 5]

Rounds alternate which side goes first (paired, side by side). It prints each round, the
medians, the timeline of the median nbdist round, and a last line ``RESULT`` with the ratio of
the medians (wall and CPU). Defaults take 1-3 minutes; a loaded machine spreads the rounds.

The bare script's start is bimodal: when one worker tries to reach the other before that one
listens, gRPC retries about a second later. nbdist starts its workers' servers together, once
all have imported TensorFlow, so it does not wait so. The benchmark says which bare rounds
waited and compares nbdist with the rounds that did not, too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from multiworker import SETUP
from overhead import STEP_BODY, define_step_fn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Modules a kernel would rather not import during a cold start (seconds of CPU each).
HEAVY = ("tensorflow", "keras", "plotly", "anywidget", "ipywidgets", "pandas")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- the nbdist side: a fresh IPython shell ---------------------------------------------------
def _timeline(t0: float, events: list) -> None:
    """Wrap the start's phases so each records (name, start ms, end ms) into ``events``."""
    import ipyparallel as ipp

    from nbdist.cluster.engines import local
    from nbdist.cluster.multiworker import backend

    def wrap(owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        def done(start: float) -> None:
            events.append((label, (start - t0) * 1e3, (time.time() - t0) * 1e3))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                done(start)

        @functools.wraps(original)
        async def timed_async(*args, **kwargs):
            start = time.time()
            try:
                return await original(*args, **kwargs)
            finally:
                done(start)

        setattr(owner, name, timed_async if inspect.iscoroutinefunction(original) else timed)

    wrap(ipp.Cluster, "start_controller", "controller started")
    wrap(ipp.Cluster, "start_engines", "engine processes launched")
    wrap(ipp.Cluster, "connect_client", "client connected")
    wrap(local.LocalEngines, "_wait_for_engines", "engines registered")
    original_call = backend.Dispatcher.call

    @functools.wraps(original_call)
    def call(self, fn, *args, **kwargs):
        start = time.time()
        try:
            return original_call(self, fn, *args, **kwargs)
        finally:
            events.append((f"on engines: {fn.__name__}", (start - t0) * 1e3,
                           (time.time() - t0) * 1e3))

    backend.Dispatcher.call = call


def nbdist_session(t0: float, out: str) -> None:
    events: list = [("process started, Python up", 0.0, (time.time() - t0) * 1e3)]
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        from common import ipython_shell

        shell = ipython_shell()
        events.append(("IPython shell", events[-1][2], (time.time() - t0) * 1e3))

        def cell(label: str, code: str) -> None:
            start = time.time()
            result = shell.run_cell(code, store_history=False)
            events.append((label, (start - t0) * 1e3, (time.time() - t0) * 1e3))
            if result.error_before_exec or result.error_in_exec:
                raise RuntimeError(repr(result.error_before_exec or result.error_in_exec))

        cell("%load_ext nbdist", "%load_ext nbdist")
        _timeline(t0, events)
        cell("%distribute multiworker --workers 2", "%distribute multiworker --workers 2")
        cell("setup cell", "%%distribute\n" + SETUP)
        cell("first step cell", "%%distribute --step --data ds --steps 1\n" + STEP_BODY)
        cold = time.time() - t0
        engines = _engine_clocks(shell, t0)
        cpu = _cpu_by_process()
        shell.run_line_magic("distribute", "stop")
    with open(out, "w") as f:
        json.dump({"cold_s": cold, "events": events, "engines": engines, "cpu": cpu,
                   "kernel_imported": [m for m in HEAVY if m in sys.modules]}, f)
    os._exit(0)


def _cpu_by_process() -> dict:
    """CPU seconds (user+sys) so far of the kernel and each process under it, by name."""
    import psutil

    me = psutil.Process()
    out: dict = {}
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            line = " ".join(proc.cmdline())
            name = ("kernel" if proc.pid == me.pid
                    else "engines" if "inengine.preload" in line
                    else "engine nannies" if "ipyparallel.engine.nanny" in line
                    else "engines" if "ipyparallel.engine" in line
                    else "controller" if "controller" in line else proc.name())
            t = proc.cpu_times()
            out[name] = out.get(name, 0.0) + t.user + t.system
    return out


def _engine_clocks(shell, t0: float) -> list:
    """Each engine's process start and (if preloaded) TensorFlow import, in ms from t0."""
    from nbdist.cluster.multiworker.backend import live_clusters

    def clocks() -> dict:
        from nbdist.cluster.inengine import preload

        return preload.clocks()

    out = []
    for cluster in live_clusters():
        for ar in [cluster.engines.client[i].apply_async(clocks) for i in cluster.engines.ids]:
            out.append({k: (v - t0) * 1e3 for k, v in ar.get(30).items() if v})
    return out


def run_nbdist(attempts: int = 3) -> dict:
    """The nbdist side's round, repeated if the session failed (e.g. a port taken by another
    process between nbdist choosing it and TensorFlow binding it: nbdist says "run again")."""
    out = tempfile.mktemp(suffix=".json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for _ in range(attempts):
        cpu0, t0 = _children_cpu(), time.time()
        done = subprocess.run([sys.executable, __file__, "--nbdist-session", str(t0), out],
                              env=env, timeout=600, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        cpu = _children_cpu() - cpu0
        if done.returncode == 0:
            with open(out) as f:
                result = json.load(f)
            os.remove(out)
            return {**result, "cpu_s": cpu}
        print("  (the nbdist session failed, round repeated): "
              + (done.stderr.strip().splitlines() or ["?"])[-1][:300], flush=True)
    raise RuntimeError(f"the nbdist session failed {attempts} times")


# -- the bare side: two worker processes with TF_CONFIG, one step ---------------------------
def bare_worker(index: int, ports: str, t0: float, out: str) -> None:
    addresses = [f"127.0.0.1:{p}" for p in ports.split(",")]
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    clocks = {"tf_imported": time.time() - t0}
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    clocks["strategy_built"] = time.time() - t0
    ns: dict = {}
    with strategy.scope():
        exec(SETUP, ns)  # noqa: S102 - the benchmark's own setup code
    step_fn = define_step_fn(ns)

    @tf.function
    def train_step(dist_batch):
        out = strategy.run(step_fn, args=(dist_batch,))
        return tf.stack(strategy.experimental_local_results(out))

    train_step(next(iter(strategy.experimental_distribute_dataset(ns["ds"])))).numpy()
    with open(out, "w") as f:
        json.dump({**clocks, "first_step_s": time.time() - t0}, f)
    os._exit(0)   # skip TensorFlow's exit barrier, as nbdist's workers do


def bare(attempts: int = 3) -> dict:
    """The bare side's round; retried if a worker failed (on a shared machine another process
    can take a chosen port before TensorFlow binds it), its partner killed, not left waiting."""
    for _ in range(attempts):
        result = _bare_once()
        if result is not None:
            return result
        print("  (a bare worker failed, e.g. its port was taken: round repeated)", flush=True)
    raise RuntimeError(f"the bare script failed {attempts} times")


def _bare_once() -> dict | None:
    from nbdist.cluster.tfconfig import free_ports

    ports = ",".join(map(str, free_ports(2)))
    outs = [tempfile.mktemp(suffix=".json") for _ in range(2)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cpu0, t0 = _children_cpu(), time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "--bare-worker", str(i), ports,
                               str(t0), outs[i]], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
             for i in range(2)]
    deadline = time.monotonic() + 600
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):
            break   # the other waits for it forever
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    cpu = _children_cpu() - cpu0
    failed = [p for p, out in zip(procs, outs, strict=True)
              if p.returncode != 0 or not os.path.exists(out)]
    if failed:
        for out in outs:
            with contextlib.suppress(OSError):
                os.remove(out)
        return None
    workers = []
    for path in outs:
        with open(path) as f:
            workers.append(json.load(f))
        os.remove(path)
    return {"cold_s": max(w["first_step_s"] for w in workers), "cpu_s": cpu,
            "milestones": {k: max(w[k] for w in workers) * 1e3 for k in workers[0]}}


#: A bare round whose strategy was built within this long after TensorFlow's import connected
#: its workers at the first try (here ~100 ms; after a failed try gRPC waits ~1 s to retry).
CONNECTED_MS = 300


def strategy_wait(bare_result: dict) -> float:
    """ms from both bare workers having imported TensorFlow to both having their strategy."""
    marks = bare_result["milestones"]
    return marks["strategy_built"] - marks["tf_imported"]


def milestones(result: dict) -> dict:
    """The start's milestones (ms from launch): when the last of their kind finished."""
    ends = {}
    for label, _, end in result["events"]:
        ends.setdefault(label, end)
    engines = result["engines"]
    return {
        "controller up (client connected)": ends.get("client connected"),
        "engines registered": ends.get("engines registered"),
        "TensorFlow imported on engines": max((e.get("tf_imported") or 0 for e in engines),
                                              default=None),
        "TF_CONFIG set, servers up (setup returned)": ends.get("on engines: setup"),
        "first step": result["cold_s"] * 1e3,
    }


def print_timeline(result: dict) -> None:
    print("  nbdist timeline (ms from launching the kernel process):")
    for label, start, end in sorted(result["events"], key=lambda e: e[1]):
        print(f"    {start:7.0f} - {end:7.0f}  ({end - start:6.0f})  {label}")
    for i, clocks in enumerate(result["engines"]):
        parts = ", ".join(f"{k} at {v:.0f}" for k, v in clocks.items())
        print(f"    engine {i}: {parts}")
    print("  milestones: " + "; ".join(f"{k} {v:.0f}" for k, v in milestones(result).items()
                                       if v is not None))
    print("  CPU s by process: " + ", ".join(f"{k} {v:.1f}" for k, v in result["cpu"].items())
          + "; the kernel imported: " + (", ".join(result["kernel_imported"]) or "none of "
                                         + ", ".join(HEAVY)))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--bare-worker":
        a = sys.argv[2:]
        return bare_worker(int(a[0]), a[1], float(a[2]), a[3])
    if len(sys.argv) > 1 and sys.argv[1] == "--nbdist-session":
        return nbdist_session(float(sys.argv[2]), sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="every round's timeline")
    args = parser.parse_args()
    rows = []
    for r in range(args.rounds):
        if r % 2:
            mine, base = run_nbdist(), bare()
        else:
            base, mine = bare(), run_nbdist()
        rows.append((mine, base))
        print(f"round {r + 1}: nbdist {mine['cold_s']:.2f} s wall, {mine['cpu_s']:.1f} s CPU | "
              f"bare {base['cold_s']:.2f} s wall, {base['cpu_s']:.1f} s CPU (strategy built "
              f"{strategy_wait(base):.0f} ms after TF imported) | ratio "
              f"{mine['cold_s'] / base['cold_s']:.2f}", flush=True)
        if args.verbose:
            print_timeline(mine)
    median = statistics.median
    ours = sorted((m for m, _ in rows), key=lambda m: m["cold_s"])
    print(f"median round of nbdist ({ours[(len(ours) - 1) // 2]['cold_s']:.2f} s):")
    print_timeline(ours[(len(ours) - 1) // 2])
    bare_marks = {k: median(b["milestones"][k] for _, b in rows) for k in rows[0][1]["milestones"]}
    print("  bare workers, medians (ms from launch): "
          + "; ".join(f"{k} {v:.0f}" for k, v in bare_marks.items()))
    per_round = [m["cold_s"] / b["cold_s"] for m, b in rows]
    wall = (median(m["cold_s"] for m, _ in rows), median(b["cold_s"] for _, b in rows))
    cpu = (median(m["cpu_s"] for m, _ in rows), median(b["cpu_s"] for _, b in rows))
    print(f"medians over {len(rows)} rounds: nbdist {wall[0]:.2f} s wall, {cpu[0]:.1f} s CPU; "
          f"bare {wall[1]:.2f} s wall, {cpu[1]:.1f} s CPU; per-round wall ratios "
          + ", ".join(f"{r:.2f}" for r in per_round))
    connected = [b["cold_s"] for _, b in rows if strategy_wait(b) < CONNECTED_MS]
    print(f"bare rounds whose workers connected at once (strategy built < {CONNECTED_MS} ms "
          f"after TF imported; the others waited for gRPC to retry a connection to a worker not "
          f"listening yet): {len(connected)} of {len(rows)}"
          + (f", median {median(connected):.2f} s; nbdist / those: wall "
             f"{wall[0] / median(connected):.2f}x" if connected else ""))
    print(f"RESULT cold start to the first step, nbdist / bare: wall {wall[0] / wall[1]:.2f}x, "
          f"CPU {cpu[0] / cpu[1]:.2f}x (medians of {len(rows)} rounds; goal wall <= 1.2x)")


if __name__ == "__main__":
    main()
