"""The distributed training loop of step mode.

``StepRunner`` compiles the user's per-replica step (from ``rewrite``) twice with
``tf.function``: an untimed variant run on most steps and a timed one run only as often as
keeps its extra cost under 1% (``TimingPacer``), so measuring the allreduce costs almost
nothing. After their first call both are called through ``fastcall.FastCall``, which skips
``tf.function``'s per-call argument binding. It iterates the distributed dataset
(``data.distributed_input``: the ``--data`` dataset distributed with the strategy, a dataset
function given to ``distribute_datasets_from_function``, or the user's own), runs
``strategy.run`` and appends every step's per-replica numbers to a ``Run``. What ends a run
(stop, interrupt, error, checkpoint resume) is ``steploop.StepLoop``'s, shared with the
parameter-server loop.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .fastcall import FastCall
from .hooks.tensorflow import quiet_retracing_warning
from .kerashooks import call_building_optimizers, unsynced_batchnorm, unsynced_batchnorm_note
from .steploop import StepLoop
from .strategies import StrategyHandle
from .telemetry.collectives import T_GRAD_START, split_timing
from .telemetry.probe import StepProbe


@dataclass
class StepRunner(StepLoop):
    """Runs a rewritten step cell over a dataset under a strategy, recording into ``run``."""

    handle: StrategyHandle = field(kw_only=True)
    _compiled: dict[bool, Any] = field(default_factory=dict)   # timed? -> FastCall of it
    _timed_probe: StepProbe | None = None
    _keys: dict[bool, list[str]] = field(default_factory=dict)   # rows of the step's output
    fast_calls: ClassVar[bool] = True   # call the traced step through nbdist.fastcall

    def _compile(self, timed: bool) -> Any:
        """A fresh tf.function running the step on every replica and stacking the results."""
        import tensorflow as tf

        probe = StepProbe(timed=timed, loss_name=self.spec.loss, grads_name=self.spec.grads)
        if timed:
            self._timed_probe = probe
        replica_fn = self._factory(probe)
        strategy = self.handle.strategy

        keys = self._keys.setdefault(timed, [])

        def train_step(dist_batch: Any) -> Any:
            # One [metrics, replicas] float64 tensor: one host fetch per step, not one per
            # metric (float64 keeps tf.timestamp's precision; float32 losses convert exactly).
            out = strategy.run(replica_fn, args=(dist_batch,))
            keys[:] = list(out)
            return tf.stack([
                tf.cast(tf.stack(strategy.experimental_local_results(v)), tf.float64)
                for v in out.values()
            ])

        compiled = tf.function(train_step)
        # Each cell compiles a fresh tf.function of this same code, and FastCall's calls do not
        # count as calls for TensorFlow, so after a few cells it would warn about "frequent
        # retracing" of train_step: wrong here, and noise in the user's output.
        quiet_retracing_warning(compiled)
        if not timed:
            return compiled

        def call_timed(dist_batch: Any) -> Any:
            with probe.hooked():   # the hook only matters while (re)tracing, but is cheap
                return compiled(dist_batch)

        call_timed.tf_function = compiled   # type: ignore[attr-defined] # for on_traced
        return call_timed

    def _loop(self, first_epoch: int, first_step: int) -> None:
        dist_ds = self.dataset   # distributed already (data.distributed_input)
        step = first_step
        pacer = TimingPacer(self.spec.timing_every)
        for epoch in range(first_epoch, self.spec.epochs):
            self._epoch = epoch
            for batch, data_ms in _timed_batches(dist_ds, self.spec.steps):
                timed = pacer.due(step)
                traced = timed not in self._compiled
                step_ms = self._one_step(step, epoch, batch, data_ms, timed)
                if not traced:
                    pacer.observe(step, step_ms, timed)
                step += 1
                self.notify()
                if self.should_stop():
                    return
            if self.checkpoint is not None:
                self.checkpoint.save(epoch + 1, step)

    def _done(self) -> None:
        every = self.spec.timing_every
        probe = self._timed_probe
        if probe and probe.attribution:
            self.run.allreduce_bytes = probe.allreduce_bytes
            if probe.attribution.others:
                self.run.note(probe.attribution.describe())
        elif every is None or every > 0:
            self.run.note("no all_reduce was seen in the step, so allreduce_ms is not measured")

    def _one_step(self, step: int, epoch: int, batch: Any, data_ms: float, timed: bool) -> float:
        start = time.perf_counter()
        fn = self._compiled.get(timed)
        if fn is not None:
            out = fn(batch)
        else:  # first call: traces, and may have to build a Keras optimizer first
            replicas = self.handle.strategy.num_replicas_in_sync
            unsynced: list[str] = []
            with (unsynced_batchnorm(unsynced) if replicas > 1 else contextlib.nullcontext(),
                  self.tracing()):
                fn, out = call_building_optimizers(
                    lambda: self._compile(timed), batch, self.handle.strategy)
            if unsynced:
                self.run.note(unsynced_batchnorm_note(unsynced, replicas))
            tf_function = getattr(fn, "tf_function", fn)
            self._compiled[timed] = (FastCall(tf_function, batch, fallback=fn)
                                     if self.fast_calls else fn)
            self.traced(tf_function, batch, timed)   # e.g. `%%distribute --graph`
        values = dict(zip(self._keys[timed], out.numpy(), strict=True))
        step_ms = (time.perf_counter() - start) * 1e3
        timing = split_timing(values) if T_GRAD_START in values else {}
        self.run.record_step(
            step, epoch,
            loss=values["loss"].tolist(),
            grad_norm=values["grad_norm"].tolist() if "grad_norm" in values else None,
            step_ms=step_ms, data_ms=data_ms, **timing,
        )
        probe = self._timed_probe
        if timed and self.run.allreduce_bytes is None and probe and probe.attribution:
            self.run.allreduce_bytes = probe.allreduce_bytes   # live bus bandwidth (dashboard)
        return step_ms


class TimingPacer:
    """Decides which steps run the timed variant.

    ``every=K`` times exactly every K-th step (0: never). ``every=None`` (the default) is
    automatic: the timed step is slower (its timestamps serialise the step; on a tiny MLP here
    ~1.9 ms more than a 2.3 ms untimed step), so timed steps are spaced so that their extra
    cost stays under ``budget`` of the run's time: at least every 5th step apart, and at most
    every 100th step or every ``max_gap_ms`` of training, whichever is more steps (on a step
    of a millisecond, sampling every 100th step would spend several percent on timing).
    """

    budget = 0.01
    min_gap = 5
    max_gap = 100         # still sample the allreduce at least this often (in steps)...
    max_gap_ms = 500.0    # ...or this often in time, for steps too quick for the budget

    def __init__(self, every: int | None):
        self.auto = every is None
        self.every = self.min_gap if every is None else every
        self.next = 0
        self.plain_ms: float | None = None
        self.timed_ms: float | None = None

    def due(self, step: int) -> bool:
        return self.every > 0 and step >= self.next

    def observe(self, step: int, step_ms: float, timed: bool) -> None:
        if timed:
            self.timed_ms = _ema(self.timed_ms, step_ms)
        else:
            self.plain_ms = _ema(self.plain_ms, step_ms)
        if not timed or self.every <= 0:
            return
        gap = self.every
        if self.auto and self.plain_ms and self.timed_ms:
            extra = max(0.0, self.timed_ms - self.plain_ms)
            longest = max(self.max_gap, math.ceil(self.max_gap_ms / self.plain_ms))
            gap = max(gap, min(longest, math.ceil(extra / (self.budget * self.plain_ms))))
        self.next = step + gap


def _ema(previous: float | None, value: float, weight: float = 0.2) -> float:
    return value if previous is None else (1 - weight) * previous + weight * value


def _timed_batches(dist_ds: Any, max_steps: int | None) -> Iterator[tuple[Any, float]]:
    """Yield (batch, milliseconds spent fetching it), at most ``max_steps`` per epoch."""
    iterator = iter(dist_ds)
    count = 0
    while max_steps is None or count < max_steps:
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            return
        count += 1
        yield batch, (time.perf_counter() - start) * 1e3

