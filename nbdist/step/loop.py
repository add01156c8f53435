"""The skeleton of step mode, shared by every strategy family.

``StepLoop.execute`` loads the generated step (``rewrite``), resumes from ``--checkpoint``,
runs the family's loop and turns what ends it into the Run's status: ``done``, ``stopped`` (an
observer asked: the Stop button), ``interrupted`` (a kernel interrupt: the rows so far are
kept) or ``failed`` (the error is raised again, mapped to the user's cell line when it came
from inside ``strategy.run``). A family supplies only how steps are scheduled:

* ``runner.StepRunner``: ``strategy.run`` over a distributed dataset, in the kernel or in
  each multiworker worker;
* ``cluster.paramserver.steps.PSStepLoop``: ``ClusterCoordinator.schedule`` on the workers.

The loop keeps the variants it traced (untimed and timed): given the backend's ``cache``, a
re-run of the same cell adopts the ones an earlier run traced, if nothing they depend on
changed (``step.cache``), and keeps its own for the next.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data.batchsizes import ReplicaBatches
from ..errors import (
    CheckpointError,
    NbdistWarning,
    NonFiniteLoss,
    RunInterrupted,
    StepCodeError,
)
from ..hooks.tf_gradients import recording_gradient_registrations, release_gradient_registrations
from ..interrupts import HeldInterrupts
from ..spec import RunSpec
from ..telemetry.lossform import LossForm, global_loss, recording_divisions, remember_reduction
from ..telemetry.run import Run, RunObserver, RunWriter
from . import errormap
from .cache import StepCache, TracedStep, adopted_source, cell_key, depends_on, execute_cached
from .gradcheck import checking_gradients, checking_loss
from .rewrite import StepSource


@dataclass
class StepLoop:
    """A step cell's training loop; subclasses implement ``_loop`` (and may refine hooks)."""

    source: StepSource
    user_ns: dict[str, Any]
    spec: RunSpec
    run: Run
    observers: list[RunObserver] = field(default_factory=list)
    checkpoint: Any = None   # nbdist.checkpoint.StepCheckpoint, for --checkpoint DIR
    dataset: Any = None      # the --data input, checked and distributed (cells.step_data):
                             # per-worker under parameter_server
    _factory: Any = None     # the generated ``make_step(probe)``
    _epoch: int = 0          # the epoch under way (for messages)
    _gradient_keys: list[str] = field(default_factory=list)   # what tracing registered
    _variable_sites: errormap.VariableSites | None = None   # where tracing created variables
    interrupts: HeldInterrupts = field(default_factory=HeldInterrupts)   # hold() over a call
    cache: StepCache | None = field(default=None, kw_only=True)   # the backend's traced steps
    _compiled: dict[bool, Any] = field(default_factory=dict)   # timed? -> what the loop calls
    _functions: dict[bool, Any] = field(default_factory=dict)  # timed? -> its tf.function
    _keys: dict[bool, list[str]] = field(default_factory=dict)   # timed? -> its output's rows
    _trace_notes: list[str] = field(default_factory=list)      # the Run's notes from tracing
    _announced: set[bool] = field(default_factory=set)         # variants told to observers
    _batches: ReplicaBatches | None = None   # each replica's batch sizes (data.batchsizes)

    # -- what a family provides ------------------------------------------------------------
    def _loop(self, first_epoch: int, first_step: int) -> None:
        """Run the steps from ``first_epoch``/``first_step`` on; record them into the Run.
        ``RunWriter(self.run).finish("stopped")`` and return when an observer asks to stop."""
        raise NotImplementedError

    def _running(self) -> contextlib.AbstractContextManager[Any]:
        """A context around the loop (e.g. quieter logs)."""
        return contextlib.nullcontext()

    def _interrupted(self) -> str:
        """After a kernel interrupt, before the Run is marked interrupted: the message."""
        return (f"Interrupted after step {self.run.steps_done} (epoch {self._epoch + 1}); the "
                "steps finished so far are kept in nbdist.runs[-1] "
                f"(run {self.run.id}).")

    def _failure(self, err: Exception) -> BaseException | None:
        """A clearer error to raise instead of ``err`` (None: map it to the cell line)."""
        return None

    def _done(self) -> None:
        """Just before a run that was not stopped is marked done."""

    def _wind_down(self) -> None:
        """After the loop raised between steps (a non-finite loss): let what it started end."""

    def _strategy(self) -> Any:
        """The strategy the step is traced under (a kept trace is for it only)."""
        raise NotImplementedError

    @property
    def grouped(self) -> bool:
        """Several steps per compiled call (``--steps-per-call``): another trace."""
        return False

    def _kept(self) -> Any:
        """What the family keeps with its traced variants (``_restored`` takes it back)."""
        return None

    def _restored(self, kept: Any) -> None:
        """Take back what ``_kept`` returned when an earlier run of the cell ended."""

    # -- the skeleton ----------------------------------------------------------------------
    def load(self) -> None:
        """Compile the generated step source; the tf.functions are made on first use."""
        namespace: dict[str, Any] = {}
        self.source.register()
        code = compile(self.source.source, self.source.filename, "exec", dont_inherit=True)
        # The step's globals are the user's namespace, so the cell sees the notebook's names.
        exec(code, self.user_ns, namespace)  # noqa: S102 - code generated by rewrite from the AST
        self._factory = checking_loss(namespace[self.source.factory_name], self.source.loss)

    def execute(self) -> Run:
        """Train for the requested epochs/steps; return the finished Run. With a ``cache``,
        start from the variants an earlier run of the same cell traced, if still valid."""
        if self.cache is None:
            return self._execute()
        return execute_cached(self.cache, cell_key(self.source, self.grouped), self._depends,
                              self._adopt, self._execute, self._traced_step)

    def _execute(self) -> Run:
        """One run: load the step, resume, loop, and turn how it ended into the status."""
        if self._factory is None:
            self.load()
        run = self.run
        try:
            first_epoch = first_step = 0
            if self.checkpoint is not None:
                # as an observer its on_traced checks that it saves what the step trains
                self.observers = [*self.observers, self.checkpoint]
                first_epoch, first_step = self.checkpoint.restore(
                    self.spec.epochs, run, self.spec.checkpoint_every)
                if self.spec.elastic and (first_epoch, first_step) == (0, 0):
                    # what fresh workers restore if one dies before the first epoch ends:
                    # the weights earlier cells trained, which no replay gives back
                    self.checkpoint.save(0, 0)
            self._epoch = first_epoch
            with self._running(), self.interrupts, recording_divisions():
                self._loop(first_epoch, first_step)
        except KeyboardInterrupt:
            message = self._interrupted()
            RunWriter(run).finish("interrupted")
            raise RunInterrupted(message) from None
        except (StepCodeError, CheckpointError) as err:
            if isinstance(err, NonFiniteLoss):
                self._wind_down()
            RunWriter(run).finish("failed", str(err))
            raise
        except Exception as err:
            clearer = self._failure(err)
            if clearer is not None:
                RunWriter(run).finish("failed", str(clearer))
                if clearer is err:
                    raise
                raise clearer from None
            mapped = errormap.to_cell_error(err, self.source, self._variable_sites,
                                            self._batch_spec())
            RunWriter(run).finish("failed", str(mapped or err))
            if mapped is not None:
                raise mapped from err
            raise
        if run.status == "running":
            self._done()
            if self.checkpoint is not None:
                self.checkpoint.complete()
            RunWriter(run).finish("done")
        return run

    def _batch_spec(self) -> Any:
        """The ``--data`` dataset's element_spec, when it is a tf.data.Dataset (for errors
        from using ``batch`` as another structure)."""
        import tensorflow as tf

        data = self.user_ns.get(self.spec.data) if self.spec.data else None
        return data.element_spec if isinstance(data, tf.data.Dataset) else None

    # -- traced variants, kept for the next run of the same cell (``step.cache``) ----------
    def _keep_variant(self, timed: bool, arg: Any, function: Any, call: Any = None) -> None:
        """Keep a variant just traced for ``arg``: ``function`` is its tf.function, ``call``
        what the loop calls (the function itself by default); tell the observers."""
        self._functions[timed] = function
        self._compiled[timed] = function if call is None else call
        self._announced.add(timed)
        self.traced(function, arg, timed)   # e.g. `%%distribute --graph`

    def _first_call(self, timed: bool, arg: Any) -> None:
        """Before each call of a kept variant: the first call of one an earlier run of this
        cell traced tells the observers about it, as tracing it would have."""
        if timed not in self._announced:
            self._announced.add(timed)
            self.traced(self._functions[timed], arg, timed)

    def _traced_step(self) -> TracedStep | None:
        if not self._compiled:
            return None
        return TracedStep(dict(self._compiled), dict(self._functions), self._keys, self._kept(),
                          self._factory, self.source.filename, list(self._trace_notes),
                          loss_scale=self.run.loss_scale)

    def _depends(self) -> Any:
        return depends_on(self.source, self.user_ns, self._strategy(), self.dataset)

    def _adopt(self, entry: TracedStep) -> None:
        self._compiled.update(entry.compiled)
        self._functions.update(entry.functions)
        self._keys, self._factory = entry.keys, entry.factory
        self._restored(entry.kept)
        self.source = adopted_source(self.source, entry)
        self._trace_notes = list(entry.notes)
        RunWriter(self.run).update(loss_scale=entry.loss_scale)
        for text in entry.notes:
            self.run.note(text)

    def _report_loss(self, form: LossForm | None, replicas: int) -> None:
        """After a trace: how the Run's global loss comes from the replicas' losses, read
        from the traced loss (``telemetry.lossform``), its note among the trace's notes."""
        scale, note = global_loss(form, replicas, self.source.global_batch_loss)
        RunWriter(self.run).update(loss_scale=scale)
        if replicas > 1:
            remember_reduction(self.source.cell, scale)
        if note is not None and note not in self._trace_notes:
            self._trace_notes.append(note)
            self.run.note(note)

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """A context around tracing the step: records what it registers globally and where
        it creates variables (for errors that name no cell line)."""
        if self._variable_sites is None:
            self._variable_sites = errormap.VariableSites(self.source)
            self._warn_side_effects()
        with (recording_gradient_registrations(self._gradient_keys),
              self._variable_sites.recording(), checking_gradients(self.source.loss)):
            yield

    def _warn_side_effects(self) -> None:
        """Once, when the step is first traced: the Python side effects of the cell, which
        the compiled step runs only then."""
        for line, text, what in self.source.side_effects:
            warnings.warn(NbdistWarning(
                f"nbdist: cell line {line} `{text}` runs only while TensorFlow traces the step "
                f"(once), not at every step: it {what}."), stacklevel=2)

    def release(self) -> None:
        """Free what this loop's traced steps hold globally; call it once they are dropped
        (never while a traced step may still run or be differentiated)."""
        release_gradient_registrations(self._gradient_keys)

    def check_finite(self, step: int, losses: Sequence[float], worker: int | None = None,
                     sizes: Sequence[float] | None = None,
                     shapes: Callable[[], list[str]] | None = None) -> None:
        """Raise ``NonFiniteLoss`` if a replica's loss of ``step`` (just recorded) is NaN or
        infinite, naming the step, the replicas and what to try; with ``--checkpoint``, the
        last epoch saved stays for the next run to resume from. ``sizes``: each replica's batch
        size at this step (``telemetry.probe.BATCH_SIZE``): an empty or short batch is named
        as the cause, and noted on the Run once when it comes without a NaN; ``shapes``: the
        replicas' batch shapes, where the step's batch is at hand."""
        names = ([f"worker {worker}"] if worker is not None and len(losses) == 1 else
                 [f"replica {i}" + (f" of worker {worker}" if worker is not None else "")
                  for i in range(len(losses))])
        batches = self._replica_batches()
        note = batches.observe(sizes, step, names)
        if note:
            self.run.note(note)
        bad = [i for i, value in enumerate(losses) if not math.isfinite(value)]
        if not bad:
            return
        value = losses[bad[0]]
        where = (f"worker {worker}" if worker is not None and len(losses) == 1 else
                 f"replica{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}"
                 + (f" of worker {worker}" if worker is not None else ""))
        kept = ""
        if self.checkpoint is not None:
            saved = self.checkpoint.kept()
            kept = (f" {self.checkpoint.directory} keeps {saved}, the last good one: fix the "
                    "cause and run the cell again to resume from it."
                    if saved else
                    f" Nothing was saved before it, so {self.checkpoint.directory} holds "
                    "nothing to resume from.")
        advice = ("Usual causes: a learning rate too high (lower it, or clip the gradients with "
                  "tf.clip_by_global_norm), log or division of zero in the loss (add a small "
                  "epsilon), or NaN in the input (check the dataset).")
        cause = batches.nonfinite_cause(sizes, step, bad, names, shapes)
        if cause is not None:   # an empty batch is the cause; a short one may be
            text, certain = cause
            advice = text if certain else f"{text} {advice}"
        raise NonFiniteLoss(
            f"the loss is {value} at step {step} (epoch {self._epoch + 1}) on {where}, so "
            "training stopped there, as Keras' TerminateOnNaN does; the weights may hold "
            f"NaN now. The steps before it are in nbdist.runs[-1].{kept} {advice}"
        )

    def _replica_batches(self) -> ReplicaBatches:
        """The run's batch sizes per replica (made at its first step)."""
        if self._batches is None:
            value = self.user_ns.get(self.spec.data) if self.spec.data else None
            self._batches = ReplicaBatches.for_data(self.spec.data, value, self._replicas())
        return self._batches

    def _replicas(self) -> int:
        """The replicas in sync (all workers' together)."""
        return int(self._strategy().num_replicas_in_sync)

    def should_stop(self) -> bool:
        """True (and the Run marked stopped) if an observer asks to stop here."""
        if any(o.should_stop() for o in self.observers):
            RunWriter(self.run).finish("stopped")
            return True
        return False

    def notify(self) -> None:
        for observer in self.observers:
            observer.on_step(self.run)

    def traced(self, tf_function: Any, arg: Any, timed: bool) -> None:
        """Tell observers that want it (``--graph``, the checkpoint) about a traced step."""
        for observer in self.observers:
            observer.on_traced(tf_function, arg, timed)
