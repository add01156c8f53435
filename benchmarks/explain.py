"""`Run.explain()` on runs whose bottleneck is known, and its first advice applied.

Eight runs are built to have one bottleneck each (none of them the tests' runs), explained
(``Run.explain()``: the input pipeline timed alone once per run), then the first advice is
applied exactly as it reads and the run made again (an input advice that says ``.cache()``
first, for Python work that keeps a core busy, gets the cache right after that stage; one
that says ``num_parallel_calls``, the parallel stage and prefetch). Before and after run in
turns, ``--rounds`` times; each line gives how many rounds named the bottleneck right, the
medians of the steps/s (examples/s where the batch changes) and of the predicted gain, and
the gain measured (after/before - 1 of the medians), then each round's prediction and the
first round's run explained again with its pipeline timed again. Rates are the steady state
the explanation measures (mean time between steps after the compile steps). The machine's
load (``uptime``) is printed at the start and the end.

* pymap: a tiny MLP on 4 replicas fed by a ``map`` of a ``tf.py_function`` that waits 4.5 ms
  a batch (Python reading or decoding), no ``num_parallel_calls``; the fix:
  ``num_parallel_calls=tf.data.AUTOTUNE`` on that map and ``.prefetch(tf.data.AUTOTUNE)`` last;
* interleave: 64 TFRecord files written to a temporary directory, read by an ``interleave``
  without ``num_parallel_calls`` whose per-file reader waits 4 ms to open its file (slow
  storage, a ``tf.py_function``); the fix: ``num_parallel_calls=tf.data.AUTOTUNE`` on the
  interleave and ``.prefetch(tf.data.AUTOTUNE)`` last;
* shuffle: a per-example ``map`` of a ``tf.py_function`` looping 50 µs in Python, before a
  small shuffle buffer (16) and the batch: Python that keeps a core busy, which threads
  cannot run in parallel; the fix: ``.cache()`` right after that map;
* tiny batch: the MLP on 4 replicas, 8 examples a step, cached; applied: twice the examples
  a step (``.batch(16)``, the loss's global batch 16), compared in examples/s;
* sync BN: an MLP with four ``BatchNormalization(synchronized=True)`` on 4 replicas; applied:
  ``synchronized=False``;
* shared cores: a conv net on 2 logical CPU devices (``mirrored --devices 2``), which share
  this machine's cores; the explanation says more replicas cannot help: checked by the same
  step on 4 (the gain of two more replicas, predicted none);
* straggler: ``multiworker --workers 2`` with ``%distribute inject slow 0 --delay 0.03``;
  applied: the delay taken away;
* the tests' runs (``--runs tests``): the cells of tests/test_explain.py (a ``map`` that
  sleeps 40 ms a batch: input; a ``tf.py_function`` map, explained again with its pipeline
  timed again: input, the same gain; the tiny MLP on 4 replicas: dispatch, also the live
  verdict of tests/test_labverdict_kernel.py; a conv net: balanced), each counted named right
  or not with the measures the tests no longer assert because the machine's load changes them;
* dense 2 workers: ``multiworker`` with one engine on each of two simulated hosts whose links
  are rate-limited (``tests/hostbed.py``, ``--rate``), a 1024x1024 dense layer (4.2 MB of
  gradients), the α-β model on that link given to ``explain``; applied: twice the batch per
  replica. Needs root (network namespaces); without it, said and skipped.

    python3 benchmarks/explain.py [--rounds 3] [--rate 500mbit]
                                  [--runs local,tests,straggler,communication]
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
from explain_cells import CONV_STEP as TESTS_CONV_STEP  # noqa: E402
from explain_cells import DATA as TESTS_DATA  # noqa: E402
from explain_cells import MLP_STEP  # noqa: E402
from explain_cells import MODELS as TESTS_MODELS  # noqa: E402

import nbdist  # noqa: E402

DATA = """
import os
import tempfile
import time
import numpy as np
import tensorflow as tf
rng = np.random.default_rng(1)
bx = rng.normal(size=(64 * 32, 8)).astype("float32")
by = rng.normal(size=(64 * 32, 3)).astype("float32")
AUTOTUNE = tf.data.AUTOTUNE

def wait_decode(x, y):
    time.sleep(0.0045)           # Python reading or decoding a batch
    return x, y
def py_decode(x, y):
    x, y = tf.py_function(wait_decode, [x, y], [tf.float32, tf.float32])
    return tf.ensure_shape(x, [None, 8]), tf.ensure_shape(y, [None, 3])
batches = tf.data.Dataset.from_tensor_slices((bx, by)).batch(64)
pymap = batches.map(py_decode).repeat()
pymap_fixed = batches.map(py_decode, num_parallel_calls=AUTOTUNE).repeat().prefetch(AUTOTUNE)
pymap_cached = batches.map(py_decode).cache().repeat()

record_dir = tempfile.mkdtemp(prefix="nbdist-explain-")
files = []
for k in range(64):
    path = os.path.join(record_dir, f"part-{k:02d}.tfrecord")
    files.append(path)
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(k, len(bx), 64):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=bx[i])),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=by[i]))}))
                .SerializeToString())
spec = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([3], tf.float32)}
def wait_open(path):
    time.sleep(0.004)            # slow storage: opening a file
    return path
def read_file(path):   # the file is opened as the interleave reads it
    opened = tf.data.Dataset.from_tensors(path).map(
        lambda p: tf.reshape(tf.py_function(wait_open, [p], tf.string), []))
    records = opened.flat_map(tf.data.TFRecordDataset)
    return records.map(lambda r: tuple(tf.io.parse_single_example(r, spec).values()))
file_list = tf.data.Dataset.from_tensor_slices(files)
interleaved = file_list.interleave(read_file, cycle_length=4).batch(64).repeat()
interleaved_fixed = file_list.interleave(read_file, cycle_length=4, num_parallel_calls=AUTOTUNE
                                         ).batch(64).repeat().prefetch(AUTOTUNE)
interleaved_cached = file_list.interleave(read_file, cycle_length=4).cache().batch(64).repeat()

def compute_example(x, y):
    end = time.perf_counter() + 0.00005   # Python work on one example: a loop
    while time.perf_counter() < end:
        pass
    return x, y
def py_example(x, y):
    x, y = tf.py_function(compute_example, [x, y], [tf.float32, tf.float32])
    return tf.ensure_shape(x, [8]), tf.ensure_shape(y, [3])
examples = tf.data.Dataset.from_tensor_slices((bx, by))
shuffled = examples.map(py_example).shuffle(16).batch(64).repeat()
shuffled_fixed = examples.map(py_example).cache().shuffle(16).batch(64).repeat()
shuffled_parallel = examples.map(py_example, num_parallel_calls=AUTOTUNE).shuffle(16).batch(
    64).repeat().prefetch(AUTOTUNE)

tiny = tf.data.Dataset.from_tensor_slices((bx, by)).batch(8).cache().repeat().prefetch(8)
tiny_doubled = tf.data.Dataset.from_tensor_slices((bx, by)).batch(16).cache().repeat().prefetch(8)
cached = batches.cache().repeat().prefetch(8)
pictures = tf.data.Dataset.from_tensor_slices((
    rng.normal(size=(128, 28, 28, 3)).astype("float32"),
    rng.integers(0, 10, size=(128,)).astype("int32"))).batch(32).cache().repeat().prefetch(4)
"""
MODELS = """%%distribute
def mlp(norm=None):
    layers = [tf.keras.Input((8,))]
    for _ in range(4 if norm is not None else 1):
        layers.append(tf.keras.layers.Dense(64 if norm is not None else 16))
        if norm is not None:
            layers.append(tf.keras.layers.BatchNormalization(synchronized=norm))
        layers.append(tf.keras.layers.ReLU())
    return tf.keras.Sequential(layers + [tf.keras.layers.Dense(3)])
bm = mlp()
bm_opt = tf.keras.optimizers.SGD(0.01)
sync = mlp(norm=True)
sync_opt = tf.keras.optimizers.SGD(0.01)
local = mlp(norm=False)
local_opt = tf.keras.optimizers.SGD(0.01)
"""
CONV = """%%distribute
convnet = tf.keras.Sequential([
    tf.keras.Input((28, 28, 3)), tf.keras.layers.Conv2D(48, 3, activation="relu"),
    tf.keras.layers.Conv2D(48, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
    tf.keras.layers.Conv2D(96, 3, activation="relu"), tf.keras.layers.GlobalAveragePooling2D(),
    tf.keras.layers.Dense(10)])
convnet_opt = tf.keras.optimizers.SGD(0.01)
"""
# the tests' conv-net step on this benchmark's own model and data
CONV_STEP = (TESTS_CONV_STEP.replace("ex_images", "pictures").replace("ex_conv", "convnet")
             .replace("global_batch_size=64", "global_batch_size=32"))

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


def compare(ip, name: str, expected: str, first: dict, second, rounds: int,
            examples: tuple[int, int] = (1, 1), link=None) -> str:
    """Both versions ``rounds`` times in turns; print the first explanation; one result line.
    ``first``: keyword arguments of ``explained``; ``second``: the same for the changed run,
    or a function of the first advice's text giving them (the change as the advice reads);
    ``examples``: examples per step of each (the gain compared in examples/s when they
    differ). The first round's run is explained once more with its pipeline timed again."""
    before, after, again = [], [], None
    for _ in range(rounds):
        before.append(explained(ip, link=link, **first))
        if again is None:
            again = retimed(nbdist.runs[-1], link)
        text = before[-1].advice[0].text if before[-1].advice else ""
        after.append(explained(ip, link=link, **(second(text) if callable(second)
                                                 else second)))
        print(f"  {name}: {before[-1].bottleneck} "
              f"{[f'{a.kind} {a.gain:+.0%}' for a in before[-1].advice]} "
              f"{before[-1].steps_per_s:.1f} -> {after[-1].steps_per_s:.1f} steps/s", flush=True)
    print(f"\n== {name} ==\n{before[0].text}\n-- explained again --\n{again.text}"
          f"\n-- after the advice --\n{after[0].text}", flush=True)
    rate_before = statistics.median(e.steps_per_s for e in before) * examples[0]
    rate_after = statistics.median(e.steps_per_s for e in after) * examples[1]
    named = sum(e.bottleneck == expected for e in before)
    # what the applied change was predicted to gain: each round's first advice, where named
    advised = [e.advice[0] for e in before if e.bottleneck == expected and e.advice]
    predicted = statistics.median(a.gain for a in advised) if advised else float("nan")
    measured = rate_after / rate_before - 1
    unit = advised[0].unit if advised else "steps/s"
    verdict = ("yes" if measured >= predicted / 2 else "no") if advised else "-"
    each = "/".join(f"{a.gain:+.0%}" for a in advised)
    first_gain = before[0].advice[0].gain if before[0].advice else 0.0
    twice = (f"{again.bottleneck} "
             + (f"{again.advice[0].gain:+.0%}" if again.advice else "-")
             + f" (first {before[0].bottleneck} {first_gain:+.0%})")
    return row(name, expected, f"{named} of {rounds}", unit, rate_before, rate_after,
               f"{predicted:+.0%}", f"{measured:+.0%}", verdict, f"{each}; again: {twice}")


def retimed(run, link):
    """``run`` explained again with its input pipeline timed again (where it was timed)."""
    if run.input_rate is not None:
        run.input_rate = None
    return run.explain(link=link)


def by_advice(parallel: str, cached: str, **cell):
    """The changed run as the input advice reads: its pipeline cached right after the costly
    stage where the advice says `.cache()` first, else run in parallel and prefetched."""
    def changed(text: str) -> dict:
        cache_first = "Do it once: `.cache()`" in text
        return mlp(cached if cache_first else parallel, **cell)
    return changed


def mlp(data: str, model: str = "bm", flags: str = "", steps: int = 200, batch: int = 64) -> dict:
    return {"cell": MLP_STEP.format(data=data, steps=steps, flags=flags, model=model)
            .replace("global_batch_size=64", f"global_batch_size={batch}")}


def row(*cells) -> str:
    widths = (16, 14, 8, 11, 9, 9, 9, 9, 6, 0)
    out = []
    for cell, width in zip(cells, widths, strict=True):
        text = f"{cell:.1f}" if isinstance(cell, float) else str(cell)
        out.append(text.ljust(width) if width in (16, 14, 8, 11, 0) else text.rjust(width))
    return " ".join(out)


HEADER = row("run", "bottleneck", "named", "unit", "before", "after", "predicted", "measured",
             ">=half", "predicted in each round")


def local_runs(ip, rounds: int, only: set[str] | None = None) -> list[str]:
    ok(ip, DATA)
    ok(ip, MODELS)
    cases = {
        "pymap": lambda: compare(ip, "pymap", "input", mlp("pymap"),
                                 by_advice("pymap_fixed", "pymap_cached"), rounds),
        "interleave": lambda: compare(
            ip, "interleave", "input", mlp("interleaved"),
            by_advice("interleaved_fixed", "interleaved_cached"), rounds),
        "shuffle": lambda: compare(ip, "shuffle", "input", mlp("shuffled"),
                                   by_advice("shuffled_parallel", "shuffled_fixed"), rounds),
        "tiny batch": lambda: compare(
            ip, "tiny batch", "dispatch", mlp("tiny", steps=400, batch=8),
            mlp("tiny_doubled", steps=400, batch=16), rounds, examples=(8, 16)),
        "sync BN": lambda: compare(ip, "sync BN", "communication", mlp("cached", "sync"),
                                   mlp("cached", "local"), rounds),
        "shared cores": lambda: shared_cores(ip, rounds),
    }

    def mlp(data: str, model: str = "bm", flags: str = "", steps: int = 200,
            batch: int = 64) -> dict:
        return {"cell": MLP_STEP.format(data=data, steps=steps, flags=flags, model=model)
                .replace("global_batch_size=64", f"global_batch_size={batch}")}

    return [case() for name, case in cases.items() if only is None or name in only]


def shared_cores(ip, rounds: int) -> str:
    """A conv net on 2 logical devices (named balanced: more replicas cannot help), against
    the same step on 4 (each its own model: variables belong to their strategy)."""
    explanations, rates = [], {2: [], 4: []}
    try:
        for _ in range(rounds):
            for devices in (2, 4):
                ip.run_line_magic("distribute", f"mirrored --devices {devices}")
                ok(ip, CONV)
                e = explained(ip, CONV_STEP.format(steps=30))
                rates[devices].append(e.steps_per_s)
                if devices == 2:
                    explanations.append(e)
                    print(f"  shared cores: {e.bottleneck} {e.steps_per_s:.1f} steps/s",
                          flush=True)
    finally:
        ip.run_line_magic("distribute", "mirrored --devices 4")
    print(f"\n== shared cores ==\n{explanations[0].text}", flush=True)
    named = sum(e.bottleneck == "balanced" and "more replicas cannot make it faster" in e.text
                for e in explanations)
    before, after = statistics.median(rates[2]), statistics.median(rates[4])
    measured = after / before - 1   # same global batch: steps/s is examples/s
    return row("shared cores", "balanced", f"{named} of {rounds}", "steps/s", before, after,
               "none", f"{measured:+.0%}", "yes" if measured < 0.1 else "no",
               "4 replicas against 2: " + "/".join(f"{b / a - 1:+.0%}" for a, b in zip(
                   rates[2], rates[4], strict=True)))


def tests_runs(ip, rounds: int) -> list[str]:
    """The tests' runs (tests/explain_cells.py), each made ``rounds`` times: how often each is
    named by the bottleneck it was built to have, and the measures behind it. On a loaded
    machine the compute slows and the verdict can change, so the tests check only what holds
    under any load; here they are counted."""
    ok(ip, TESTS_DATA)
    ok(ip, TESTS_MODELS)

    def cell(data: str, steps: int) -> str:
        return MLP_STEP.format(data=data, steps=steps, flags="", model="ex_mlp")

    def input_share(e, again) -> str:
        return f"input {e.shares.get('input', 0.0):.0%} of the step (over 40%)"

    def regained(e, again) -> str:
        first = e.advice[0].gain if e.advice else float("nan")
        second = again.advice[0].gain if again.advice else float("nan")
        return f"gain {first:+.0%}, timed again {second:+.0%} (within 25%)"

    def advice(e, again) -> str:
        return e.advice[0].text.split(":")[0][:60] if e.advice else "no advice"

    cases = [("sleeping map", cell("ex_slow", 60), "input", input_share),
             ("python map", cell("ex_py", 40), "input", regained),
             ("tiny MLP", cell("ex_fast", 300), "dispatch", advice),
             ("conv net", TESTS_CONV_STEP.format(steps=24), "balanced", advice)]
    lines = []
    for name, step, expected, measure in cases:
        named, rates, measures = 0, [], []
        for _ in range(rounds):
            e = explained(ip, step)
            again = retimed(nbdist.runs[-1], None)
            named += e.bottleneck == expected
            rates.append(e.steps_per_s)
            measures.append(f"{e.bottleneck}: {measure(e, again)}")
            print(f"  {name}: {measures[-1]}", flush=True)
        lines.append(f"{name:<16} {expected:<14} {named} of {rounds:<3} "
                     f"{statistics.median(rates):9.1f} steps/s  " + "; ".join(measures))
    return lines


def straggler_run(ip, rounds: int, delay: float) -> str:
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    try:
        ok(ip, WORKER_SETUP.format(width=4))
        step = WORKER_STEP.format(data="ds32", steps=40, batch=32)
        return compare(ip, "straggler", "straggler",
                       {"cell": step, "before": f"inject slow 0 --delay {delay:g}",
                        "after": "inject slow 0 --delay 0"}, {"cell": step}, rounds)
    finally:
        ip.run_line_magic("distribute", "stop")


def communication_run(ip, rounds: int, rate: str) -> str:
    import hostbed
    from allreduce_ring import one_way_latency_ms

    reason = hostbed.skip_reason()
    if reason:
        return f"{'dense 2 workers':<16} skipped: {reason}"
    with hostbed.HostBed(2, rate=rate) as bed:
        latency = one_way_latency_ms(bed)
        bed.start_cluster()
        ip.run_line_magic("distribute", f"multiworker --cluster {bed.profile_dir}")
        try:
            ok(ip, WORKER_SETUP.format(width=1024))   # 1024 x 1024 + 1024 floats: 4.2 MB
            link = (hostbed.rate_bytes(rate), latency)
            print(f"\ndense 2 workers: 2 hosts, each link {rate}, one-way latency "
                  f"{latency:.3f} ms", flush=True)
            return compare(
                ip, "dense 2 workers", "communication",
                {"cell": WORKER_STEP.format(data="ds32", steps=16, batch=32)},
                {"cell": WORKER_STEP.format(data="ds64", steps=16, batch=64)},
                rounds, examples=(32, 64), link=link)
        finally:
            ip.run_line_magic("distribute", "stop")


def uptime() -> str:
    """``uptime``'s load averages (1, 5, 15 min)."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="before/after pairs per run")
    parser.add_argument("--rate", default="500mbit",
                        help="the simulated hosts' link rate (tc units)")
    parser.add_argument("--delay", type=float, default=0.03,
                        help="seconds the straggler run's slow worker sleeps after each step")
    parser.add_argument("--only", default=None,
                        help="local runs to make, comma-separated (default: all of them)")
    parser.add_argument("--runs", default="local,tests,straggler,communication",
                        help="which of local (pymap, interleave, shuffle, tiny batch, sync "
                             "BN, shared cores), tests (the tests' runs: sleeping map, python "
                             "map, tiny MLP, conv net), straggler, communication (simulated "
                             "hosts)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupted)   # so the host bed is removed as on Ctrl-C
    started = time.monotonic()
    load = uptime()
    print(f"uptime at the start: {load}", flush=True)
    ip = nbdist_shell()
    runs = args.runs.split(",")
    only = set(args.only.split(",")) if args.only else None
    lines = local_runs(ip, args.rounds, only) if "local" in runs else []
    tested = tests_runs(ip, args.rounds) if "tests" in runs else []
    if "straggler" in runs:
        lines.append(straggler_run(ip, args.rounds, args.delay))
    if "communication" in runs:
        lines.append(communication_run(ip, args.rounds, args.rate))
    if lines:
        print(f"\nmedians of {args.rounds} rounds; before/after in the unit's rate; predicted: "
              "the applied advice's expected gain (the first advice where the run was named "
              "right); measured: after/before - 1; shared cores: named balanced with 'more "
              "replicas cannot make it faster', checked by 4 replicas against 2 (>=half: under "
              "+10%)\n"
              + HEADER)
        print("\n".join(lines))
    if tested:
        print("\nthe tests' runs (tests/explain_cells.py): named right, median steps/s, and "
              "each round's verdict and measures (in parentheses: what the run was built to "
              "show)\n" + "\n".join(tested))
    print(f"({time.monotonic() - started:.0f} s on {os.cpu_count()} cores; uptime at the "
          f"start: {load}; at the end: {uptime()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
