"""The run's input pipeline timed alone: what ``%distribute explain`` attributes input to.

``measure_input(run)`` iterates the dataset a step run of this kernel read (its ``--data``,
as the notebook holds it now) on a fresh iterator of its own, as TensorFlow's tf.data
performance guide times a pipeline: the first batch (the pipeline starting, its buffers
filling) left out, then batches for about ``SECONDS``, at most ``MAX_BATCHES``, the rate
the median of four runs of them. The user's iterators and the run's are untouched: a
``tf.data.Dataset`` makes a new iterator each time it is iterated. It also reads the
pipeline's stages from its graph (``hooks.tf_data``): which one runs Python
(``tf.py_function``, ``tf.numpy_function``) and whether it runs in parallel.

It measures only a run that has ended (a pipeline timed beside a training run would slow the
run and be slowed by it), of a strategy that trains in the kernel, whose data is a
``tf.data.Dataset`` still in the notebook. Otherwise it says why not, and the explanation
infers the input's share from the step's own timings. A run is measured once: explaining it
again reuses the measurement (``Run.input_rate``), so the same run gets the same verdict.
"""

from __future__ import annotations

import time
from typing import Any

from ..families import family
from ..telemetry.explain import STEADY_FROM, InputRate
from ..telemetry.run import Run, RunWriter

SECONDS = 1.0          # the pipeline is timed this long after its first batch...
MAX_BATCHES = 2000     # ...or for this many batches
MIN_BATCHES = 3        # fewer (a dataset that ends): not measured
CHUNKS = 4             # the rate is the median of this many runs of batches
RELEASE_WAIT = 2.0     # seconds to wait for the run's iterators to be deleted, at most


def measure_input(run: Run, user_ns: dict[str, Any] | None) -> InputRate | str:
    """``run``'s input pipeline timed alone (see the module docstring), or why it was not;
    its data read from ``user_ns``, the notebook's namespace (None: no notebook, a Run
    explained from a script). Kept on the run once measured."""
    if isinstance(run.input_rate, InputRate):
        return run.input_rate
    why = _unmeasurable(run)
    if why is not None:
        return why
    name = run.step_cell.spec.data
    if user_ns is None:
        return "no notebook holds its data"
    import tensorflow as tf

    dataset = user_ns.get(name)
    if not isinstance(dataset, tf.data.Dataset):
        return (f"--data {name} is no longer in the notebook" if dataset is None
                else f"--data {name} is not a tf.data.Dataset")
    measured = time_pipeline(dataset)
    if isinstance(measured, InputRate):
        RunWriter(run).update(input_rate=measured)
    return measured



def _unmeasurable(run: Run) -> str | None:
    if run.mode == "step" and run.steps_done < STEADY_FROM + 3:
        return "it has too few steps to explain"
    if run.status == "running":
        return "the run is training (timing its pipeline beside it would slow both)"
    if run.mode != "step":
        return "it is a Keras fit"
    if not family(run.strategy).in_kernel:
        return f"its dataset lives on the {run.strategy} workers"
    if run.step_cell is None:
        return "it keeps no step cell (loaded from a file, or made outside a step cell)"
    return None


def time_pipeline(dataset: Any) -> InputRate | str:
    """``dataset`` iterated alone on an iterator of its own: its wall and CPU time per
    element, and its stages; a sentence where it gave too few elements to time."""
    import os

    from ..data.iterate import new_iterator, release, wait_released
    from ..hooks.tf_data import pipeline_stages

    started = time.perf_counter()
    # the run's own iterators, still being deleted, would compete with the pipeline timed
    wait_released(RELEASE_WAIT)
    iterator = new_iterator(dataset)
    try:
        try:
            first = next(iterator)   # the pipeline starting: not its rate
        except StopIteration:
            return "its dataset is empty"
        cpu, since = time.process_time(), time.perf_counter()
        stamps = [since]
        while len(stamps) <= MAX_BATCHES and stamps[-1] - since < SECONDS:
            try:
                next(iterator)
            except StopIteration:
                break
            stamps.append(time.perf_counter())
        cpu = time.process_time() - cpu
    finally:
        iterator = release(iterator)
    batches = len(stamps) - 1
    if batches < MIN_BATCHES:
        return f"its dataset ended after {batches + 1} batches"
    return InputRate(ms_per_batch=_typical_ms(stamps), cpu_ms_per_batch=cpu / batches * 1e3,
                     batches=batches, seconds=time.perf_counter() - started,
                     stages=tuple(pipeline_stages(dataset) or ()),
                     cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else (os.cpu_count() or 1), batch=_examples(first))


def _typical_ms(stamps: list[float]) -> float:
    """ms per batch: the median of ``CHUNKS`` runs of consecutive batches' means (a burst of
    load from elsewhere on the machine slows one run, not the measurement)."""
    import statistics

    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    size = max(len(gaps) // CHUNKS, 1)
    means = [sum(gaps[i:i + size]) / len(gaps[i:i + size]) for i in range(0, len(gaps), size)]
    return statistics.median(means) * 1e3


def _examples(element: Any) -> int:
    """The leading dimension of an element's first tensor with one (0: none has)."""
    import tensorflow as tf

    for leaf in tf.nest.flatten(element):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return 0
