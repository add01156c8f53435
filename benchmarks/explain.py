"""`Run.explain()` on runs whose bottleneck is known, and its first advice applied.

Five runs are built to have one bottleneck each, their explanation printed, then the first
advice applied and run again; each line gives the steps/s (examples/s for a larger batch) the
advice predicted and what the changed run measured. Before and after run in turns, twice
(``--rounds``), and the medians are compared; rates are the steady state the explanation
measures (mean time between steps after the compile steps).

* input: a tiny MLP on 4 replicas fed by a ``map`` that sleeps 40 ms a batch; applied: the
  same map with ``num_parallel_calls`` and ``prefetch``, 16 in parallel on 16 tf.data threads
  (the sleep stands for waiting on storage, which overlaps beyond this machine's 2 cores);
* dispatch: the tiny MLP on 4 replicas, cached input; applied: ``--steps-per-call auto``;
* nothing to fix: a small conv net on 4 replicas (its replicas share the cores: compute);
* straggler: ``multiworker --workers 2`` with ``%distribute inject slow 1 --delay 0.05``
  (``--delay``);
  applied: the delay taken away;
* communication: ``multiworker`` with one engine on each of two simulated hosts whose links
  are rate-limited (``tests/hostbed.py``, ``--rate``), a dense layer of ~1 MB of gradients;
  the α-β model on that link (its rate and measured latency) given to ``explain``; applied:
  twice the batch per replica. Needs root (network namespaces); without it, said and skipped.

The tiny MLP's dispatch-bound run and the conv net are also measured against one replica
(``explain(baseline=True)``): the speed-up of their 4 replicas and its efficiency.

    python3 benchmarks/explain.py [--rounds 2] [--rate 100mbit] [--delay 0.05]
                                  [--runs local,straggler,communication]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import nbdist_shell, ok  # noqa: E402
from explain_cells import CONV_STEP, DATA, MLP_STEP, MODELS  # noqa: E402

import nbdist  # noqa: E402

# multiworker: each worker's own data; BATCH is the global batch
WORKER_SETUP = """%%distribute
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(nbdist_worker)
xs = rng.normal(size=(1024, {width})).astype("float32")
ys = rng.normal(size=(1024, {width})).astype("float32")
def batches(n):
    return tf.data.Dataset.from_tensor_slices((xs, ys)).batch(n, drop_remainder=True).repeat()
ds32, ds64 = batches(32), batches(64)
model = tf.keras.Sequential([tf.keras.Input(({width},)), tf.keras.layers.Dense({width})])
optimizer = tf.keras.optimizers.SGD(0.01)
"""
WORKER_STEP = """%%distribute --step --data {data} --steps {steps}
x, y = batch
with tf.GradientTape() as tape:
    per_example = tf.reduce_mean(tf.square(model(x) - y), axis=-1)
    loss = tf.nn.compute_average_loss(per_example, global_batch_size={batch})
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def explained(ip, cell: str, link=None, before: str | None = None, after: str | None = None):
    """Run ``cell`` (``before`` and ``after``: line magics around it): its explanation."""
    if before:
        ip.run_line_magic("distribute", before)
    try:
        ok(ip, cell)
    finally:
        if after:
            ip.run_line_magic("distribute", after)
    return nbdist.runs[-1].explain(link=link)


def compare(ip, name: str, expected: str, first: dict, second: dict, rounds: int,
            examples: tuple[int, int] = (1, 1), link=None) -> str:
    """Both versions ``rounds`` times in turns; print the first explanation; one result line.
    ``first``/``second``: keyword arguments of ``explained``; ``examples``: examples per step
    of each (the gain compared in examples/s when they differ)."""
    before, after = [], []
    shown = None
    for _ in range(rounds):
        e = explained(ip, link=link, **first)
        shown = shown or e
        before.append(e)
        after.append(explained(ip, link=link, **second))
    print(f"\n== {name} ==\n{shown.text}\n-- after the advice --\n{after[0].text}", flush=True)
    rate_before = statistics.median(e.steps_per_s for e in before) * examples[0]
    rate_after = statistics.median(e.steps_per_s for e in after) * examples[1]
    named = [e.bottleneck for e in before]
    # what the applied change was predicted to gain, in each round that advised it
    advised = [a for e in before for a in e.advice if a.kind == expected]
    advice = advised[0] if advised else None
    predicted = statistics.median(a.gain for a in advised) if advised else float("nan")
    measured = rate_after / rate_before - 1
    unit = advice.unit if advice else "steps/s"
    ok_name = "yes" if all(n == expected for n in named) else f"NO ({', '.join(named)})"
    verdict = ("yes" if advice and measured >= predicted / 2 else "no") if advice else "-"
    return (f"{name:<14} {expected:<14} {ok_name:<8} {unit:<11} {rate_before:9.1f} "
            f"{rate_after:9.1f} {predicted:+9.0%} {measured:+9.0%} {verdict:>6}")


HEADER = (f"{'run':<14} {'bottleneck':<14} {'named':<8} {'unit':<11} {'before':>9} "
          f"{'after':>9} {'predicted':>9} {'measured':>9} {'>=half':>6}")


def local_runs(ip, rounds: int) -> list[str]:
    ok(ip, DATA)
    ok(ip, MODELS)
    lines = []
    lines.append(compare(ip, "input", "input",
                         {"cell": MLP_STEP.format(data="ex_slow", steps=80, flags="",
                                                  model="ex_mlp")},
                         {"cell": MLP_STEP.format(data="ex_slow_fixed", steps=80, flags="",
                                                  model="ex_mlp")},
                         rounds))
    lines.append(compare(ip, "dispatch", "dispatch",
                         {"cell": MLP_STEP.format(data="ex_fast", steps=400, flags="",
                                                  model="ex_mlp")},
                         {"cell": MLP_STEP.format(data="ex_fast", steps=400, model="ex_mlp",
                                                  flags="--steps-per-call auto")}, rounds))
    mlp = next(r for r in reversed(nbdist.runs) if r.step_cell.spec.data == "ex_fast"
               and str(r.step_cell.spec.steps_per_call) == "1")
    print(f"\n== dispatch, against one replica ==\n{scaling(mlp)}", flush=True)
    conv = explained(ip, CONV_STEP.format(steps=30))
    print(f"\n== conv net ==\n{conv.text}\n{scaling(nbdist.runs[-1])}", flush=True)
    lines.append(f"{'conv net':<14} {'balanced':<14} "
                 f"{'yes' if conv.bottleneck == 'balanced' else 'NO (' + conv.bottleneck + ')':<8}"
                 f" {'steps/s':<11} {conv.steps_per_s:9.1f} {'-':>9} {'-':>9} {'-':>9} {'-':>6}")
    return lines


def scaling(run) -> str:
    """``run``'s replicas against one replica (``explain(baseline=True)``), in one line."""
    e = run.explain(baseline=True)
    return (f"--baseline: {e.replicas} replicas give {e.speedup:.2f}x one replica's examples/s "
            f"(efficiency {e.efficiency:.0%}); one replica {e.baseline.examples_per_s:.0f} "
            f"examples/s at batch {e.baseline.batch}; the probe took {e.baseline.seconds:.1f} s")


def straggler_run(ip, rounds: int, delay: float) -> str:
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    try:
        ok(ip, WORKER_SETUP.format(width=4))
        step = WORKER_STEP.format(data="ds32", steps=40, batch=32)
        return compare(ip, "straggler", "straggler",
                       {"cell": step, "before": f"inject slow 1 --delay {delay:g}",
                        "after": "inject slow 1 --delay 0"}, {"cell": step}, rounds)
    finally:
        ip.run_line_magic("distribute", "stop")


def communication_run(ip, rounds: int, rate: str) -> str:
    import hostbed
    from allreduce_ring import one_way_latency_ms

    reason = hostbed.skip_reason()
    if reason:
        return f"{'communication':<14} skipped: {reason}"
    with hostbed.HostBed(2, rate=rate) as bed:
        latency = one_way_latency_ms(bed)
        bed.start_cluster()
        ip.run_line_magic("distribute", f"multiworker --cluster {bed.profile_dir}")
        try:
            ok(ip, WORKER_SETUP.format(width=512))   # 512 x 512 + 512 floats: 1.05 MB
            link = (hostbed.rate_bytes(rate), latency)
            print(f"\ncommunication: 2 hosts, each link {rate}, one-way latency {latency:.3f} ms",
                  flush=True)
            return compare(
                ip, "communication", "communication",
                {"cell": WORKER_STEP.format(data="ds32", steps=24, batch=32)},
                {"cell": WORKER_STEP.format(data="ds64", steps=24, batch=64)},
                rounds, examples=(32, 64), link=link)
        finally:
            ip.run_line_magic("distribute", "stop")


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="before/after pairs per run")
    parser.add_argument("--rate", default="100mbit",
                        help="the simulated hosts' link rate (tc units)")
    parser.add_argument("--delay", type=float, default=0.05,
                        help="seconds the straggler run's slow worker sleeps after each step")
    parser.add_argument("--runs", default="local,straggler,communication",
                        help="which of local (input, dispatch, conv net), straggler, "
                             "communication (simulated hosts)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)   # so the host bed is removed as on Ctrl-C
    started = time.monotonic()
    ip = nbdist_shell()
    runs = args.runs.split(",")
    lines = local_runs(ip, args.rounds) if "local" in runs else []
    if "straggler" in runs:
        lines.append(straggler_run(ip, args.rounds, args.delay))
    if "communication" in runs:
        lines.append(communication_run(ip, args.rounds, args.rate))
    print(f"\nmedians of {args.rounds} rounds; before/after in the unit's rate; predicted: "
          "the applied advice's expected gain (the first advice where the run was named right); "
          "measured: after/before - 1\n" + HEADER)
    print("\n".join(lines))
    print(f"({time.monotonic() - started:.0f} s; machine load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
