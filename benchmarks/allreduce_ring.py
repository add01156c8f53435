"""All-reduce time and bus bandwidth on simulated hosts, against the ring model.

On the host bed (``tests/hostbed.py``: one network namespace per host, a rate and a delay on
each host's outgoing link with ``tc netem``; where the kernel has no netem, the rate alone with
``tbf`` and no delay, said at the start), for 2 and 3 hosts and message sizes 1 KB .. 16 MB,
two sides interleaved size by size (each side first every other size):

* nbdist: ``%distribute multiworker --cluster PROFILE`` (one engine per host), then per size a
  ``%%distribute --step --timing-every 1`` cell whose step all-reduces a float32 tensor of that
  size with ``ctx.all_reduce``; its time is nbdist's own ``allreduce_ms`` rows, the slowest
  worker's per step (the dashboard's line and bus bandwidth). Under multiworker a worker's
  ``allreduce_ms`` runs from its own arrival at the collective, so it includes waiting for the
  other workers (the Run's note says so).
* hand: one process per host with ``MultiWorkerMirroredStrategy`` (TF_CONFIG with the hosts'
  addresses), the same ``ctx.all_reduce`` of the same tensor in ``strategy.run``, bracketed by
  ``tf.timestamp`` as nbdist's probe does. ``hand ms`` counts it as nbdist's rows do (the
  slowest worker's end - its own start); ``alone ms`` is the collective alone, from the last
  worker's arrival to the last result (the hosts share this machine's clock).

Both sides trace with a short run first (an unchanged step cell reuses its trace), then run
``--seconds`` of model time (8..40 steps, the first ``WARMUP`` dropped). Each row: medians,
nbdist/hand, the ring model ``2(N-1)/N x bytes / bandwidth + 2(N-1) x latency`` (bandwidth:
the link rate; latency: half a measured one-byte TCP round trip between two hosts, the delay
included), measured/model, the bus bandwidth ``bytes x 2(N-1)/N / time`` (nccl-tests'
convention, ``series.bus_bandwidth``), and the CPU per step (user+sys of the kernel, the
controller and every process on the hosts) of each side's measured run.

What runs: ``MultiWorkerMirroredStrategy`` on CPUs, ``CommunicationImplementation.AUTO`` ->
TensorFlow's ``RingReduce`` (``collective_param_resolver_local.cc``: RingReduce unless NCCL):
the tensor is cut into N chunks (N x 2 when a chunk would exceed 4 MiB), reduce-scatter then
all-gather, 2(N-1) hops on each chunk's critical path. Each hop is a ``RecvBuf`` gRPC pulled by
the receiver, and the bytes travel in the response protobuf, copied on both sides
(``collective_rma_distributed.cc``), and the reduction runs on the CPU: a fixed ~1-3 ms of RPC
and executor work per collective that the latency term does not have, and copies that compete
for the CPU with the workers on a small machine.

    python3 benchmarks/allreduce_ring.py [--hosts 2 3] [--rate 1gbit] [--delay 0.5]
                                         [--sizes 1K,4K,...,16M] [--seconds 3]

Needs root (network namespaces); without it, it says why and exits 0. Everything it starts is
removed at the end, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from nbdist.telemetry.ring import ring_model_ms  # noqa: E402 - the model explain uses
from nbdist.widgets.series import bus_bandwidth  # noqa: E402 - the dashboard's own formula

WARMUP = 2                       # steps dropped from each size (tracing, first connections)
HAND_PORT = 23456                # below the ephemeral range nbdist's free ports come from
SIZES = "1K,4K,16K,64K,256K,1M,4M,16M"
_BINARY = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def parse_size(size: str) -> int:
    """``1K``, ``64K``, ``16M``, ``4096`` in bytes (K = 1024)."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmg]?)b?\s*", size.lower())
    if not found:
        raise ValueError(f"size {size!r}: write it as 4096, 64K or 16M")
    return int(found.group(1)) * _BINARY[found.group(2)]


def steps_for(model_ms: float, seconds: float) -> int:
    """Timed steps per size: about ``seconds`` of the model's time, 8 to 40."""
    return WARMUP + max(8, min(40, int(seconds * 1e3 / max(model_ms, 1e-3))))


# -- the hand-written side: one process per host ----------------------------------------------
def hand_worker() -> None:
    """Reads ``ELEMENTS STEPS`` lines on stdin; answers each with a JSON line of its
    per-step [t_start, t_end] (seconds, tf.timestamp). ``quit`` ends it."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    print("ready", flush=True)

    def make_step(elements: int):
        def replica_fn(seed):
            x = tf.fill([elements], seed)
            with tf.control_dependencies([x]):
                t0 = tf.timestamp()
            with tf.control_dependencies([t0]):
                x = tf.identity(x)
            reduced = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, x)
            with tf.control_dependencies([reduced]):
                t1 = tf.timestamp()
            return tf.stack([t0, t1]), reduced[0]

        @tf.function
        def step(seed):
            stamps, first = strategy.run(replica_fn, args=(seed,))
            return strategy.experimental_local_results(stamps)[0], first

        return step

    traced = {}
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        elements, steps = map(int, line.split())
        step = traced.setdefault(elements, make_step(elements))
        stamps = [step(tf.constant(float(i)))[0].numpy().tolist() for i in range(steps)]
        print(json.dumps(stamps), flush=True)
    os._exit(0)   # skip TensorFlow's exit barrier


class HandWritten:
    """The hand-written workers, one on each host of the bed, driven line by line."""

    def __init__(self, bed, hosts: int):
        addresses = [f"{ip}:{HAND_PORT}" for ip in bed.ips[:hosts]]
        self.procs = []
        for i in range(hosts):
            config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
            env = dict(os.environ, TF_CONFIG=json.dumps(config), PYTHONPATH=ROOT)
            self.procs.append(subprocess.Popen(
                bed.on_host(i, [sys.executable, os.path.abspath(__file__), "--hand-worker"]),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True, env=env))
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a hand-written worker did not start (see its host)")

    def allreduce_ms(self, elements: int, steps: int) -> tuple[list[float], list[float]]:
        """Per step after the warm-up: as nbdist's rows count it under multiworker (each
        worker from its own arrival, so waiting for the others included; the slowest worker),
        and the collective alone (from the last worker's arrival to the last result)."""
        for proc in self.procs:
            proc.stdin.write(f"{elements} {steps}\n")
            proc.stdin.flush()
        stamps = [json.loads(proc.stdout.readline()) for proc in self.procs]
        per_step = [[w[s] for w in stamps] for s in range(WARMUP, steps)]
        as_rows = [max(t1 - t0 for t0, t1 in workers) * 1e3 for workers in per_step]
        alone = [(max(t1 for _, t1 in workers) - max(t0 for t0, _ in workers)) * 1e3
                 for workers in per_step]
        return as_rows, alone

    def close(self) -> None:
        for proc in self.procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
                proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()


# -- nbdist's side ------------------------------------------------------------------------------
SETUP = """%%distribute
import tensorflow as tf
_options = tf.data.Options()
_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ring_ds = tf.data.Dataset.from_tensor_slices(tf.ones([6 * 8])).batch(
    6, drop_remainder=True).repeat().with_options(_options)
"""
STEP = """%%distribute --step --data ring_ds --steps {steps} --timing-every 1
x = tf.fill([{elements}], tf.reduce_sum(batch))
reduced = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, x)
loss = reduced[0]
"""


def _cell(shell, code: str) -> None:
    result = shell.run_cell(code, store_history=False)
    if result.error_before_exec or result.error_in_exec:
        raise RuntimeError(f"cell failed: {result.error_before_exec or result.error_in_exec!r}")


def nbdist_allreduce_ms(shell, elements: int, steps: int) -> tuple[list[float], int]:
    """Per timed step the slowest worker's ``allreduce_ms``, and ``Run.allreduce_bytes``."""
    import nbdist

    _cell(shell, STEP.format(elements=elements, steps=steps))
    run = nbdist.runs[-1]
    frame = run.metrics
    slowest = frame[frame.step >= WARMUP].groupby("step").allreduce_ms.max()
    return slowest.dropna().tolist(), run.allreduce_bytes or 0


# -- the table ----------------------------------------------------------------------------------
def _fmt_bw(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:6.3g} {unit}"
    return f"{bytes_per_s:6.3g} B/s"


HEADER = (f"{'hosts':>5} {'bytes':>9} {'nbdist ms':>10} {'hand ms':>8} {'nb/hand':>7} "
          f"{'alone ms':>8} {'model ms':>9} {'nb/model':>8} {'alone/model':>11} "
          f"{'bus bw (nbdist)':>15} {'bus bw (alone)':>14} {'cpu/step nb':>11} {'hand':>6}")


def row(hosts: int, nbytes: int, measured: dict, model: float) -> str:
    """Medians over the timed steps; CPU in ms per step."""
    m, h, a = (statistics.median(measured[k]) for k in ("nbdist", "hand", "alone"))
    bw_m, bw_a = (bus_bandwidth(nbytes, hosts, t / 1e3) for t in (m, a))
    return (f"{hosts:>5} {nbytes:>9} {m:>10.3f} {h:>8.3f} {m / h:>7.2f} {a:>8.3f} "
            f"{model:>9.3f} {m / model:>8.2f} {a / model:>11.2f} {_fmt_bw(bw_m):>15} "
            f"{_fmt_bw(bw_a):>14} {measured['nbdist cpu']:>11.1f} {measured['hand cpu']:>6.1f}")


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and everything below it: the controller,
    the engines and the hand-written workers on the hosts (reaped children included)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:   # ended meanwhile: its parent has its time once reaped
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


ECHO_SERVER = """
import socket
s = socket.create_server(("0.0.0.0", {port}))
print("listening", flush=True)
c, _ = s.accept()
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (b := c.recv(1)):
    c.sendall(b)
"""
ECHO_CLIENT = """
import socket, statistics, time
c = socket.create_connection(("{ip}", {port}))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(200):
    t = time.perf_counter()
    c.sendall(b"x")
    c.recv(1)
    rtts.append(time.perf_counter() - t)
print(statistics.median(rtts[20:]) * 1e3)
"""


def one_way_latency_ms(bed) -> float:
    """Half the median round trip of one byte over TCP from host 1 to host 2 (no ping here)."""
    port = HAND_PORT - 1
    server = subprocess.Popen(bed.on_host(1, [sys.executable, "-c", ECHO_SERVER.format(
        port=port)]), stdout=subprocess.PIPE, text=True)
    try:
        server.stdout.readline()
        done = subprocess.run(bed.on_host(0, [sys.executable, "-c", ECHO_CLIENT.format(
            ip=bed.ips[1], port=port)]), capture_output=True, text=True, timeout=60, check=True)
        return float(done.stdout) / 2
    finally:
        server.kill()
        server.wait()


def one_size(shell, hand: HandWritten, nbytes: int, steps: int, nbdist_first: bool) -> dict:
    """Both sides on one size, in the order asked, each traced by a short run first (an
    unchanged step cell reuses its trace): all-reduce ms per timed step and CPU ms per step
    of this process and everything below it, for the measured run."""
    out = {}
    for side in ("nbdist", "hand") if nbdist_first else ("hand", "nbdist"):
        for run_steps in (WARMUP + 1, steps):
            cpu = _cpu_seconds()
            if side == "nbdist":
                times, reported = nbdist_allreduce_ms(shell, nbytes // 4, run_steps)
                if reported != nbytes:
                    raise RuntimeError(f"nbdist timed {reported} bytes, not {nbytes}")
                out["nbdist"] = times
            else:
                out["hand"], out["alone"] = hand.allreduce_ms(nbytes // 4, run_steps)
            out[f"{side} cpu"] = (_cpu_seconds() - cpu) / run_steps * 1e3
    return out


def measure(shell, hostbed, hosts: int, sizes: list[int], args, bytes_per_s: float) -> list:
    lines = []
    with hostbed.HostBed(hosts, delay_ms=args.delay, rate=args.rate) as bed:
        latency = one_way_latency_ms(bed)
        print(f"{hosts} hosts: one-way latency between hosts {latency:.3f} ms (TCP echo); "
              f"machine load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        bed.start_cluster()
        hand = None
        try:
            shell.run_line_magic("distribute", f"multiworker --cluster {bed.profile_dir}")
            _cell(shell, SETUP)
            hand = HandWritten(bed, hosts)
            for i, nbytes in enumerate(sizes):
                model = ring_model_ms(nbytes, hosts, bytes_per_s, latency)
                measured = one_size(shell, hand, nbytes, steps_for(model, args.seconds),
                                    nbdist_first=i % 2 == 0)
                lines.append(row(hosts, nbytes, measured, model))
                print(lines[-1], flush=True)
        finally:
            if hand is not None:
                hand.close()
            shell.run_line_magic("distribute", "stop")
    return lines


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    if "--hand-worker" in sys.argv:
        hand_worker()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--rate", default="1gbit", help="rate of each host's link (tc units)")
    parser.add_argument("--delay", type=float, default=0.5,
                        help="netem delay of each host's link, ms (0: none)")
    parser.add_argument("--sizes", default=SIZES, help="comma-separated, e.g. 1K,64K,16M")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="about this much model time of steps per size (8 to 40 steps)")
    args = parser.parse_args()
    import hostbed

    try:
        bytes_per_s = hostbed.rate_bytes(args.rate)
    except ValueError as err:
        parser.error(str(err))
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    except ValueError as err:
        parser.error(str(err))
    if bad := [s for s in sizes if s < 4 or s % 4]:
        parser.error(f"sizes must be whole float32 tensors (multiples of 4 bytes): {bad}")
    if min(args.hosts) < 2:
        parser.error("an all-reduce across hosts needs --hosts 2 or more")
    reason = hostbed.skip_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    if args.delay and hostbed.netem_missing():
        print(f"note: {hostbed.netem_missing()}, so the {args.delay} ms delay is not simulated: "
              "each link has the rate alone (tbf), and the model's latency is the bed's own, "
              "measured.")
        args.delay = None
    signal.signal(signal.SIGTERM, _interrupted)   # so the bed is removed as on Ctrl-C
    from common import ipython_shell

    shell = ipython_shell()
    shell.run_line_magic("load_ext", "nbdist")
    print(f"each host's link: rate {args.rate} ({bytes_per_s / 1e6:g} MB/s), delay "
          f"{args.delay or 0} ms. Medians over steps, ms. nbdist: its allreduce_ms rows; hand: "
          "hand-written MultiWorkerMirroredStrategy counted the same way; alone: the hand-written "
          "collective from the last arrival; cpu/step: ms of CPU per step, all processes\n"
          + HEADER, flush=True)
    started = time.monotonic()
    lines = []
    for hosts in args.hosts:
        lines += measure(shell, hostbed, hosts, sizes, args, bytes_per_s)
    print(f"\n{HEADER}\n" + "\n".join(lines))
    print(f"({time.monotonic() - started:.0f} s; machine load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
