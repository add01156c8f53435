"""The distributed training loop of step mode.

``StepRunner`` compiles the user's per-replica step (from ``rewrite``) twice with
``tf.function``: an untimed variant run on most steps and a timed one run only as often as
keeps its extra cost under 1% (``TimingPacer``), so measuring the allreduce costs almost
nothing. After their first call both are called through ``fastcall.FastCall``, which skips
``tf.function``'s per-call argument binding. It iterates the distributed dataset
(``data.distributed_input``: the ``--data`` dataset distributed with the strategy, a dataset
function given to ``distribute_datasets_from_function``, or the user's own), runs
``strategy.run`` and appends every step's per-replica numbers to a ``Run``. With
``--steps-per-call`` each call runs several steps (``step.groups``). A re-run of an unchanged
cell reuses the traced variants (``step.cache``). What ends a run (stop, interrupt, error,
checkpoint resume) is ``step.loop.StepLoop``'s, shared with the parameter-server loop.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..allocator import keep_large_buffers
from ..data.batchsizes import replica_shapes
from ..data.iterate import new_iterator, release, skip_batches, timed_batches
from ..hooks.tensorflow import quiet_retracing_warning
from ..strategies import StrategyHandle
from ..telemetry.collectives import T_GRAD_START, split_timing
from ..telemetry.probe import BATCH_SIZE, StepProbe
from ..telemetry.rows import LOSS_SCALE_FACTOR
from ..telemetry.run import RunWriter
from ..words import count
from . import groups
from .fastcall import FastCall
from .keras_builds import call_building_optimizers, unsynced_batchnorm, unsynced_batchnorm_note
from .loop import StepLoop
from .pacing import TimingPacer


@dataclass
class StepRunner(StepLoop):
    """Runs a rewritten step cell over a dataset under a strategy, recording into ``run``."""

    handle: StrategyHandle = field(kw_only=True)
    #: Called with the run's first batch (one step per call only): a worker's input check.
    on_first_batch: Callable[[Any], None] | None = field(default=None, kw_only=True)
    _timed_probe: StepProbe | None = None
    _untimed_probe: StepProbe | None = None
    _no_allreduce: int = 0   # timed steps whose gradient all-reduce did not run
    _first_step: int = 0

    @property
    def grouped(self) -> bool:
        """Several steps per compiled call (``--steps-per-call``, ``step.groups``)."""
        return self.spec.steps_per_call != 1

    def _compile(self, timed: bool) -> Any:
        """A fresh tf.function running the step on every replica and stacking the results:
        one step of a distributed batch, or (``grouped``) up to n steps of an iterator."""
        import tensorflow as tf

        strategy = self.handle.strategy
        probe = StepProbe(timed=timed, loss_name=self.spec.loss, grads_name=self.spec.grads,
                          strategy=strategy)
        if timed:
            self._timed_probe = probe
        else:
            self._untimed_probe = probe
        replica_fn = self._factory(probe)

        keys = self._keys.setdefault(timed, [])
        stack = groups.unconverted_stack()

        def train_step(dist_batch: Any) -> Any:
            with probe.tracing():   # (re)traced only: its hooks cost nothing per call
                out = strategy.run(replica_fn, args=(dist_batch,))
            keys[:] = list(out)
            return stack(strategy, out)

        compiled = (groups.compile_group(strategy, replica_fn, keys, probe.tracing)
                    if self.grouped else tf.function(train_step))
        # Each cell compiles a fresh tf.function of this same code, and FastCall's calls do not
        # count as calls for TensorFlow, so after a few cells it would warn about "frequent
        # retracing" of train_step: wrong here, and noise in the user's output.
        quiet_retracing_warning(compiled)
        return compiled

    # -- what a kept trace needs (``step.cache``) --------------------------------------------
    def _strategy(self) -> Any:
        return self.handle.strategy

    def _kept(self) -> Any:
        return self._timed_probe   # the timed variant reports through it

    def _restored(self, kept: Any) -> None:
        self._timed_probe = kept

    # -- the loops -------------------------------------------------------------------------
    def _loop(self, first_epoch: int, first_step: int) -> None:
        if self.grouped:
            self._loop_groups(first_epoch, first_step)
            return
        dist_ds = self.dataset   # distributed already (data.distributed_input)
        step = self._first_step = first_step
        pacer = TimingPacer(self.spec.timing_every)
        for epoch in range(first_epoch, self.spec.epochs):
            self._epoch = epoch
            first = self.on_first_batch if epoch == first_epoch else None
            into = skip = self._skipped(epoch, first_epoch)
            for batch, data_ms in timed_batches(dist_ds, self.spec.steps, first, skip):
                # with the next batch in hand, the epoch goes on: not a save its end repeats
                if self._save_due(step, into):
                    self._save_inside(epoch, step, into)
                into += 1
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

    def _skipped(self, epoch: int, first_epoch: int) -> int:
        """The batches of ``epoch`` to skip: in the epoch a checkpoint was taken inside, those
        trained on before it."""
        if self.checkpoint is None or epoch != first_epoch:
            return 0
        return self.checkpoint.skip

    def _save_due(self, step: int, into: int) -> bool:
        """--checkpoint-every K: whether to save before ``step``, ``into`` steps into its
        epoch (never at its start: the epoch's end was saved; nor where the run resumed)."""
        every = self.spec.checkpoint_every
        return (self.checkpoint is not None and every is not None and into > 0
                and step % every == 0 and step != self._first_step)

    def _save_inside(self, epoch: int, step: int, into: int) -> None:
        """Save ``into`` steps into ``epoch`` (a kernel interrupt meanwhile waits for it)."""
        self.interrupts.hold()
        self.checkpoint.save(epoch, step, into)
        self.interrupts.release()

    def _loop_groups(self, first_epoch: int, first_step: int) -> None:
        """``--steps-per-call``: calls of several steps; a timed step is a call of its own;
        stop, checkpoints and epochs at call boundaries (a call never spans two epochs)."""
        agree = groups.agreement(self.handle.strategy)
        sizer = groups.CallSizer(self.spec.steps_per_call, agree)
        pacer = TimingPacer(self.spec.timing_every, agree)
        self.run.note(groups.GROUPED_NOTE)
        step = self._first_step = first_step
        for epoch in range(first_epoch, self.spec.epochs):
            self._epoch = epoch
            iterator = new_iterator(self.dataset)
            try:
                skip = self._skipped(epoch, first_epoch)
                if skip:
                    self._trace_groups((iterator, groups.steps_tensor(1)))
                    skip_batches(iterator, skip)   # fewer if the data ended: a call runs none
                step, stop = self._group_epoch(sizer, pacer, iterator, epoch, step, skip)
            finally:
                iterator = release(iterator)   # deleting it can take a minute (data.iterate)
            if stop:
                return
            if self.checkpoint is not None:
                self.checkpoint.save(epoch + 1, step)
        if sizer.note():
            self.run.note(sizer.note())

    def _group_epoch(self, sizer: groups.CallSizer, pacer: TimingPacer, iterator: Any,
                     epoch: int, step: int, into: int = 0) -> tuple[int, bool]:
        """One epoch of ``_loop_groups`` from ``step``, ``into`` steps into it (its batches
        skipped already): the next step, and whether to stop."""
        left = None if self.spec.steps is None else self.spec.steps - into
        every = self.spec.checkpoint_every
        first_call = True
        while left is None or left > 0:
            if self._save_due(step, into):
                self._save_inside(epoch, step, into)
            timed = pacer.due(step)
            wanted = 1 if timed else sizer.size()
            if not timed and pacer.every > 0 and pacer.next > step:   # end before it
                wanted = min(wanted, pacer.next - step)
            if every is not None and self.checkpoint is not None:   # end where one is saved
                wanted = min(wanted, every - step % every)
            wanted = wanted if left is None else min(wanted, left)
            traced = timed not in self._compiled
            ran, call_ms = self._group(step, epoch, iterator, wanted, timed)
            if first_call:   # the epoch's first call made the iterator's pipelines
                keep_large_buffers()
                first_call = False
            if ran and not traced:
                pacer.observe(step, call_ms / ran, timed)
                if not timed:
                    sizer.observe(ran, call_ms)
            step += ran
            into += ran
            left = None if left is None else left - ran
            self.notify()
            if self.should_stop():
                return step, True
            if ran < wanted:   # the data ended
                break
        return step, False

    def _done(self) -> None:
        every = self.spec.timing_every
        probe = self._timed_probe
        if probe and probe.attribution:
            RunWriter(self.run).update(allreduce_bytes=probe.allreduce_bytes)
            if probe.attribution.others:
                self.run.note(probe.attribution.describe())
        elif every is None or every > 0:
            self.run.note("no all_reduce was seen in the step, so allreduce_ms is not measured")
        if self._no_allreduce:
            self.run.note(SKIPPED_NOTE.format(steps=count(self._no_allreduce, "timed step")))

    # -- calls -----------------------------------------------------------------------------
    def _call(self, timed: bool, arg: Any) -> Any:
        """Call the compiled variant (traced first if it is not yet)."""
        fn = self._compiled.get(timed)
        if fn is None:
            fn = self._trace(timed, arg)
        else:
            self._first_call(timed, arg)
        self.interrupts.hold()   # released once the call's rows are recorded
        return fn(arg)

    def _trace(self, timed: bool, arg: Any) -> Any:
        """Compile and trace a variant for ``arg`` (building any Keras optimizer or model it
        needs first), keep it, tell the observers that want it (``--graph``, checkpoints)."""
        replicas = self.handle.strategy.num_replicas_in_sync
        unsynced: list[str] = []
        with (unsynced_batchnorm(unsynced) if replicas > 1 else contextlib.nullcontext(),
              self.tracing()):
            fn, _ = call_building_optimizers(lambda: self._compile(timed), arg,
                                             self.handle.strategy, first_call=_trace_only)
        notes = [unsynced_batchnorm_note(unsynced, replicas)] if unsynced else []
        probe = self._timed_probe if timed else self._untimed_probe
        if probe is not None and probe.unscaled:
            notes.append(UNSCALED_NOTE.format(grads=self.source.grads))
        for text in notes:
            if text not in self._trace_notes:
                self._trace_notes.append(text)
            self.run.note(text)
        if probe is not None:
            self._report_loss(probe.loss_form, replicas)
        self._keep_variant(timed, arg, fn, FastCall(fn, arg, fallback=fn))
        return self._compiled[timed]

    def _one_step(self, step: int, epoch: int, batch: Any, data_ms: float, timed: bool) -> float:
        start = time.perf_counter()
        out = self._call(timed, batch)
        values = dict(zip(self._keys[timed], out.numpy(), strict=True))
        step_ms = (time.perf_counter() - start) * 1e3
        self._record(step, epoch, values, step_ms, data_ms, timed, batch=batch)
        self.interrupts.release()
        return step_ms

    def _trace_groups(self, arg: Any) -> None:
        """Trace every variant before any of them runs on the iterator: a trace after a call
        (or a skip) that read from it can make deleting the iterator block for tens of seconds
        (data/iterate.py explains why)."""
        for variant in (False, True) if self.spec.timing_every != 0 else (False,):
            if variant not in self._compiled:
                self._trace(variant, arg)

    def _group(self, step: int, epoch: int, iterator: Any, wanted: int,
               timed: bool) -> tuple[int, float]:
        """One call of up to ``wanted`` steps; returns how many ran and the call's ms."""
        start = time.perf_counter()
        arg = (iterator, groups.steps_tensor(wanted))
        if step == self._first_step:
            self._trace_groups(arg)
        try:
            rows, stamps, count = self._call(timed, arg)
        except Exception:
            self.run.note(groups.lost_rows_note(step, wanted))
            raise
        rows, stamps, ran = rows.numpy(), stamps.numpy(), int(count)
        call_ms = (time.perf_counter() - start) * 1e3
        keys = self._keys[timed]
        for i in range(ran):
            values = dict(zip(keys, rows[i], strict=True))
            self._record(step + i, epoch, values, (stamps[i + 1] - stamps[i]) * 1e3,
                         math.nan, timed, wall_time=float(stamps[i + 1]))
        self.interrupts.release()
        return ran, call_ms

    def _record(self, step: int, epoch: int, values: dict[str, Any], step_ms: float,
                data_ms: float, timed: bool, wall_time: float | None = None,
                batch: Any = None) -> None:
        """Append a step's rows; ``batch``: its distributed batch, when at hand (its shapes
        explain a NaN from an empty batch)."""
        timing = split_timing(values) if T_GRAD_START in values else {}
        if timing and all(math.isnan(v) for v in timing["allreduce_ms"]):
            self._no_allreduce += 1
        losses = values["loss"].tolist()
        scale = values.get(LOSS_SCALE_FACTOR)
        RunWriter(self.run).record_step(
            step, epoch,
            loss=losses,
            grad_norm=values["grad_norm"].tolist() if "grad_norm" in values else None,
            step_ms=step_ms, data_ms=data_ms, wall_time=wall_time, **timing,
            extra={LOSS_SCALE_FACTOR: scale} if scale is not None else None,
        )
        probe = self._timed_probe
        if timed and self.run.allreduce_bytes is None and probe and probe.attribution:
            # the live bus bandwidth (dashboard)
            RunWriter(self.run).update(allreduce_bytes=probe.allreduce_bytes)
        sizes = values[BATCH_SIZE].tolist() if BATCH_SIZE in values else None
        shapes = (None if batch is None else
                  lambda: replica_shapes(self.handle.strategy, batch))
        # on a worker, the kernel names the worker
        self.check_finite(step, losses, sizes=sizes, shapes=shapes)


#: The Run's note when the cell's gradients are those of a scaled loss (mixed precision).
UNSCALED_NOTE = ("grad_norm is the norm of `{grads}` divided by the loss scale: `{grads}` are "
                 "gradients of the loss the optimizer scaled (scale_loss / get_scaled_loss, "
                 "mixed precision), so their own norm is the true one times the scale; each "
                 "step's scale is the loss_scale_factor column of run.metrics")

#: The Run's note when timed steps made no gradient all-reduce (a loss scale optimizer
#: skipped them).
SKIPPED_NOTE = ("allreduce_ms, wait_ms and compute_ms are NaN on {steps} whose gradient "
                "all-reduce did not run: a loss scale optimizer skips the update of a step "
                "whose gradients are not finite and halves its loss scale (the "
                "loss_scale_factor column)")


def _trace_only(fn: Any, arg: Any) -> Any:
    """Trace a compiled variant for ``arg`` without running it."""
    return fn.get_concrete_function(arg)
