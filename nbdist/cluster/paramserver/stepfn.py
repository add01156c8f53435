"""The ``tf.function`` a parameter-server step cell schedules (``steps.PSStepLoop``).

It takes the next batch from a per-worker iterator, runs the step with ``strategy.run`` and
packs its row into one float64 vector: the loss, the gradient norm, the worker that ran it
(``tf.distribute.coordinator.experimental_get_current_worker_index``) and in-graph
timestamps; ``SPANS`` turns the timestamps into the Run's millisecond columns. The step also
reads its position among its worker's steps of the run from a second per-worker iterator
(``worker_positions``, a fresh one per run): on position 0 the row carries the digest of the
batch (``data.fingerprint.graph_digest``: the kernel compares the workers'), on the others
-1, so only each worker's first batch is hashed. The row is
appended to the worker's own ring (``rowbuffer``) and the function returns nothing: the
coordinator copies every returned tensor back with an RPC of its own, at once.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ...data.fingerprint import graph_digest
from ...data.freshstack import on_fresh_stack
from ...spec import RunSpec
from ...telemetry.probe import StepProbe
from .instrument import UpdateTimer
from .rowbuffer import WorkerRows

#: The row's entry holding the first batch's digest (-1 on a worker's later steps).
DIGEST = "input_digest"
SPANS = {"step_ms": ("t_start", "t_end"), "data_ms": ("t_start", "t_begin"),
         "compute_ms": ("t_begin", "t_update_start"),
         "update_ms": ("t_update_start", "t_update_end")}


def compile_step(factory: Any, spec: RunSpec, strategy: Any, timed: bool,
                 columns: dict[bool, list[str]], rows: WorkerRows) -> Any:
    """The step as a ``tf.function`` of the per-worker iterators ``(batches, positions)``
    (``worker_positions``), appending its row to ``rows``; tracing it sets ``columns[timed]``
    to the names of the row's entries. ``timed`` adds the parameter update's timestamps
    (``instrument.UpdateTimer``)."""
    import tensorflow as tf

    probe = StepProbe(timed=False, loss_name=spec.loss, grads_name=spec.grads)
    replica_fn = factory(probe)
    timer = UpdateTimer() if timed else None

    def train_step(iterators: Any) -> Any:
        iterator, positions = iterators
        t_start = tf.timestamp()
        batch = next(iterator)
        with tf.control_dependencies(_tensors(batch)):
            t_begin = tf.timestamp()
        with timer.hooked() if timer else contextlib.nullcontext():
            out = strategy.run(replica_fn, args=(batch,))
        out = {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}
        if timer and timer.spans:
            out["t_update_start"], out["t_update_end"] = timer.spans[0][0], timer.spans[-1][1]
        with tf.control_dependencies(_tensors(out)):
            out["t_end"] = tf.timestamp()
        out.update(t_start=t_start, t_begin=t_begin,
                   worker=tf.distribute.coordinator.experimental_get_current_worker_index())
        out[DIGEST] = tf.cond(tf.equal(next(positions), 0), lambda: graph_digest(batch),
                              lambda: tf.constant(-1, tf.int64))
        columns[timed] = names = sorted(out)
        rows.append(timed, tf.stack([tf.reshape(tf.cast(out[k], tf.float64), [])
                                     for k in names]))

    return tf.function(train_step)


def worker_positions(strategy: Any, coordinator: Any) -> Any:
    """A per-worker dataset counting 0, 1, 2, ...: an iterator of it made for a run tells
    each step its position among its worker's steps of that run (``compile_step``)."""
    import tensorflow as tf

    def build() -> Any:
        with strategy.scope():
            return coordinator.create_per_worker_dataset(lambda: tf.data.Dataset.counter())

    return on_fresh_stack(build)


class Scheduler:
    """Calls ``fn`` through the coordinator (so ``call_building_optimizers`` can retry it)."""

    def __init__(self, coordinator: Any, fn: Any):
        self.coordinator, self.fn = coordinator, fn

    def __call__(self, iterators: Any) -> Any:
        return self.coordinator.schedule(self.fn, args=(iterators,))


def _tensors(structure: Any) -> list[Any]:
    import tensorflow as tf

    return [t for t in tf.nest.flatten(structure) if isinstance(t, tf.Tensor)]
