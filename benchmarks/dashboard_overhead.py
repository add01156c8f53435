"""Training speed with the live dashboard displayed vs without, measured side by side.

A real Jupyter kernel (started here; this process drains its messages as a frontend would)
trains a tiny MLP with ``%%distribute --step`` under ``mirrored --devices 4``. Two designs:

* interleaved (the headline number): ONE long run in which the dashboard observes only every
  other window of ``--window-steps`` steps; the rate of each "on" window is compared with the
  "off" window right after it, so slow load changes on a shared machine cancel out.
* separate cells (``--rounds``): cells alternate between the dashboard (``observer_for``, what
  the magic uses), a no-op observer and, with ``--modes on,off,uipoll``, the dashboard with
  ``Dashboard.stop_mode = "uipoll"`` (jupyter-ui-poll between steps). Also prints the time
  redraws take on the kernel's main thread and the extra CPU of the IOPub thread.

    python benchmarks/dashboard_overhead.py [--window-steps 25] [--window-run 8000]
                                            [--rounds 4] [--steps 800] [--modes on,off,uipoll]

Target: steps/s ratio (on / off) >= 0.97.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETUP = [
    "%load_ext nbdist\n%distribute mirrored --devices 4",
    """
import tensorflow as tf
GLOBAL = 64
x = tf.random.normal([GLOBAL * 50, 32]); y = tf.random.normal([GLOBAL * 50, 4])
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL, drop_remainder=True).repeat()
""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                             tf.keras.layers.Dense(4)])
optimizer = tf.keras.optimizers.Adam()
""",
    """
import json, time
import nbdist
import nbdist.widgets.dashboard as _dash
from nbdist.telemetry.run import RunObserver
_observer_for = _dash.observer_for
_last = {}

class _Null(RunObserver):
    def __init__(self): self.runs = []
    def on_step(self, run):
        if run not in self.runs: self.runs.append(run)
    def should_stop(self): return False
    def close(self): pass

import os

def _iopub_cpu():
    # CPU seconds used so far by the IOPub thread (it sends the widget messages)
    from ipykernel.kernelapp import IPKernelApp
    tid = IPKernelApp.instance().iopub_thread.thread.native_id
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

class _Clock(RunObserver):
    # wall and process CPU time at step `skip` and at the last step
    def __init__(self, inner, skip=20):
        self.inner, self.skip, self.start, self.end = inner, skip, None, None
    @property
    def runs(self): return self.inner.runs
    def on_step(self, run):
        self.inner.on_step(run)
        n = run.steps_done
        if n != self.skip and n != run.total_steps and run.total_steps is not None:
            return
        mark = (time.perf_counter(), time.process_time(), n, _iopub_cpu())
        if run.steps_done == self.skip:
            self.start = mark
        self.end = mark
    def should_stop(self): return self.inner.should_stop()
    def close(self): self.inner.close()

def _use(mode):
    _dash.Dashboard.stop_mode = "uipoll" if mode == "uipoll" else "auto"
    def make(shell, **kw):
        obs = _Clock(_Null() if mode == "off" else _observer_for(shell, **kw))
        _last["obs"] = obs
        return obs
    _dash.observer_for = make

def _report(mode):
    run = nbdist.runs[-1]
    clock = _last["obs"]
    (w0, c0, s0, i0), (w1, c1, s1, i1) = clock.start, clock.end
    out = {"mode": mode, "steps": s1, "rate": (s1 - s0) / (w1 - w0),
           "cpu_ms": (c1 - c0) / (s1 - s0) * 1e3, "iopub_ms": (i1 - i0) / (s1 - s0) * 1e3,
           "status": run.status}
    obs = clock.inner
    if hasattr(obs, "redraws"):
        out.update(redraws=obs.redraws, redraw_s=round(obs.redraw_seconds - obs.build_seconds, 4),
                   duration=w1 - w0, stop_mode=obs.views[run.id].stop.mode)
    print("RESULT " + json.dumps(out))
""",
]

WINDOWS = """
class _Windows(RunObserver):
    # Forwards to the dashboard only in even windows of `size` steps (odd windows: no dashboard)
    def __init__(self, inner, size):
        self.inner, self.size = inner, size
    @property
    def runs(self): return self.inner.runs
    def _on(self, run): return (run.steps_done - 1) // self.size % 2 == 0
    def on_step(self, run):
        if self._on(run) or not self.inner.runs:
            self.inner.on_step(run)
    def should_stop(self): return self.inner.should_stop()
    def close(self): self.inner.close()

def _use_windows(size):
    _dash.Dashboard.stop_mode = "auto"
    _dash.observer_for = lambda shell, **kw: _Windows(_observer_for(shell, **kw), size)

def _report_windows(size):
    rows = [r for r in nbdist.runs[-1].rows_since(0) if r.replica == 0]
    # a step's on_step runs after its row's wall_time: window j spans rows (j*size, (j+1)*size]
    ends = [rows[i].wall_time for i in range(size, len(rows), size)]
    times = [b - a for a, b in zip(ends, ends[1:])]      # windows 1, 2, ... (odd: off)
    off, on = times[0::2], times[1::2]
    n = min(len(on), len(off) - 1)
    pairs = [(on[i], off[i + 1]) for i in range(n)]      # an on window and the off one after it
    print("RESULT " + json.dumps({"size": size, "pairs": pairs}))
"""

STEP = """%%distribute --step --data ds --steps {steps}
x, y = batch
with tf.GradientTape() as tape:
    per = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per, global_batch_size=GLOBAL)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--modes", default="on,off")
    parser.add_argument("--window-steps", type=int, default=25,
                        help="interleaved design: dashboard on/off every N steps (0: skip)")
    parser.add_argument("--window-run", type=int, default=8000,
                        help="steps of the interleaved run")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if "off" not in modes:
        parser.error("--modes must include off (the baseline)")

    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    results: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    iopub: dict[str, list[float]] = {m: [] for m in modes}
    extra: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        def run(code: str) -> list[dict]:
            found: list[dict] = []
            comms = [0]

            def hook(msg: dict) -> None:
                if msg["msg_type"] == "stream" and "RESULT " in msg["content"]["text"]:
                    line = msg["content"]["text"].split("RESULT ", 1)[1].splitlines()[0]
                    found.append(json.loads(line))
                elif msg["msg_type"].startswith("comm"):
                    comms[0] += 1

            reply = kc.execute_interactive(code, timeout=600, output_hook=hook)
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"{reply['content'].get('ename')}: "
                                   f"{reply['content'].get('evalue')}")
            last_comms[0] = comms[0]
            return found

        last_comms = [0]

        for code in SETUP:
            run(code)
        run(WINDOWS)
        for mode in modes:                      # warm-up: imports, first traces, first draw
            run(f"_use({mode!r})")
            run(STEP.format(steps=200))
        for r in range(args.rounds):
            order = modes if r % 2 == 0 else modes[::-1]
            for mode in order:
                run(f"_use({mode!r})")
                run(STEP.format(steps=args.steps))
                comm_msgs = last_comms[0]
                [res] = run(f"_report({mode!r})")
                res["comm_msgs"] = comm_msgs
                results[mode].append(res["rate"])
                cpu[mode].append(res["cpu_ms"])
                iopub[mode].append(res["iopub_ms"])
                extra[mode].append(res)
            line = "  ".join(f"{m} {results[m][-1]:7.1f}" for m in modes)
            print(f"round {r + 1}: steps/s  {line}", flush=True)
        windows = None
        if args.window_steps:
            run(f"_use_windows({args.window_steps})")
            run(STEP.format(steps=args.window_run))
            [windows] = run(f"_report_windows({args.window_steps})")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

    if windows:
        _print_windows(windows, args.window_run)
    if args.rounds:
        _print_rounds(args, modes, results, cpu, iopub, extra)
    return 0


def _ratio(pairs: list[list[float]]) -> float:
    """steps/s with the dashboard / without: total off time over total on time."""
    return sum(off for _, off in pairs) / sum(on for on, _ in pairs)


def _print_windows(windows: dict, steps: int) -> None:
    import random

    pairs, size = windows["pairs"], windows["size"]
    rng = random.Random(0)
    boot = sorted(_ratio([rng.choice(pairs) for _ in pairs]) for _ in range(2000))
    per_pair = [off / on for on, off in pairs]
    print(f"\ninterleaved: one run of {steps} steps, dashboard on/off every {size} steps, "
          f"{len(pairs)} adjacent on/off pairs")
    print(f"  steps/s ratio (on/off, total time): {_ratio(pairs):.3f}, 95% bootstrap CI "
          f"{boot[50]:.3f}-{boot[1949]:.3f}; median pair ratio {statistics.median(per_pair):.3f}")
    print(f"  steps/s: on {size * len(pairs) / sum(on for on, _ in pairs):.1f}, "
          f"off {size * len(pairs) / sum(off for _, off in pairs):.1f}")


def _print_rounds(args, modes, results, cpu, iopub, extra) -> None:  # noqa: ANN001
    print(f"\nseparate cells: {args.rounds} rounds x {args.steps} steps, mirrored --devices 4, "
          "tiny MLP (rates from step 20 on; medians of per-round ratios)")
    for mode in modes:
        ratios = [a / b for a, b in zip(results[mode], results["off"], strict=True)]
        cpu_ratios = [b / a for a, b in zip(cpu[mode], cpu["off"], strict=True)]
        print(f"{mode:7s} {statistics.median(results[mode]):7.1f} steps/s, "
              f"{statistics.median(cpu[mode]):.2f} ms CPU/step | vs off: steps/s ratio "
              f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}), "
              f"CPU-per-step ratio {statistics.median(cpu_ratios):.3f}")
        drawn = [e for e in extra[mode] if "redraws" in e]
        if drawn:
            per_s = statistics.median(e["redraws"] / e["duration"] for e in drawn)
            frac = statistics.median(e["redraw_s"] / e["duration"] for e in drawn)
            step_ms = 1e3 / statistics.median(results["off"])
            extra_iopub = statistics.median(iopub[mode]) - statistics.median(iopub["off"])
            implied = 1 / (1 + frac + max(0.0, extra_iopub) / step_ms)
            print(f"        redraws {per_s:.1f}/s taking {frac:.2%} of the wall time on the "
                  f"kernel's main thread; IOPub thread +{extra_iopub:.3f} ms CPU/step; "
                  f"implied ratio {implied:.3f}")
            print(f"        stop mode {drawn[0]['stop_mode']}, "
                  f"{statistics.median(e['comm_msgs'] for e in drawn):.0f} comm msgs per run")


if __name__ == "__main__":
    sys.exit(main())
