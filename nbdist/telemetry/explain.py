"""Why a run is as fast as it is, and what to change: ``Run.explain()``, ``%distribute explain``.

Reads a Run's rows (numpy and pandas; nothing runs, so explaining a run that trains costs it
nothing), and, where given, the run's input pipeline timed alone (``InputRate``, below).
A step of a worker and replica is the time from one step's end to the next
(``wall_time``), split into:

* ``compute``: the replica's own work up to the gradient all-reduce (``compute_ms``);
* ``input``: waiting for the input pipeline to produce the batch, i.e. ``data_ms`` beyond what
  fetching a batch that is ready costs (``fetch``);
* ``fetch``: fetching a ready batch from the distributed iterator on the host, measured on the
  fetches right after the compile steps, when the pipeline had filled its buffers (at most
  twice the call's dispatch: host work of the same kind);
* ``allreduce``: the gradient all-reduce as the α-β ring model (``telemetry.ring``) predicts it
  for the run's gradient bytes on the link (given, or the run's own fastest all-reduces);
  ``allreduce_extra``: the collective beyond that prediction;
* ``peers``: waiting for slower replicas or workers to arrive, at the all-reduce or (under
  multiworker) at the iterator's collective;
* ``turns``: the same waiting where the replicas take turns on shared cores (logical CPU
  devices): there, one replica waits while the others compute;
* ``other_collectives``: other collectives of the step (SyncBatchNormalization...);
* ``dispatch``: the step's call outside the replicas' timed work: dispatching it, the weight
  update after the all-reduce, bringing the results back;
* ``between``: host time between steps: nbdist's recording and observers, or (a straggler)
  the worker's own code or host;
* ``telemetry``: what nbdist's timed steps cost beyond untimed ones, spread over every step.

The timed steps (every k-th, ``--timing-every``) give the in-graph split; their timestamps
serialise the step a little, so their parts are scaled down to the untimed steps' time.
Rules then turn the shares into ranked advice, each with the number it rests on and the
steps/s (or examples/s) gain predicted if the advice removed that time: input-bound (a wait
longer than the host's own fetch and dispatch), dispatch-bound, communication-bound (a
gradient of 1 MB or more; or other collectives, synchronized BatchNormalization's, a large
share of the step), a straggler (arrives last at most steps while the others wait
long at each), a model too small for its replicas; none of them: balanced.

A straggler's gain is the step it leaves behind: each worker's own work (its step without
the waiting and the collectives; the straggler's without what it takes beyond the others),
added up over the workers of one machine (``Run.machines``), which take turns on its cores,
plus the collectives at their modelled time.

With an ``InputRate`` (the run's input pipeline timed alone, about a second, by
``nbdist.step.inputrate``: ``Run.explain()`` measures an ended run of this kernel once), input
is attributed from measurements rather than inferred: the pipeline sets the pace when, alone,
it takes about as long per batch as the step takes with a ready batch (the step's time without
its input wait). Then the first advice is the input's, naming the stage that runs Python or
one element at a time, with the step predicted from the measured rates (the pipeline in
parallel on the process's cores, its Python work on one, since it holds the interpreter, and
taking turns with the host's own Python work per step, its CPU sharing the cores with the
step's), and no other advice is predicted to
make a step shorter than the pipeline's batch. Where the pipeline cannot be timed (worker
families, a run still training, data no longer in the notebook) the input's share is
inferred from the step's timings, and the explanation says so.

Replicas that are logical CPU devices of this machine share its cores: a run whose compute
dominates is not told that more replicas would help.

With a ``Baseline`` (one replica's speed on the same step, measured by
``nbdist.step.baseline``: ``%distribute explain --baseline``), the explanation also gives the
run's speed-up over one replica and its scaling efficiency, and the measurement decides the
"tiny model" advice in place of its estimate.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..words import count
from .ring import ring_bandwidth, ring_model_ms
from .run import Run, register_view
from .stragglers import MIN_STEPS, enough_ms, last_to_arrive
from .stragglers import SHARE as STRAGGLER_SHARE

if TYPE_CHECKING:
    import pandas as pd

#: The parts of a step, in the order they are shown, with how they read.
PARTS: dict[str, str] = {
    "compute": "compute",
    "input": "waiting for input",
    "fetch": "fetching a ready batch",
    "allreduce": "all-reduce (α-β model)",
    "allreduce_extra": "all-reduce beyond the model",
    "peers": "waiting for slower peers",
    "turns": "other replicas' turn (shared cores)",
    "other_collectives": "other collectives",
    "dispatch": "dispatch, update, results",
    "between": "between steps",
    "telemetry": "nbdist's timing",
}
#: The bottlenecks ``Explanation.bottleneck`` names; "balanced" when nothing is worth changing.
BOTTLENECKS = ("input", "dispatch", "communication", "straggler", "tiny model", "balanced")

STEADY_FROM = 3          # steps before this one compile the step variants: left out
WORTH = 0.2              # a part at least this share of the step is worth acting on
MIN_GAIN = 0.1           # advice predicting less than +10% is left out
STRAGGLER_TIMED = 3      # timed steps of each waiter, where too few were timed by all of them
LONG_STEP = 5.0          # a step this many times the median (a compile) fills input buffers
#: replicas take turns when their computes add up to about the step's in-graph time (this
#: range of it); computing side by side, they add up to about their number times it
TURNS = (0.7, 1.3)
#: fetching a ready distributed batch is host work of the kind dispatching the step's call is
#: (per replica, in Python and the executor): at most this many times the call's dispatch
FETCH_PER_DISPATCH = 2.0
#: the input pipeline sets the pace when, timed alone, its batch takes at least this share of
#: the step with a ready batch (the step's own time then hides no more than this of it)
PACE = 0.9
#: ...or at least this share, where the run waited for it and a stage runs one at a time
NEAR_PACE = 0.5
#: Python work whose CPU time is at least this share of its pipeline's keeps a core busy
CPU_BOUND = 0.5
#: the stages a parallel version of which the advice can name (the op runs one at a time)
SERIAL = {"MapDataset": "map", "InterleaveDataset": "interleave"}
#: fewer examples per replica a step than this: a tiny batch, which twice the examples fixes
TINY_BATCH = 8
#: a gradient under this many bytes costs the all-reduce its latency, not its bandwidth: when
#: exchanging it outweighs the compute, the model is too small for its replicas
TINY_BYTES = 1_000_000


@dataclass(frozen=True)
class Advice:
    """One thing to change: what (``kind``, one of ``BOTTLENECKS``), the sentence, the
    measurement it rests on and the predicted gain (0.8: +80% of ``unit``)."""

    kind: str
    text: str
    evidence: str
    gain: float
    unit: str = "steps/s"

    def line(self) -> str:
        return f"{self.text} [{self.evidence}; expected +{self.gain:.0%} {self.unit}]"


@dataclass(frozen=True)
class Baseline:
    """One replica's speed on a run's own step and per-replica batch, measured by running the
    step alone for a few seconds (``nbdist.step.baseline``; ``%distribute explain --baseline``).
    ``steps_per_s``: its steps after the compile steps; ``batch``: the examples of one step
    (the run's global batch over its replicas); ``steps`` measured, in ``seconds`` for the
    whole probe (compiling included), on ``device``."""

    steps_per_s: float
    batch: int
    steps: int
    seconds: float
    device: str

    @property
    def examples_per_s(self) -> float:
        return self.steps_per_s * self.batch


@dataclass(frozen=True)
class InputRate:
    """The run's input pipeline iterated alone (``nbdist.step.inputrate``): ``ms_per_batch``
    of wall time per element (a step's global batch) and ``cpu_ms_per_batch`` of the process's
    CPU meanwhile, over ``batches`` elements after the first (``seconds``: the whole
    measurement); ``stages``: its stages from source to output
    (``hooks.tf_data.Stage``), empty where its graph could not be read; ``cores``: the cores
    the process may use; ``batch``: the examples of an element."""

    ms_per_batch: float
    cpu_ms_per_batch: float
    batches: int
    seconds: float
    stages: tuple[Any, ...] = ()
    cores: int = 1
    batch: int = 0     # examples in an element (its leading dimension), 0 if not known

    @property
    def python_stage(self) -> Any:
        """The first stage that runs Python (``tf.py_function``...) at every epoch, None if
        none does."""
        return next((s for s in self.stages if s.python and not self._cached(s)), None)

    @property
    def serial_stages(self) -> list[Any]:
        """The stages that handle one element at a time and take ``num_parallel_calls``, at
        every epoch."""
        return [s for s in self.stages if s.op in SERIAL and not self._cached(s)]

    def _cached(self, stage: Any) -> bool:
        """A ``.cache()`` after ``stage``: it runs in the first epoch only."""
        return any(s.op.startswith("CacheDataset") and s.index > stage.index
                   for s in self.stages)

    @property
    def prefetched(self) -> bool:
        """A prefetch after the last stage that does the work."""
        work = [s.index for s in self.stages if s.op in SERIAL or s.python]
        return any(s.op == "PrefetchDataset" and s.index > max(work, default=-1)
                   for s in self.stages)

    def stage_name(self, stage: Any) -> str:
        verb = SERIAL.get(stage.op, stage.op.removesuffix("Dataset"))
        return f"its `{verb}` (stage {stage.index + 1} of {len(self.stages)}, {stage.op})"


@dataclass
class Explanation:
    """Where a run's step time goes and what to change (``Run.explain()``).

    ``breakdown``: one row per worker and replica, the ms per step of each part (``PARTS``)
    and ``step_ms`` (their sum, the measured time between steps); ``bottleneck``: one of
    ``BOTTLENECKS``; ``advice``: ranked, the most gain first; ``baseline``: one replica's
    speed, if measured (then ``speedup`` and ``efficiency``); ``text``: all of it as plain
    text (``print``), ``_repr_html_``: a table with bars (the notebook)."""

    run_id: int
    breakdown: pd.DataFrame
    bottleneck: str
    advice: list[Advice]
    facts: list[str] = field(default_factory=list)
    steps_per_s: float = math.nan
    #: one replica's speed on the same step (``explain(baseline=...)``), None if not measured
    baseline: Baseline | None = None
    replicas: int = 1   # replicas in sync over every worker: what the baseline is scaled by
    #: the run's input pipeline timed alone, or why it was not (its share is then inferred)
    input_rate: InputRate | str | None = None
    #: the cores the replicas share (logical CPU devices of this machine), 0 if they do not
    shared_cores: int = 0

    @property
    def speedup(self) -> float:
        """The run's examples/s over one replica's (NaN without a baseline): each step of the
        run takes ``replicas`` times the baseline's batch."""
        if self.baseline is None or not self.baseline.steps_per_s > 0:
            return math.nan
        return self.replicas * self.steps_per_s / self.baseline.steps_per_s

    @property
    def efficiency(self) -> float:
        """``speedup`` over the number of replicas: 1.0 is perfect scaling (NaN without a
        baseline)."""
        return self.speedup / self.replicas

    def _scaling(self) -> str:
        b = self.baseline
        assert b is not None
        return (f"scaling: {count(self.replicas, 'replica')} give {_times(self.speedup)} one "
                f"replica's examples/s (efficiency {self.efficiency:.0%}); one replica: "
                f"{b.examples_per_s:,.0f} examples/s at batch {b.batch} ({count(b.steps, 'step')}"
                f" measured on {b.device}, the probe took {b.seconds:.1f} s)")

    @property
    def shares(self) -> dict[str, float]:
        """Each part's share of the step, over all workers and replicas."""
        mean = self.breakdown[list(PARTS)].mean()
        total = float(mean.sum())
        return {k: float(v) / total if total > 0 else 0.0 for k, v in mean.items()}

    def _parts_shown(self) -> list[tuple[str, float, float]]:
        """What both renderings list: (label, ms per step, share of the step) of each part
        above half a percent of the step."""
        mean = self.breakdown[list(PARTS)].mean()
        step = float(self.breakdown.step_ms.mean())
        return [(label, float(mean[key]), float(mean[key]) / step if step > 0 else 0.0)
                for key, label in PARTS.items() if float(mean[key]) > 0.005 * step]

    def _notes(self) -> list[str]:
        """The facts behind the numbers, then the scaling if a baseline was measured."""
        return [*self.facts, *([self._scaling()] if self.baseline is not None else [])]

    @property
    def text(self) -> str:
        step = float(self.breakdown.step_ms.mean())
        lines = [f"Run {self.run_id}: {step:.2f} ms per step ({self.steps_per_s:.1f} steps/s); "
                 f"bottleneck: {self.bottleneck}"]
        width = max(len(v) for v in PARTS.values())
        for label, ms, share in self._parts_shown():
            lines.append(f"  {label:<{width}} {ms:8.2f} ms {share:6.1%}  "
                         + "█" * round(share * 30))
        if len(self.breakdown) > 1:
            workers = bool(self.breakdown.worker.max() > 0)
            lines.append("  per " + ("worker/replica" if workers else "replica") + " (ms): "
                         + "; ".join(f"{_label(r, workers)} {r.step_ms:.2f} ({_top(r)})"
                                     for r in self.breakdown.itertuples()))
        lines += [f"  {note}" for note in self._notes()]
        if self.advice:
            lines.append("What to change, most gain first:")
            lines += [f"  {i}. {a.line()}" for i, a in enumerate(self.advice, 1)]
        else:
            lines.append("Nothing to fix: " + self._balanced())
        return "\n".join(lines)

    def _balanced(self) -> str:
        shares = self.shares
        inside = shares["compute"] + shares["peers"] + shares["turns"]
        if inside >= 0.5:
            more = ("More replicas or devices are what make it faster." if not
                    self.shared_cores else
                    f"The {self.replicas} replicas are logical devices sharing this machine's "
                    f"{count(self.shared_cores, 'core')}: they take turns on them, so more "
                    "replicas cannot make it faster; more cores can (a GPU, or workers on other "
                    "machines).")
            return (f"the replicas' own compute is {inside:.0%} of each step (waiting for each "
                    "other included); input, dispatch and the all-reduce are each under "
                    f"{WORTH:.0%}. {more}")
        top = max(PARTS, key=lambda k: shares[k])
        return (f"no part alone is worth changing: the largest, {PARTS[top]}, is "
                f"{shares[top]:.0%} of each step.")

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        step = float(self.breakdown.step_ms.mean())
        rows = []
        for label, ms, share in self._parts_shown():
            rows.append(
                f"<tr><td>{html.escape(label)}</td><td style='text-align:right'>{ms:.2f}</td>"
                f"<td style='text-align:right'>{share:.0%}</td><td style='width:12em'>"
                f"<div style='background:#4c78a8;height:0.8em;width:{share * 100:.0f}%'>"
                "</div></td></tr>")
        advice = "".join(f"<li>{html.escape(a.line())}</li>" for a in self.advice) or (
            f"<li>Nothing to fix: {html.escape(self._balanced())}</li>")
        facts = "".join(f"<div>{html.escape(f)}</div>" for f in self._notes())
        return (f"<div><b>Run {self.run_id}</b>: {step:.2f} ms per step "
                f"({self.steps_per_s:.1f} steps/s) · bottleneck: <b>{self.bottleneck}</b>"
                "<table style='font-size:90%'><tr><th style='text-align:left'>part</th>"
                "<th>ms/step</th><th>share</th><th></th></tr>" + "".join(rows) + "</table>"
                f"<div style='font-size:90%;color:#57606a'>{facts}</div><ol>{advice}</ol></div>")


def explain(run: Run, link: tuple[float, float] | None = None,
            baseline: Baseline | None = None,
            input_rate: InputRate | str | None = None) -> Explanation:
    """The explanation of ``run`` (see the module docstring). ``link``: (bytes/s, one-way
    latency ms) of the link between ranks, if known, for the all-reduce's α-β prediction;
    without it the prediction is the run's own fastest all-reduces. ``baseline``: one
    replica's speed on the same step (``nbdist.step.baseline``), for the scaling efficiency
    and the advice it measures (replicas slower than one). ``input_rate``: the run's input
    pipeline timed alone (``nbdist.step.inputrate``), or why it was not (a sentence): the
    input's share is then inferred from the step's timings."""
    frame = run.metrics
    if run.mode != "step" or not len(frame) or frame.step.max() < STEADY_FROM + 2:
        what = ("it has no step rows" if not len(frame) or run.mode != "step"
                else f"it has {count(int(frame.step.max()) + 1, 'step')}")
        raise ConfigError(
            f"Run {run.id} cannot be explained: {what}. The explanation splits the steps of a "
            f"step-mode run (`%%distribute --step`) after its first {STEADY_FROM} (they "
            f"compile): run at least {STEADY_FROM + 3} steps, then `%distribute explain`.")
    if frame.replica.min() < 0:
        raise ConfigError(f"Run {run.id} has only rows reduced over its replicas (a Keras "
                          "fit): nothing tells its replicas' times apart. Run the step as a "
                          "step cell (`%%distribute --step`) to have it explained.")
    grouped = bool(frame.data_ms.isna().all())
    ranks = run.replicas * run.workers
    # waiting for a peer at the iterator's collective (multiworker): the kernel moved it from
    # data_ms to wait_ms, the same for every replica of the worker (the rest of a timed row's
    # wait_ms is its replica's, before the all-reduce; ``cluster.multiworker.arrivals``)
    frame["moved"] = frame.wait_ms.fillna(0.0).groupby(
        [frame.step, frame.worker]).transform("min")
    timed = frame[frame.compute_ms.notna() & (frame.step >= STEADY_FROM)]
    if timed.empty:
        raise ConfigError(
            f"Run {run.id} has no timed steps after its first {STEADY_FROM} (it ran with "
            "--timing-every 0, or too few steps for one), so its steps cannot be split into "
            "compute, collectives and dispatch. Run the cell again without --timing-every (or "
            "with a K below its step count), then `%distribute explain`.")
    derived = _timed_parts(timed)
    facts: list[str] = []
    model = _model_ms(run, ranks, derived.alone, link, facts)
    parts = [_one(frame, timed, derived, model, worker, replica, grouped)
             for (worker, replica), _ in frame.groupby(["worker", "replica"])]
    import pandas as pd

    breakdown = pd.DataFrame(parts)
    cycle = float(breakdown.step_ms.mean())
    if grouped:
        facts.append("--steps-per-call: the batch is read inside the compiled call, so input "
                     "waiting is part of the steps' time, and dispatch is between calls")
    if bool(derived.turns.any()):
        facts.append("the replicas take turns on the same cores (their computes add up to the "
                     "step): what one waits for is the others' compute, shown as their turn")
    straggler = _straggler(run, timed, derived, breakdown)
    pace = _Pace.of(breakdown, grouped, input_rate)
    if pace is not None:
        facts.append(pace.fact())
    elif isinstance(input_rate, str):
        facts.append(f"input: inferred from the step's timings; the pipeline was not timed "
                     f"alone ({input_rate})")
    advice = _advice(_Step(run, breakdown[list(PARTS)].mean(), cycle, grouped, ranks, model,
                           straggler, pace))
    steps_per_s = 1e3 / cycle if cycle > 0 else math.nan
    if baseline is not None:
        advice = _measured_scaling(advice, ranks, steps_per_s, baseline)
    return Explanation(run.id, breakdown, advice[0].kind if advice else "balanced", advice,
                       facts, steps_per_s, baseline, ranks, input_rate, _shared_cores(run))


def _shared_cores(run: Run) -> int:
    """The cores a run's replicas share: logical CPU devices of the kernel's machine (0 when
    they are not: GPUs, workers)."""
    if run.workers > 1 or run.replicas < 2 or not run.devices or not all(
            "CPU" in d.upper() for d in run.devices):
        return 0
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


@dataclass(frozen=True)
class _Pace:
    """A step's time against its input pipeline's, timed alone: ``pipeline`` ms a batch,
    ``ready`` ms the step takes with a ready batch (its time without the input wait);
    ``paced``: the pipeline sets the step's pace."""

    rate: InputRate
    cycle: float
    ready: float
    host: float     # the host's own Python work per step: fetching, dispatching, between
    waited: float = 0.0   # the run's wait for input per step (its rows)

    @classmethod
    def of(cls, parts: pd.DataFrame, grouped: bool,
           rate: InputRate | str | None) -> _Pace | None:
        if not isinstance(rate, InputRate):
            return None
        mean = parts[list(PARTS)].mean()
        cycle = float(parts.step_ms.mean())
        # a grouped call reads its batches inside: the pipeline's time is in the steps'
        ready = (max(cycle - rate.ms_per_batch, 0.0) if grouped
                 else cycle - float(mean["input"]))
        return cls(rate, cycle, ready, float(mean["fetch"] + mean["dispatch"] + mean["between"]),
                   0.0 if grouped else float(mean["input"]))

    @property
    def pipeline(self) -> float:
        return self.rate.ms_per_batch

    @property
    def delivered(self) -> float:
        """ms a batch the pipeline took, as far as the run shows: timed alone on a machine
        busier than during the run it can seem slower than the run it fed, which proves it
        gives a batch a step at least."""
        return min(self.pipeline, self.cycle)

    @property
    def paced(self) -> bool:
        """Timed alone, the pipeline takes about the step's own time or more; or, near that,
        the run waited for it and its graph shows a stage that runs one element at a time,
        unprefetched (so a busier machine during the run or the timing flips no verdict)."""
        if self.pipeline >= PACE * self.ready:
            return True
        return (self.pipeline >= NEAR_PACE * self.ready and self.waited >= WORTH * self.cycle
                and bool(self.rate.serial_stages) and not self.rate.prefetched)

    @property
    def python_cpu(self) -> float:
        """ms a batch that the pipeline's Python work holds the interpreter: its CPU (all of
        it where a stage runs Python: which part is Python the CPU time does not say)."""
        if self.rate.python_stage is None:
            return 0.0
        return min(self.rate.cpu_ms_per_batch, self.delivered)

    def after_input(self) -> tuple[float, float]:
        """ms a step once the input advice is applied, and the pipeline's ms a batch then:
        its serial stages in parallel over the cores (its Python work on one), prefetched
        so that it overlaps the step; Python work takes turns with the host's own."""
        pipeline = self.delivered
        if self.rate.serial_stages:
            pipeline = max(pipeline / self.rate.cores, self.python_cpu)
        if self.cpu_bound:   # the advice is to do it once (``.cache()``): then it is gone
            return self.ready, 0.0
        held = self.host + self.python_cpu if self.python_cpu else 0.0
        # the pipeline's CPU and the step's (replicas on CPU devices) share the same cores
        cpu = min(self.rate.cpu_ms_per_batch, self.delivered)
        shared = (self.ready + cpu) / self.rate.cores
        # work the run already overlapped (more than its step adds up to) costs it no more
        return min(max(self.ready, pipeline, held, shared), self.cycle), pipeline

    @property
    def cpu_bound(self) -> bool:
        """The pipeline's Python work keeps a core busy most of its time."""
        return self.python_cpu >= CPU_BOUND * self.delivered

    def fact(self) -> str:
        r = self.rate
        python = r.python_stage
        where = (f"; Python work ({', '.join(python.python)}) in {r.stage_name(python)}, "
                 + ("in parallel" if python.op not in SERIAL else "one element at a time")
                 if python is not None else "")
        verdict = ("the pipeline sets the pace" if self.paced
                   else "the pipeline keeps up: the step's waits are the host's own work")
        return (f"input pipeline timed alone: {self.pipeline:.2f} ms a batch "
                f"({r.cpu_ms_per_batch:.2f} ms of CPU; {count(r.batches, 'batch', 'batches')} over "
                f"{r.seconds:.1f} s){where}; the step with a ready batch takes "
                f"{self.ready:.2f} ms: {verdict}")


def _measured_scaling(advice: list[Advice], ranks: int, steps_per_s: float,
                      baseline: Baseline) -> list[Advice]:
    """``advice`` with the measured verdict on the replicas, which replaces the estimate of
    the same advice: when the run's replicas give fewer examples/s than one replica alone,
    training on one is the gain, measured; when they give more, fewer replicas are no
    advice."""
    kept = [a for a in advice if a.kind != "tiny model"]
    run_rate = ranks * steps_per_s * baseline.batch
    one = baseline.examples_per_s
    gain = one / run_rate - 1 if run_rate > 0 else math.nan
    if not gain >= MIN_GAIN:
        return kept
    measured = Advice(
        "tiny model",
        f"{count(ranks, 'replica')} are slower than one on this model: train it on one "
        "(`%distribute mirrored --devices 1`), or give each replica a larger batch so that "
        "its compute outweighs the exchange",
        f"measured: one replica {one:,.0f} examples/s at batch {baseline.batch}, the "
        f"{ranks} replicas {run_rate:,.0f} examples/s",
        gain, "examples/s")
    return sorted([*kept, measured], key=lambda a: -a.gain)


# -- the parts ----------------------------------------------------------------------------------
def _timed_parts(timed: pd.DataFrame) -> pd.DataFrame:
    """Per timed row: ``peers``, the time it waited for slower peers (before the all-reduce;
    before its own first op, while the worker's other replicas ran; and inside the
    all-reduce under multiworker, where each worker's all-reduce runs from its own arrival);
    ``alone``, the collective alone at that step (the last arrival's all-reduce: the least of
    the step); ``outside``, the call's time outside every replica's timed work; ``turns``, True
    where the worker's replicas take turns on shared cores (their computes add up to the
    step: one replica's wait is the others' compute, not a slower peer)."""
    import pandas as pd

    if timed.empty:
        return pd.DataFrame(columns=["peers", "alone", "outside", "turns"], dtype=float)
    allreduce = timed.allreduce_ms.fillna(0.0)
    span = (timed.compute_ms + timed.wait_ms.fillna(0.0) + allreduce
            + timed.other_collective_ms.fillna(0.0))
    keys = [timed.step, timed.worker]
    widest = span.groupby(keys).transform("max")
    # each worker times its own steps: where not every worker timed a step, the collective
    # alone is the one seen when nobody was late (the fastest tenth)
    complete = timed.worker.groupby(timed.step).transform("nunique") == timed.worker.nunique()
    alone = allreduce.groupby(timed.step).transform("min").where(
        complete, float(np.nanpercentile(allreduce.to_numpy(), 10)))
    peers = (timed.wait_ms.fillna(0.0) - timed.moved + (widest - span)
             + (allreduce - alone).clip(lower=0.0))
    # the replicas' summed compute against the time they had for it: ~1 when they take turns,
    # ~their number when they compute side by side
    computing = timed.compute_ms.groupby(keys).transform("sum")
    busy = (computing / (widest - alone).clip(lower=1e-6)).groupby(timed.worker).transform(
        "median")
    replicas = timed.replica.groupby(keys).transform("count")
    return pd.DataFrame({"peers": peers, "alone": alone,
                         "outside": (timed.step_ms - widest).clip(lower=0.0),
                         "turns": (replicas > 1) & busy.between(*TURNS)}, index=timed.index)


def _model_ms(run: Run, ranks: int, alone: pd.Series, link: tuple[float, float] | None,
              facts: list[str]) -> float:
    """The α-β prediction of the gradient all-reduce, ms (NaN: no all-reduce was timed)."""
    nbytes = run.allreduce_bytes or 0
    if alone.empty or not nbytes or ranks < 2:
        return math.nan
    if link is not None:
        model = ring_model_ms(nbytes, ranks, *link)
        facts.append(f"all-reduce: {_bytes(nbytes)} per replica over {ranks} ranks; the α-β "
                     f"model on a {_bandwidth(link[0])}, {link[1]:g} ms link predicts "
                     f"{model:.2f} ms")
        return model
    fastest = float(np.nanpercentile(alone.to_numpy(), 10))
    facts.append(f"all-reduce: {_bytes(nbytes)} per replica over {ranks} ranks; its model is "
                 f"this run's fastest all-reduces, {fastest:.2f} ms "
                 f"({_bandwidth(ring_bandwidth(nbytes, ranks, fastest))} bus bandwidth)")
    return fastest


def _one(frame: pd.DataFrame, timed: pd.DataFrame, derived: pd.DataFrame, model: float,
         worker: int, replica: int, grouped: bool) -> dict[str, Any]:
    """One worker and replica's ms per step of each part."""
    mine = frame[(frame.worker == worker) & (frame.replica == replica)].sort_values("step")
    steady = mine[mine.step >= STEADY_FROM]
    untimed = steady[steady.compute_ms.isna()]
    plain = untimed if len(untimed) else steady
    cycle = _cycle(mine, grouped)
    step_mean = float(steady.step_ms.mean())
    plain_ms = float(plain.step_ms.mean())
    out = dict.fromkeys(PARTS, 0.0)
    iterator_wait = float(steady.moved.mean())
    if not grouped:
        data = float(steady.data_ms.mean())
        fetch = min(_ready_fetch(mine), data)
        out["fetch"], out["input"] = fetch, data - fetch
    out["peers"] = iterator_wait
    out["telemetry"] = max(step_mean - plain_ms, 0.0)
    out["between"] = max(cycle - sum(out.values()) - plain_ms, 0.0)
    cycle = sum(out.values()) + plain_ms
    if grouped:   # the gaps between a call's last step and the next call's first: dispatch
        out["dispatch"], out["between"] = out["between"], 0.0
    rows = timed[(timed.worker == worker) & (timed.replica == replica)]
    if rows.empty:
        out["compute"] = plain_ms
        return {"worker": worker, "replica": replica, **out, "step_ms": cycle}
    mine = derived.loc[rows.index]
    # a mean: where a worker waits (at the iterator or in the all-reduce) changes step to step
    waited = float(mine.peers.mean())
    collective = float(mine.alone.median())
    inside = {
        "compute": float(rows.compute_ms.median()),
        "allreduce": min(model, collective) if math.isfinite(model) else collective,
        "other_collectives": float(rows.other_collective_ms.fillna(0.0).median()),
        "turns" if bool(mine.turns.any()) else "peers": waited,
    }
    inside["allreduce_extra"] = max(collective - inside["allreduce"], 0.0)
    span = sum(inside.values())
    # a grouped step's step_ms is in-graph (between its timestamps): nothing outside
    outside = 0.0 if grouped else min(float(mine.outside.median()), plain_ms)
    # the timestamps serialise a timed step: its parts, scaled to an untimed step's time
    scale = min((plain_ms - outside) / span, 1.0) if span > 0 else 0.0
    for key, ms in inside.items():
        out[key] += ms * scale
    out["dispatch"] += outside
    if not grouped and out["fetch"] > FETCH_PER_DISPATCH * outside:
        # a pipeline that never had a batch ready does not pass for fetching cost
        out["input"] += out["fetch"] - FETCH_PER_DISPATCH * outside
        out["fetch"] = FETCH_PER_DISPATCH * outside
    out["compute"] += max(plain_ms - outside - span * scale, 0.0)   # in-graph, not timed apart
    return {"worker": worker, "replica": replica, **out, "step_ms": cycle}


def _cycle(mine: pd.DataFrame, grouped: bool) -> float:
    """Mean ms from one step's end to the next, over the steady steps of one row's series
    (epoch starts, which make a new iterator, and one-off stalls left out; with
    ``--steps-per-call`` the gaps between calls stay in: they are its dispatch)."""
    wall = mine.wall_time.to_numpy()
    steps, epochs = mine.step.to_numpy(), mine.epoch.to_numpy()
    gaps = np.diff(wall) * 1e3
    keep = (np.diff(steps) == 1) & (np.diff(epochs) == 0) & (steps[1:] >= STEADY_FROM)
    gaps = gaps[keep]
    if not len(gaps):
        return float(mine.step_ms.mean())
    if not grouped:
        gaps = gaps[gaps <= 10 * np.median(gaps)]
    return float(gaps.mean())


def _ready_fetch(mine: pd.DataFrame) -> float:
    """ms to fetch a batch that is ready: the fetches right after a long step (a compile, while
    the pipeline filled its buffers), else the quickest twentieth of the steady fetches."""
    step_ms, data = mine.step_ms.to_numpy(), mine.data_ms.to_numpy()
    typical = float(np.nanmedian(step_ms[mine.step.to_numpy() >= STEADY_FROM]))
    after_long = data[1:][(step_ms[:-1] > LONG_STEP * typical) & (step_ms[:-1] > 50.0)]
    after_long = after_long[np.isfinite(after_long)]
    steady = data[mine.step.to_numpy() >= STEADY_FROM]
    quick = float(np.nanpercentile(steady, 5)) if np.isfinite(steady).any() else 0.0
    return min(float(np.median(after_long)), quick) if len(after_long) else quick


# -- the rules ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Straggler:
    label: str
    index: int
    share: float        # of the timed steps it arrived last at
    waited_ms: float    # the others' waiting per step
    cause: str
    excess_ms: float    # how much longer its ``cause`` takes than the others'
    after_ms: float     # the step once it is as fast as the others (``_after_straggler``)
    sharing: list[list[int]]   # the workers that share a machine's cores, more than one


def _straggler(run: Run, timed: pd.DataFrame, derived: pd.DataFrame,
               breakdown: pd.DataFrame) -> _Straggler | None:
    """The worker (several workers) or replica the others wait for at most steps, if they wait
    long enough to matter (``telemetry.stragglers``, on the waits derived here), and which of
    its parts makes it late. A step counts for it where the others waited long enough at that
    step: on a congested link one all-reduce ends later on one side now and then, which is no
    straggler."""
    by = "worker" if run.workers > 1 else "replica"
    cycle = float(breakdown.step_ms.mean())
    enough = enough_ms(cycle)
    waits = breakdown.groupby(by)[["peers", "input", "fetch", "compute", "between"]].mean()
    if len(waits) < 2 or (by == "replica" and bool(derived.turns.any())):
        return None   # replicas taking turns: the last is last by turn, not by being slow
    # the steps every one of them timed: who arrived last at each
    at_step = derived.peers + timed.moved   # in the step, and at the iterator
    per_step = at_step.groupby([timed.step, timed[by]]).min().unstack().dropna()
    # workers: the run's own finding, on every step's waits (the timed steps or not)
    named = {s.index: s.share for s in run.stragglers()} if by == "worker" else {}
    found = last_to_arrive(per_step.to_numpy(), enough) if len(per_step) >= MIN_STEPS else None
    if found is not None:
        index, share = int(per_step.columns[found[0]]), found[1]
    elif named:
        index, share = next(iter(named.items()))
    elif len(per_step) >= MIN_STEPS:
        return None
    else:   # too few steps timed by all: the one that typically waits least, and at how
        # many of their timed steps the others waited for it (a stall or two is no straggler)
        waiting = at_step.groupby(timed[by])
        if waiting.ngroups < len(waits):
            return None
        typical = waiting.median()
        index = int(typical.idxmin())
        others = at_step[timed[by] != index]
        if int(others.groupby(timed[by]).size().min()) < STRAGGLER_TIMED:
            return None
        share = float((others >= typical[index] + enough).mean())
    others = waits.drop(index)
    waited = float(others.peers.mean())
    share = max(share, named.get(index, 0.0))
    if share < STRAGGLER_SHARE or waited < enough:
        return None
    mine = waits.loc[index]
    excess = {"input": (mine["input"] + mine["fetch"])
              - (others["input"] + others["fetch"]).mean(),
              "compute": mine["compute"] - others["compute"].mean(),
              "time between its steps": mine["between"] - others["between"].mean()}
    cause = max(excess, key=excess.get)
    after, sharing = _after_straggler(run, breakdown, by, index, float(excess[cause]))
    return _Straggler(f"{by} {index}", index, share, waited, cause, float(excess[cause]),
                      after, sharing)


def _after_straggler(run: Run, breakdown: pd.DataFrame, by: str, index: int,
                     excess: float) -> tuple[float, list[list[int]]]:
    """ms per step once the straggler ``index`` takes no longer than the others, and the
    workers that share a machine: each worker's (replica's) own work, its step without the
    waiting and the collectives (the straggler's without its ``excess`` too), adds up over the
    workers of one machine, which take turns on its cores (each worker's TensorFlow sizes its
    threads to all of them) as replicas on shared cores do; the slowest machine's sum, plus the
    collectives at their modelled time, is the step. Replicas of one worker run side by side."""
    collectives = float((breakdown.allreduce + breakdown.other_collectives).mean())
    own = (breakdown.step_ms - breakdown.peers - breakdown.allreduce
           - breakdown.allreduce_extra - breakdown.other_collectives).groupby(
        breakdown[by]).mean()
    own[index] = max(float(own[index]) - excess, 0.0)
    machines = (run.machines if by == "worker" and len(run.machines) == run.workers
                else [str(unit) for unit in own.index])
    on = own.groupby([machines[int(unit)] for unit in own.index]).sum()
    sharing = [[int(u) for u in own.index if machines[int(u)] == m]
               for m in dict.fromkeys(machines)]
    return float(on.max()) + collectives, [units for units in sharing if len(units) > 1]


@dataclass(frozen=True)
class _Step:
    """What every rule reads: the mean ms per step of each part (``PARTS``) over the workers
    and replicas, the step's, and what ``explain`` found beside them."""

    run: Run
    mean: pd.Series
    cycle: float
    grouped: bool
    ranks: int
    model: float
    straggler: _Straggler | None
    pace: _Pace | None

    @property
    def floor(self) -> float:
        """A pipeline that sets the pace: no change but the input's makes a step shorter."""
        return self.pace.pipeline if self.pace is not None and self.pace.paced else 0.0

    def gain(self, saved: float) -> float:
        """The steps/s gained if ``saved`` ms left each step."""
        return self.cycle / max(self.cycle - saved, self.floor, 1e-9) - 1

    @property
    def input_ms(self) -> float:
        return float(self.mean["input"])

    @property
    def host(self) -> float:
        """The host's own work per step: fetching a ready batch, dispatching the call."""
        return float(self.mean["fetch"] + self.mean["dispatch"])

    @property
    def tiny_batch(self) -> bool:
        return (self.pace is not None and not self.pace.paced
                and 0 < self.pace.rate.batch < TINY_BATCH * self.ranks)


def _straggler_advice(step: _Step) -> Advice | None:
    s, cycle = step.straggler, step.cycle
    if s is None:
        return None
    where = {"input": "its input pipeline (reading or preprocessing slower there)",
             "compute": "its compute (a slower or busier device)",
             "time between its steps": "time outside its steps (a slow or busy host, its "
             "own code between steps, `%distribute inject slow`)"}[s.cause]
    return Advice(
        "straggler",
        f"{s.label} is the straggler: the others wait for it; the time goes to {where}. "
        "Find what slows it there, or give it less to do",
        f"it arrived last at {s.share:.0%} of the timed steps; the others waited "
        f"{s.waited_ms:.1f} ms of each {cycle:.1f} ms step; its {s.cause} took "
        f"{s.excess_ms:.1f} ms longer than theirs; without that a step takes about "
        f"{s.after_ms:.1f} ms"
        + "".join(f" (workers {', '.join(map(str, units))} share one machine's cores: their "
                  "own work adds up)" for units in s.sharing),
        step.gain(cycle - max(s.after_ms, 0.05 * cycle)))


def _input_rule(step: _Step) -> Advice | None:
    # a wait shorter than the host's own work per step (fetching, dispatching) is that host
    # work slowed by tf.data's threads on the same cores, not a slow pipeline
    if step.pace is not None:
        return _input_advice(step.pace) if step.pace.paced else None
    input_ms, cycle = step.input_ms, step.cycle
    if not (not step.grouped and input_ms >= WORTH * cycle and input_ms >= step.host):
        return None
    return Advice(
        "input",
        "The step waits for its input: read it ahead and in parallel "
        "(`ds.map(f, num_parallel_calls=tf.data.AUTOTUNE)`, `.cache()` after the costly "
        "part if it fits in memory, `.interleave(..., num_parallel_calls=...)` over files, "
        "`.prefetch(tf.data.AUTOTUNE)` last)",
        f"data wait {input_ms:.2f} ms of each {cycle:.2f} ms step (a ready batch takes "
        f"{float(step.mean['fetch']):.2f} ms to fetch)", step.gain(input_ms))


def _batch_rule(step: _Step) -> Advice | None:
    # the advice names several steps per call too, as the lesser fix
    if not step.tiny_batch or step.pace is None:
        return None
    return _larger_batch(step.pace.rate.batch, step.ranks, step.cycle,
                         float(step.mean["compute"]))


def _dispatch_rule(step: _Step) -> Advice | None:
    # several steps per call save the dispatch of each call; the batch's fetch moves into the
    # call, where it still costs about what it did; a wait too short to be the pipeline's is
    # the host's own work slowed, and goes with it
    mean, cycle = step.mean, step.cycle
    dispatch = float(mean["dispatch"])
    saved = dispatch + (step.input_ms if step.input_ms < step.host and step.pace is None
                        else 0.0)
    if not (not step.grouped and saved >= WORTH * cycle and not step.tiny_batch):
        return None
    return Advice(
        "dispatch",
        "The step is too small for one call per step: run several steps per call with "
        "`%%distribute --step ... --steps-per-call auto` (the batch is then read inside "
        "the compiled call too)",
        f"dispatching each call {dispatch:.2f} ms of each {cycle:.2f} ms step; the "
        f"replicas' own work {float(mean['compute'] + mean['allreduce']):.2f} ms",
        step.gain(saved))


def _allreduce_rule(step: _Step) -> Advice | None:
    mean, cycle, ranks = step.mean, step.cycle, step.ranks
    comm = float(mean["allreduce"] + mean["allreduce_extra"] + mean["other_collectives"])
    nbytes = step.run.allreduce_bytes or 0
    if not (ranks > 1 and comm >= WORTH * cycle and nbytes >= TINY_BYTES):
        return None
    work = float(mean["compute"] + mean["input"])
    bw = ring_bandwidth(nbytes, ranks, float(mean["allreduce"] + mean["allreduce_extra"]))
    # twice the batch per replica: the same all-reduce carries twice the examples
    doubled = 2 * cycle / (cycle + work) - 1
    return Advice(
        "communication",
        "The all-reduce dominates: give each replica a larger batch (the same gradient "
        "bytes then carry more examples), or send fewer bytes (a smaller model, float16 "
        "gradients), or use fewer, better-connected ranks",
        f"{_bytes(nbytes)} of gradients per replica take {comm:.2f} ms of each "
        f"{cycle:.2f} ms step ({_bandwidth(bw)} bus bandwidth; "
        + (f"α-β model {step.model:.2f} ms" if math.isfinite(step.model) else "no model")
        + f") against {work:.2f} ms of compute and input; doubling the per-replica batch",
        doubled, "examples/s")


def _other_collectives_rule(step: _Step) -> Advice | None:
    mean, cycle = step.mean, step.cycle
    others = float(mean["other_collectives"])
    if not (step.ranks > 1 and others >= WORTH * cycle):
        return None
    return Advice(
        "communication",
        "Collectives other than the gradient all-reduce take much of each step: a "
        "`BatchNormalization(synchronized=True)` (SyncBatchNormalization) all-reduces its "
        "batch statistics in every such layer at every step. Use "
        "`BatchNormalization()` (each replica's own statistics) where each replica's batch "
        "is large enough for them, or fewer synchronized layers",
        f"other collectives {others:.2f} ms of each {cycle:.2f} ms step; the gradient "
        f"all-reduce {float(mean['allreduce'] + mean['allreduce_extra']):.2f} ms",
        step.gain(others))


def _tiny_model_rule(step: _Step) -> Advice | None:
    mean, cycle, ranks = step.mean, step.cycle, step.ranks
    together = float(mean["allreduce"] + mean["allreduce_extra"] + mean["peers"]
                     + mean["turns"])
    compute = float(mean["compute"])
    others = float(mean["other_collectives"])
    nbytes = step.run.allreduce_bytes or 0
    if not (ranks > 1 and (together > compute or together >= WORTH * cycle)
            and step.straggler is None and nbytes < TINY_BYTES and together >= others):
        return None
    # one replica: no all-reduce, no waiting, every replica's compute on one device
    alone = max(cycle - together - others + compute * (ranks - 1), step.floor)
    if not cycle / alone - 1 >= MIN_GAIN:
        return None
    return Advice(
        "tiny model",
        f"The model is too small for {ranks} replicas: each computes {compute:.2f} ms "
        f"but they spend {together:.2f} ms per step exchanging and waiting; use fewer "
        "replicas (`%distribute mirrored --devices 1`) or a larger batch per replica",
        f"compute {compute:.2f} ms vs all-reduce and waiting {together:.2f} ms",
        cycle / alone - 1)


#: explain's rules, in order: each reads the step and gives its advice, or None.
RULES: tuple[Callable[[_Step], Advice | None], ...] = (
    _straggler_advice, _input_rule, _batch_rule, _dispatch_rule, _allreduce_rule,
    _other_collectives_rule, _tiny_model_rule)


def _advice(step: _Step) -> list[Advice]:
    """Every rule's advice worth giving, the most gain first."""
    out = [a for a in (rule(step) for rule in RULES) if a is not None]
    # a pipeline that sets the pace is the bottleneck, whatever its change is predicted to gain
    floor = step.floor
    out = [a for a in out if a.gain >= MIN_GAIN or (a.kind == "input" and floor)]
    return sorted(out, key=lambda a: (not (a.kind == "input" and floor), -a.gain))


def _larger_batch(batch: int, ranks: int, cycle: float, compute: float) -> Advice:
    """A step of a few examples per replica: its fixed costs (dispatching, fetching, the
    collectives' latency) stay when it carries twice the examples; only the compute grows."""
    return Advice(
        "dispatch",
        f"Each replica gets {count(batch // ranks, 'example')} a step: the step's fixed costs "
        "(dispatching it, fetching the batch, the all-reduce's latency) outweigh its compute. "
        f"Give it twice the examples (`.batch({2 * batch})`, and the loss's global batch size "
        "to match); several steps per call (`--steps-per-call auto`) save only the dispatch",
        f"{batch} examples a step over {count(ranks, 'replica')}; compute {compute:.2f} ms of "
        f"each {cycle:.2f} ms step; doubling the batch",
        2 * cycle / (cycle + compute) - 1, "examples/s")


def _input_advice(pace: _Pace) -> Advice:
    """What to change in a pipeline that sets the pace, with the step the measured rates
    predict once it is changed."""
    rate = pace.rate
    after, pipeline = pace.after_input()
    python = rate.python_stage
    serial = rate.serial_stages
    if python is not None and pace.cpu_bound:
        text = (f"The input pipeline sets the pace: the Python work in {rate.stage_name(python)} "
                f"keeps a core busy and holds the interpreter, so threads cannot run it in "
                "parallel. Do it once: `.cache()` right after it if its output fits in memory, "
                "or write it with TensorFlow ops; `num_parallel_calls=tf.data.AUTOTUNE` on it "
                "and `.prefetch(tf.data.AUTOTUNE)` last overlap it with the step only where a "
                "core is free")
    elif python is not None and python.op in SERIAL:
        verb = SERIAL[python.op]
        text = (f"The input pipeline sets the pace: the Python work in {rate.stage_name(python)} "
                "runs one element at a time. Run it in parallel and read ahead: "
                f"`.{verb}(..., num_parallel_calls=tf.data.AUTOTUNE)` on that {verb}, "
                "`.prefetch(tf.data.AUTOTUNE)` last")
    elif serial:
        named = serial[-1]
        verb = SERIAL[named.op]
        text = (f"The input pipeline sets the pace: {rate.stage_name(named)} runs one element at "
                f"a time. Run it in parallel and read ahead: `.{verb}(..., "
                "num_parallel_calls=tf.data.AUTOTUNE)`, `.prefetch(tf.data.AUTOTUNE)` last")
    elif not rate.prefetched:
        text = ("The input pipeline sets the pace: read it ahead, so that it works while the "
                "step runs: `.prefetch(tf.data.AUTOTUNE)` last (and `.cache()` after the costly "
                "part if it fits in memory)")
    else:
        text = ("The input pipeline sets the pace, although it is parallel and prefetched: "
                "`.cache()` after its costly part if it fits in memory, or make that part "
                "cheaper (TensorFlow ops in place of Python)")
    turns = (f"the step's {pace.ready:.2f} ms" if pace.cpu_bound
             else f"the host's {pace.host:.2f} ms a step")
    held = (f"; its Python work holds the interpreter {pace.python_cpu:.2f} ms a batch, taking "
            f"turns with {turns}" if pace.python_cpu else "")
    changed = ("done once, its work is gone" if pace.cpu_bound else
               f"changed, the pipeline ~{pipeline:.2f} ms a batch on "
               f"{count(rate.cores, 'core')}{held}")
    evidence = (f"timed alone, the pipeline gives a batch every {pace.pipeline:.2f} ms "
                f"({pace.python_cpu or rate.cpu_ms_per_batch:.2f} ms of it CPU); the step takes "
                f"{pace.ready:.2f} ms with a ready batch, {pace.cycle:.2f} ms in the run; "
                f"{changed}: a step about {after:.2f} ms")
    return Advice("input", text, evidence, pace.cycle / max(after, 1e-9) - 1)


# -- formatting --------------------------------------------------------------------------------
def _times(ratio: float) -> str:
    return f"{ratio:.2g}x" if ratio < 1 else f"{ratio:.1f}x"


def _label(row: Any, workers: bool) -> str:
    return f"w{row.worker}/r{row.replica}" if workers else f"r{row.replica}"


def _top(row: Any) -> str:
    key = max(PARTS, key=lambda k: getattr(row, k))
    return f"most {PARTS[key]}"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _bandwidth(bytes_per_s: float) -> str:
    if not math.isfinite(bytes_per_s):
        return "unknown"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


register_view("explain", explain)
