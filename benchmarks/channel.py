"""`ChannelClient.send` (a worker's metrics, called from its training loop) against a kernel
that has stopped reading vs one that reads, measured side by side.

A worker must never wait for the kernel: ``send`` queues the message (or drops it when the
queue is full) and a background thread writes it. Each round sends ``--messages`` rows
messages to a server whose handler is stuck, then to one that drains, alternating; it prints
the time per ``send`` on each side and their ratio (stalled / draining, goal <= ~1: a stalled
kernel costs the worker nothing). Also the drops counted on the stalled side (the queue is
bounded by ``--queue``).

    python benchmarks/channel.py [--messages 1000] [--queue 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nbdist.telemetry import channel as ch  # noqa: E402


def one_side(stalled: bool, messages: int, queue: int) -> tuple[float, int]:
    """Microseconds per send, and how many were dropped."""
    key = ch.new_key()
    release = threading.Event()
    srv = ch.ChannelServer(key, (lambda w, m: release.wait(30)) if stalled else (lambda w, m: None))
    client = ch.ChannelClient(srv.address, key, 0, max_queue=queue)
    rows = {"type": "rows", "rows": [[0, 1.5, 2.5, 0.25]]}
    started = time.perf_counter()
    for i in range(messages):
        rows["rows"][0][0] = i
        client.send(rows)
    per_send = (time.perf_counter() - started) / messages * 1e6
    dropped = client.dropped.get("queue_full", 0)
    release.set()
    client.close()
    srv.close()
    return per_send, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--queue", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ratios = []
    for r in range(args.rounds):
        stalled, dropped = one_side(True, args.messages, args.queue)
        draining, _ = one_side(False, args.messages, args.queue)
        ratios.append(stalled / draining)
        print(f"round {r}: send {stalled:.1f} us (stalled kernel, {dropped} dropped) vs "
              f"{draining:.1f} us (draining); ratio {ratios[-1]:.2f}")
    print(f"stalled / draining time per send: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
