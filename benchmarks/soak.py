"""Memory over a long notebook session: RSS of the kernel while a step cell runs again and again.

A user runs cells all day; what a finished run keeps must be its rows and a summary. This
runs ``--runs`` step cells of ``--steps`` steps at 2 replicas, then ``--long`` cells of
``--long-steps`` steps (``--steps-per-call`` 100 by default: the same rows, sooner), and
prints the kernel's RSS after ``gc.collect()`` every ``--every`` runs, beside the rows'
own bytes (13 float64 columns per row) and the growth beyond them (goal: at most 100 MB
over 500 runs and 10^6 rows). Two kernels, one after the other:

- ``jupyter``: a real Jupyter kernel (the dashboard's widgets are created and sent; this
  process drains the messages, as a frontend would);
- ``shell``: IPython in a terminal (no widgets: the text summary).

    python benchmarks/soak.py [--runs 500] [--steps 2] [--long 10] [--long-steps 50000]
                              [--long-steps-per-call 100] [--kernels jupyter,shell]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETUP = """
%load_ext nbdist
%distribute mirrored --devices 2
"""
MODEL = """
%%distribute
import numpy as np, tensorflow as tf
x = np.random.default_rng(0).normal(size=(4096, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.01)
"""
STEP = """
%%distribute --step --data ds --steps {steps}{per_call}
features, labels = batch
with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(model(features) - labels))
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""
PROBE = """
import gc, json, nbdist
gc.collect()
_rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")][0]
print("PROBE " + json.dumps({"rss_kb": _rss, "rows": sum(r.n_rows for r in nbdist.runs),
                             "runs": len(nbdist.runs)}))
"""


def plan(args) -> list[tuple[str, bool]]:
    """The cells in order; True marks a probe."""
    cells = [(SETUP, False), (MODEL, False), (PROBE, True)]
    for i in range(1, args.runs + 1):
        cells.append((STEP.format(steps=args.steps, per_call=""), False))
        if i % args.every == 0:
            cells.append((PROBE, True))
    for _ in range(args.long):
        per_call = f" --steps-per-call {args.long_steps_per_call}"
        cells += [(STEP.format(steps=args.long_steps, per_call=per_call), False), (PROBE, True)]
    return cells


def in_jupyter(cells, env) -> list[dict]:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=env)
    found: list[dict] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and "PROBE " in msg["content"]["text"]:
            found.append(json.loads(msg["content"]["text"].split("PROBE ", 1)[1]))
            report("jupyter", found[-1], found[0])

    try:
        for code, _ in cells:
            reply = kc.execute_interactive(code, timeout=3600, output_hook=hook)
            if reply["content"]["status"] != "ok":
                raise SystemExit(f"cell failed: {reply['content'].get('evalue')}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    return found


SHELL_DRIVER = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
for code in json.load(sys.stdin):
    result = shell.run_cell(code)
    if not result.success:
        raise SystemExit(f"cell failed: {result.error_in_exec or result.error_before_exec}")
"""


def in_shell(cells, env) -> list[dict]:
    proc = subprocess.Popen([sys.executable, "-c", SHELL_DRIVER], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(json.dumps([code for code, _ in cells]))
    proc.stdin.close()
    found: list[dict] = []
    for line in proc.stdout:
        if line.startswith("PROBE "):
            found.append(json.loads(line[6:]))
            report("shell", found[-1], found[0])
    if proc.wait():
        raise SystemExit(f"the IPython shell exited {proc.returncode}")
    return found


def report(kind: str, probe: dict, first: dict) -> None:
    grown = (probe["rss_kb"] - first["rss_kb"]) / 1024
    own = (probe["rows"] - first["rows"]) * 13 * 8 / 2**20
    print(f"{kind:8s} runs {probe['runs']:4d}  rows {probe['rows']:9,d}  RSS "
          f"{probe['rss_kb'] / 1024:7.1f} MB  grown {grown:6.1f} MB  rows' own bytes "
          f"{own:6.1f} MB  beyond them {grown - own:6.1f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--long", type=int, default=10)
    parser.add_argument("--long-steps", type=int, default=50_000)
    parser.add_argument("--long-steps-per-call", default="100")
    parser.add_argument("--kernels", default="jupyter,shell")
    args = parser.parse_args()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cells = plan(args)
    print(textwrap.dedent(f"""\
        {args.runs} runs of a {args.steps}-step cell, then {args.long} of {args.long_steps}
        steps, 2 replicas; RSS after gc.collect() every {args.every} runs"""))
    for kind in args.kernels.split(","):
        probes = (in_jupyter if kind == "jupyter" else in_shell)(cells, env)
        base, last = probes[0], probes[-1]
        grown = (last["rss_kb"] - base["rss_kb"]) / 1024
        own = (last["rows"] - base["rows"]) * 13 * 8 / 2**20
        print(f"{kind}: grew {grown:.1f} MB over {last['runs']} runs and {last['rows']:,} rows; "
              f"{grown - own:.1f} MB beyond the rows' own bytes (goal <= 100 MB)")


if __name__ == "__main__":
    main()
