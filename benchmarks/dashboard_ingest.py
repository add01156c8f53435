"""Kernel-side ingest: synthetic telemetry for 8 workers x 4 replicas x 100 steps/s into a Run
and a displayed dashboard, inside a real Jupyter kernel whose messages this process drains.

A producer thread appends each worker's step (4 replica rows) at 100 steps/s, as the worker
channel would; the kernel's main thread calls ``dashboard.on_step(run)`` whenever rows
arrived, as a runner does. Reports rows (events) per second processed, the CPU used by the
producer (Run appends) and by the dashboard, dropped rows (rows in the Run that never reached
the dashboard's series: must be 0) and redraws per second.

    python benchmarks/dashboard_ingest.py [--seconds 60] [--workers 8] [--replicas 4] [--rate 100]
    python benchmarks/dashboard_ingest.py --scale    # 64 workers x 8 replicas at 50 steps/s,
                                                     # aggregated views; checks the goals

``--scale`` fails (exit 2) unless 0 rows were dropped, the dashboard used <= 10% of a core and
redrew <= 10 times/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

KERNEL_CODE = """
import json, math, threading, time
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.dashboard import Dashboard
import ipywidgets, plotly.graph_objects as go, plotly.subplots   # a warm kernel: imports done
go.FigureWidget

W, R, RATE, SECONDS = {workers}, {replicas}, {rate}, {seconds}
total = int(RATE * SECONDS)
run = Run(id=1, mode="step", strategy="multiworker", replicas=R, workers=W, total_steps=total)
run.allreduce_bytes = 4 << 20
dash = Dashboard(get_ipython())
producer_cpu, late = [0.0], [0]

def produce():
    c0, t0 = time.thread_time(), time.perf_counter()
    for step in range(total):
        delay = t0 + step / RATE - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.05:
            late[0] += 1
        timed = step % 10 == 0
        for w in range(W):
            compute = [2.0 + (3.0 if w == 5 else 0.0) + 0.1 * r for r in range(R)]
            RunWriter(run).record_step(
                step, step // 1000, worker=w, step_ms=10.0 + w * 0.01, data_ms=0.3,
                loss=[1.0 / (1 + step) + 0.01 * (w * R + r) for r in range(R)],
                grad_norm=[1.0 + 0.01 * r for r in range(R)],
                allreduce_ms=[1.5] * R if timed else None,
                wait_ms=[max(compute) - c for c in compute] if timed else None,
                compute_ms=compute if timed else None)
    producer_cpu[0] = time.thread_time() - c0

thread = threading.Thread(target=produce, name="synthetic-telemetry")
c0, t0 = time.thread_time(), time.perf_counter()
thread.start()
seen = calls = 0
while thread.is_alive() or seen < run.n_rows:
    n = run.n_rows
    if n != seen:
        dash.on_step(run)
        seen, calls = n, calls + 1
    else:
        time.sleep(0.001)
wall = time.perf_counter() - t0
main_cpu = time.thread_time() - c0
RunWriter(run).finish("done")
close0 = time.perf_counter()
dash.close()
close_s = time.perf_counter() - close0
view = dash.views[1]
series = view.series
expected = total * W * R
per_key = min(d.raw for (m, k), d in series.series.items()
              if m == "loss" and k is not None)   # aggregated: steps of the median line
print("RESULT " + json.dumps(dict(
    wall=wall, rows=run.n_rows, expected=expected, ingested=series.rows,
    dropped=expected - series.rows, per_key_min=per_key, steps=total,
    main_cpu=main_cpu, producer_cpu=producer_cpu[0], redraws=dash.redraws,
    redraw_s=dash.redraw_seconds, build_s=dash.build_seconds, on_step_calls=calls,
    late_steps=late[0], close_s=close_s,
    traces=len(view.fig.current["data"]), aggregated=series.aggregated,
    max_points=max(len(t.get("x", ())) for t in view.fig.current["data"]),
    stragglers=dash.stragglers[:4], flagged=len(dash.stragglers))))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rate", type=float, default=100, help="steps per second")
    parser.add_argument("--scale", action="store_true",
                        help="64 workers x 8 replicas at 50 steps/s, and check the goals")
    args = parser.parse_args()
    if args.scale:
        args.workers, args.replicas, args.rate = 64, 8, 50

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    found: list[dict] = []
    traffic = {"comm_msgs": 0, "buffer_bytes": 0}

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream" and "RESULT " in msg["content"]["text"]:
            found.append(json.loads(msg["content"]["text"].split("RESULT ", 1)[1]))
        elif msg["msg_type"].startswith("comm"):
            traffic["comm_msgs"] += 1
            traffic["buffer_bytes"] += sum(len(b) for b in msg.get("buffers") or [])

    try:
        code = KERNEL_CODE.format(workers=args.workers, replicas=args.replicas,
                                  rate=args.rate, seconds=args.seconds)
        reply = kc.execute_interactive(code, timeout=args.seconds * 3 + 120, output_hook=hook)
        if reply["content"]["status"] != "ok":
            print(reply["content"].get("traceback"))
            return 1
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    [r] = found
    wall = r["wall"]
    print(f"{args.workers} workers x {args.replicas} replicas x {args.rate:g} steps/s for "
          f"{args.seconds:g} s (in a kernel, messages drained by this process)")
    print(f"  rows (events) processed : {r['ingested']} of {r['expected']} "
          f"-> {r['ingested'] / wall:,.0f} events/s "
          f"({r['steps'] * args.workers / wall:,.0f} worker-steps/s)")
    print(f"  dropped                 : {r['dropped']} (every key kept {r['per_key_min']} "
          f"of {r['steps']} steps)")
    steady = (r["redraw_s"] - r["build_s"]) / max(1, r["redraws"] - 1)
    print(f"  CPU, dashboard thread   : {r['main_cpu'] / wall:.1%} of one core; building the "
          f"widget {r['build_s']:.2f} s once, redraws {(r['redraw_s'] - r['build_s']) / wall:.1%}"
          f" ({steady * 1e3:.1f} ms each)")
    print(f"  CPU, Run appends        : {r['producer_cpu'] / wall:.1%} of one core "
          f"(producer thread, {r['late_steps']} steps > 50 ms late)")
    print(f"  redraws                 : {r['redraws']} -> {r['redraws'] / wall:.1f}/s, "
          f"{r['traces']} traces, <= {r['max_points']} points each; close {r['close_s']:.2f} s")
    print(f"  to the frontend         : {traffic['comm_msgs']} comm msgs, "
          f"{traffic['buffer_bytes'] / wall / 1e3:,.0f} kB/s of binary buffers")
    print(f"  stragglers flagged      : {r['flagged']}, first {r['stragglers']}"
          f" ({'aggregated views' if r['aggregated'] else 'a line per replica'})")
    ok = r["dropped"] == 0
    if args.scale:
        checks = {"0 rows dropped": r["dropped"] == 0,
                  "dashboard <= 10% of a core": r["main_cpu"] / wall <= 0.10,
                  "redraws <= 10/s": r["redraws"] / wall <= 10, "aggregated": r["aggregated"]}
        print("  goals                   : " + ", ".join(
            f"{name}: {'ok' if good else 'FAILED'}" for name, good in checks.items()))
        ok = all(checks.values())
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
