"""The Run: the single store of one training run's metrics.

Runners append rows (one per step and replica or worker) through a ``RunWriter``;
dashboards, the lab extension and users read them (``Run`` has only the reading side). A
row is a ``Row`` (``telemetry.rows``, where its columns are declared once): every reader and
writer uses their names. The rows live in numpy chunks
(``telemetry.table``: ~8 bytes per number, millions of rows per run); appending is under a
lock and publishes the new row count last, so a reader on another thread, or a
KeyboardInterrupt during an append, never sees half a step.

The store imports none of its views: ``Run.plot``, ``Run.to_tensorboard`` call functions that
``nbdist.widgets``, ``telemetry.tensorboard`` register (``register_view``) when imported.
"""

from __future__ import annotations

import html
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..words import count
from .jsonl import read_files
from .rows import COLUMNS, INTEGERS, MEASURED, POSITION, Row, as_row
from .stragglers import Straggler, StragglerWatch
from .table import ColumnTable

if TYPE_CHECKING:
    import pandas as pd

STATUSES = ("running", "done", "interrupted", "stopped", "failed")

_NAN = float("nan")

#: The fields of a Run its runners set as they learn them (``RunWriter.update``); its rows,
#: epochs, resume link and end have their own ``RunWriter`` methods.
LEARNED = frozenset({"total_steps", "epochs", "loss_scale", "loss_label", "allreduce_bytes",
                     "checkpoint", "input_rate", "restarts", "params"})


@dataclass
class Restart:
    """One ``--elastic`` restart of a run's workers (``Run.restarts``): what died, at which
    step, the step the run resumed at from its checkpoint, and the seconds it cost, split into
    starting fresh workers (``start_s``), replaying the cells and pushes that built their
    state (``replay_s``) and from then until the first step after the checkpoint was recorded
    (``restore_s``: data, checkpoint, tracing, first step; None until it was)."""

    died: str                        # "worker 1 (pid 4242)"
    workers: tuple[int, ...]         # the indexes of the workers that died
    machine: str                     # the host they ran on
    step: int | None                 # steps done when it died (None: not known)
    start_s: float
    replay_s: float
    replayed: int                    # cells and pushes replayed
    resumed_at: int | None = None    # the first step the fresh workers trained
    restore_s: float | None = None

    @property
    def seconds(self) -> float:
        """Seconds lost in all (start, replay and restore)."""
        return self.start_s + self.replay_s + (self.restore_s or 0.0)

    def describe(self) -> str:
        """One line: what died, where the run resumed, the seconds and their parts."""
        at = f" after step {self.step}" if self.step is not None else ""
        resumed = (f"resumed at step {self.resumed_at} from the checkpoint"
                   if self.resumed_at is not None else "not resumed")
        restore = f"{self.restore_s:.1f} s" if self.restore_s is not None else "-"
        return (f"{self.died} died{at} on {self.machine}; {resumed}: {self.seconds:.1f} s lost "
                f"(start {self.start_s:.1f} s, replay {self.replay_s:.1f} s of "
                f"{count(self.replayed, 'cell or push', 'cells and pushes')}, restore "
                f"{restore})")


@dataclass
class Run:
    """One ``%%distribute`` execution and everything measured during it.

    ``run.metrics`` is a pandas DataFrame with one row per (step, replica or worker) and the
    columns in ``nbdist.telemetry.run.COLUMNS`` plus any extra metrics the run reported
    (e.g. Keras ``accuracy``). ``run.notes`` lists caveats about the numbers.

    A ``model.fit`` run also has ``run.epoch_metrics``: one row per finished epoch with
    ``epoch``, ``step`` (the epoch's last step) and every number Keras logged at the epoch's
    end (``loss``, compiled metrics such as ``accuracy``, and ``val_loss``, ``val_accuracy``...
    when the fit has validation data). In its ``run.metrics``, ``loss`` is what Keras logs per
    batch (the running mean over the epoch so far), ``batch_loss`` each batch's own loss
    recovered from it (``fitrecord.batch_value``; what the dashboard and ``nbdist.compare``
    draw), and compiled metrics are as Keras logs them (running means over the epoch).

    A run that resumed from a ``--checkpoint`` starts at a later step: ``run.resumed_from``
    is the earlier Run of the same checkpoint directory (None if that Run is not in this
    kernel) and ``run.resumed_at`` the first step this run trained; the dashboard and
    ``nbdist.compare`` draw the earlier run's steps before it.

    A step cell with ``--elastic`` goes on after a worker's death in the same Run:
    ``run.restarts`` lists each restart of its workers, with what died, the step the run
    resumed at and the seconds lost (``Restart``).
    """

    id: int
    mode: str                                  # "step" or "fit"
    strategy: str
    replicas: int
    workers: int = 1
    devices: tuple[str, ...] = ()
    total_steps: int | None = None
    epochs: int | None = None                  # how many the run was asked for, if known
    status: str = "running"
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    ended: float | None = None
    allreduce_bytes: int | None = None         # bytes each replica contributes per gradient
    #                                            all-reduce (the bus bandwidth's numerator)
    #: the global (headline) loss of a step = the mean of its rows' losses x loss_scale: the
    #: replicas in sync when their losses add up to the global batch's (a Keras loss, one
    #: divided by the global batch, a sum), else 1; read from the traced step
    #: (``telemetry.lossform``), its note says which
    loss_scale: int = 1
    #: per worker, the machine it runs on (its Linux boot id, else its host name): workers on
    #: one machine share its cores (empty where not known)
    machines: tuple[str, ...] = ()
    #: see the class docstring: the Run this one resumed and the step it resumed at
    resumed_from: Run | None = field(default=None, repr=False)
    resumed_at: int | None = None
    #: ``--checkpoint`` directory the run saved into (step: DIR/step, the k-th fit: DIR/fitk)
    checkpoint: str | None = None
    #: the run's name in ``nbdist.compare``'s legend (None: "run <id>"; ``Run.load``: the file)
    title: str | None = None
    #: what it was set up with, where the kernel could read it (``nbdist.runparams``):
    #: ``learning_rate``, ``global_batch``
    params: dict[str, Any] = field(default_factory=dict)
    #: what the ``loss`` column holds, for the dashboard's legend (None: the step's loss)
    loss_label: str | None = None
    #: a step run in the kernel: the cell it ran (``backends.cells.StepCell``: its text, flags
    #: and rewritten step), which ``explain(baseline=True)`` runs again on one replica
    step_cell: Any = field(default=None, repr=False)
    #: the run's input pipeline timed alone (``step.inputrate``) by its first explanation
    #: after it ended; later explanations reuse it
    input_rate: Any = field(default=None, repr=False)
    #: ``--elastic``: each restart of the workers after one died, in order (``Restart``)
    restarts: list[Restart] = field(default_factory=list)
    _epochs: list[dict[str, float]] = field(default_factory=list, repr=False)
    _table: ColumnTable = field(default_factory=lambda: ColumnTable(len(COLUMNS)), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _straggler_watch: StragglerWatch = field(default_factory=StragglerWatch, repr=False)

    def note(self, text: str) -> None:
        """Attach a caveat about this run's numbers (shown in the summary)."""
        if text not in self.notes:
            self.notes.append(text)

    @classmethod
    def load(cls, path: str) -> Run:
        """The Run an exported script wrote with ``--metrics PATH`` (all its workers' files,
        see ``telemetry.jsonl``): ``nbdist.Run.load(PATH).plot()`` redraws its dashboard."""
        files = read_files(path)
        head = files[0][0]
        ends = [end for _, _, end in files]
        status = "done" if all(e and e["end"] == "done" for e in ends) else next(
            (e["end"] for e in ends if e and e["end"] != "done"), "interrupted")
        run = cls(id=0, mode="step", strategy=head["strategy"], replicas=head["replicas"],
                  workers=head["workers"], status=status, started=head["started"],
                  loss_scale=head["loss_scale"], title=os.path.basename(path),
                  ended=max((e or {}).get("ended", head["started"]) for e in ends))
        RunWriter(run).append_rows(sorted((r for _, rows, _ in files for r in rows),
                               key=lambda r: (r.step, r.worker, r.replica)))
        if len(files) < head["workers"]:
            run.note(f"{len(files)} of {head['workers']} workers' files were found next to "
                     f"{path}")
        if status != "done":
            run.note(f"the job ended {status} (no worker's file ends with done)"
                     if status == "interrupted" else f"a worker ended {status}")
        return run

    # -- reading -------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """Its ``--name``, else what sets it apart from this kernel's other runs
        (``telemetry.labels``): ``"run 2 · lr 0.001"``."""
        from .labels import run_labels

        others = runs if any(r is self for r in runs) else [self]
        return run_labels(others)[next(i for i, r in enumerate(others) if r is self)]

    @property
    def n_rows(self) -> int:
        """How many rows are recorded (one per step and replica or worker): the index the
        next row will have, for ``block_since``, ``rows_since`` and ``extras_since``."""
        return self._table.n

    def block_since(self, start: int, stop: int | None = None) -> np.ndarray:
        """Rows appended since row index ``start`` (up to ``stop``) as one float64 array, a
        row per line and the columns of ``COLUMNS`` (``rows.POSITION`` gives each column's
        index)."""
        with self._lock:
            return self._table.block(start, stop)

    def rows_since(self, start: int) -> list[Row]:
        """Rows appended since row index ``start``, as ``Row`` tuples."""
        return [as_row(values) for values in self.block_since(start).tolist()]

    def table_since(self, start: int) -> tuple[list[str], np.ndarray]:
        """Rows appended since row index ``start``: the column names (``COLUMNS``, then the
        extras) and their values, one row per line (what a worker sends the kernel; see
        ``rows.pack``)."""
        with self._lock:
            names = self._table.extra_names()
            parts = [self._table.block(start), *(self._table.extra(name, start)[:, None]
                                                 for name in names)]
        return [*COLUMNS, *names], np.hstack(parts) if names else parts[0]

    @property
    def steps_done(self) -> int:
        """Number of distinct steps recorded."""
        last = self._table.last()
        return 0 if last is None else int(last[POSITION.step]) + 1

    def _last_step_rows(self, span: int) -> np.ndarray:
        """The rows of the most recent step, among the last ``span`` rows."""
        with self._lock:
            recent = self._table.block(self._table.n - span)
        if not len(recent):
            return recent
        steps = recent[:, POSITION.step]
        return recent[steps == steps[-1]]

    @property
    def last(self) -> dict[str, Any]:
        """The most recent step as a dict of per-replica means, and its ``global_loss`` (see
        ``loss_scale``; empty before the first step)."""
        mine = self._last_step_rows(self.replicas * self.workers * 2)
        if not len(mine):
            return {}
        out: dict[str, Any] = {"step": int(mine[-1, POSITION.step]),
                               "epoch": int(mine[-1, POSITION.epoch])}
        for name in MEASURED:
            out[name] = _nanmean(mine[:, getattr(POSITION, name)].tolist())
        out["global_loss"] = out["loss"] * self.loss_scale
        return out

    def stragglers(self) -> list[Straggler]:
        """The replica (worker, with several) the others waited for at most of the recent
        timed steps, long enough to matter (``telemetry.stragglers``); empty if none."""
        by, ranks = ("worker", self.workers) if self.workers > 1 else ("replica", self.replicas)
        return self._straggler_watch.stragglers(self.block_since, by, ranks)

    @property
    def metrics(self) -> pd.DataFrame:
        """Every row recorded so far as a pandas DataFrame: one row per (step, replica or
        worker), the columns of ``COLUMNS`` (``step``, ``replica``, ``loss``, ``grad_norm``,
        ``allreduce_ms``, ``step_ms``...), then the extra metrics the run reported."""
        import pandas as pd

        with self._lock:
            block = self._table.block()
            extras = {name: self._table.extra(name) for name in self._table.extra_names()}
        frame = pd.DataFrame(block, columns=list(COLUMNS))
        for name in INTEGERS:
            frame[name] = frame[name].astype(np.int64)
        for name, values in extras.items():
            frame[name] = values
        return frame

    @property
    def epoch_metrics(self) -> pd.DataFrame:
        """One row per finished epoch of a ``model.fit``: ``epoch``, ``step`` (the epoch's last
        step) and what Keras logged at the epoch's end (``val_loss``... with validation
        data). Empty for step-mode runs."""
        import pandas as pd

        with self._lock:
            rows = [dict(r) for r in self._epochs]
        frame = pd.DataFrame(rows, columns=list(dict.fromkeys(
            ["epoch", "step", *(k for r in rows for k in r)])))
        for name in ("epoch", "step"):
            frame[name] = frame[name].astype(np.int64)
        return frame

    def epoch_rows(self, start: int = 0) -> list[dict[str, float]]:
        """``epoch_metrics`` from its row ``start`` on, as dicts (what the dashboard reads)."""
        with self._lock:
            return [dict(r) for r in self._epochs[start:]]

    def extras_since(self, start: int, stop: int | None = None) -> dict[str, np.ndarray]:
        """The extra metrics (name -> values, NaN where a row has none) of rows ``start`` to
        ``stop``, aligned with ``block_since(start, stop)``."""
        with self._lock:
            return {name: self._table.extra(name, start, stop)
                    for name in self._table.extra_names()}

    def lineage(self) -> list[Run]:
        """This run and the runs it resumed, the earliest first (``resumed_from`` chain)."""
        chain: list[Run] = [self]
        while (earlier := chain[-1].resumed_from) is not None and \
                all(r is not earlier for r in chain):
            chain.append(earlier)
        return chain[::-1]

    @property
    def duration(self) -> float:
        """Seconds from the start to the end of the run (to now while it runs)."""
        return (self.ended or time.time()) - self.started

    def summary(self) -> str:
        """A few lines saying how the run went: status, steps, throughput, the latest
        per-replica numbers, notes (printed where no dashboard is drawn and under each finished
        dashboard)."""
        last = self.last
        steps = self.steps_done
        rate = steps / self.duration if self.duration > 0 else math.nan
        head = (
            f"Run {self.id} ({self.mode}, {self.strategy}, {count(self.replicas, 'replica')}"
            f"{f' x {self.workers} workers' if self.workers > 1 else ''}): {self.status}, "
            f"{count(steps, 'step')} in {self.duration:.1f} s ({rate:.1f} steps/s)"
        )
        lines = [head]
        if last:
            name = "loss (sum of replicas)" if self.loss_scale > 1 else "loss"
            parts = [f"{n} {last[k]:.4g}" for n, k in ((name, "global_loss"),
                                                      ("grad_norm", "grad_norm"))
                     if _finite(last[k])]
            parts += [f"{k} {last[k]:.2f}"     # other_collective_ms: only when there are some
                      for k in ("allreduce_ms", "other_collective_ms", "step_ms")
                      if _finite(last[k]) and (last[k] or k != "other_collective_ms")]
            # steps and epochs counted from 1, as the dashboard's header and Keras' log show them
            total = f"/{self.total_steps}" if self.total_steps else ""
            epochs = f"/{self.epochs}" if self.epochs else ""
            where = f"  step {last['step'] + 1}{total} (epoch {last['epoch'] + 1}{epochs}): "
            lines.append(where + ", ".join(parts))
            per_replica = self.last_losses()
            if len(per_replica) > 1:
                lines.append("  loss per replica: " + ", ".join(f"{v:.4g}" for v in per_replica))
        if self.error:
            lines.append(f"  error: {self.error}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


    def plot(self, **options: Any) -> Any:
        """A static plotly Figure of this run: per-replica loss, gradient norm, allreduce and
        compute times, the global lines and its stragglers marked (see ``nbdist.widgets.figure``;
        options: ``max_points``, ``per_replica=True`` to draw every replica's line above 16
        series, where the panels show median and bands...)."""
        return _view("plot")(self, **options)

    def to_tensorboard(self, logdir: str, name: str | None = None) -> Any:
        """Write the metrics as TensorBoard scalars, one subdirectory per replica/worker so
        TensorBoard overlays them; returns the run's directory (``logdir/name``)."""
        return _view("tensorboard")(self, logdir, name)

    def explain(self, link: tuple[float, float] | None = None, baseline: bool = False,
                measure: bool = True) -> Any:
        """Where this run's step time goes and what to change, ranked by the gain predicted
        (``telemetry.explain``; ``print`` it, or let the notebook draw its table).
        ``link``: (bytes/s, one-way latency ms) of the link between ranks, if known.
        ``baseline``: also run the step on one replica for a few seconds, on copies of the
        objects it trains (``nbdist.step.baseline``), for the run's scaling efficiency.
        ``measure``: time the run's input pipeline alone, about a second, once per ended run
        (``nbdist.step.inputrate``); False: infer the input's share from the step's timings."""
        rate = (_view("input_rate")(self) if measure
                else "measuring was turned off (measure=False)")
        if not baseline:
            return _view("explain")(self, link, None, rate)
        _view("explain")(self, link, None, rate)   # refuses a run it cannot explain first
        return _view("explain")(self, link, _view("baseline")(self), rate)

    def last_losses(self) -> list[float]:
        """Each replica's (or worker's) loss at the most recent step."""
        return self._last_step_rows(self.replicas * self.workers)[:, POSITION.loss].tolist()

    def __repr__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(self.summary())}</pre>"


class RunWriter:
    """The writing side of a Run, for nbdist's runners and the receivers of worker rows (users
    only read a Run): ``RunWriter(run).record_step(...)``. Appending is under the run's lock
    and publishes the new row count last (see the module docstring)."""

    __slots__ = ("run",)

    def __init__(self, run: Run):
        self.run = run

    def record_step(
        self,
        step: int,
        epoch: int,
        *,
        loss: Sequence[float],
        step_ms: float,
        grad_norm: Sequence[float] | None = None,
        allreduce_ms: Sequence[float] | None = None,
        wait_ms: Sequence[float] | None = None,
        compute_ms: Sequence[float] | None = None,
        other_collective_ms: Sequence[float] | None = None,
        data_ms: float = _NAN,
        worker: int = 0,
        replica: int | None = None,
        extra: Mapping[str, float | Sequence[float]] | None = None,
        wall_time: float | None = None,
    ) -> None:
        """Append one step: one row per entry of ``loss`` (one per replica).

        ``replica=-1`` labels a single value already reduced over all replicas (Keras fit).
        ``extra``: metrics beyond the columns, each one value for every row or one per row.
        """
        n = len(loss)
        columns = Row(step, epoch, np.arange(n) if replica is None else replica, worker, loss,
                      grad_norm, allreduce_ms, wait_ms, compute_ms, other_collective_ms,
                      step_ms, data_ms, time.time() if wall_time is None else wall_time)
        block = np.empty((n, len(COLUMNS)))
        for i, values in enumerate(columns):
            block[:, i] = _NAN if values is None else values
        self.append_block(block, {k: np.broadcast_to(np.asarray(v, dtype=np.float64), n).copy()
                                  for k, v in (extra or {}).items()})

    def append_block(self, block: np.ndarray,
                     extras: Mapping[str, np.ndarray] | None = None) -> None:
        """Append whole steps at once: ``block`` has one row per step and replica or worker
        and the columns of ``COLUMNS`` (``rows.block_from_columns`` builds one), ``extras``
        maps a metric's name to one value per row."""
        with self.run._lock:
            self.run._table.append(block, extras)

    def append_rows(self, rows: Sequence[Row],
                    extras: Sequence[Mapping[str, float] | None] | None = None) -> None:
        """Append whole steps given as ``Row`` tuples; ``extras[i]`` are ``rows[i]``'s."""
        block = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(COLUMNS))
        columns: dict[str, np.ndarray] = {}
        for i, row_extras in enumerate(extras or ()):
            for name, value in (row_extras or {}).items():
                columns.setdefault(name, np.full(len(rows), _NAN))[i] = value
        self.append_block(block, columns or None)

    def record_epoch(self, epoch: int, step: int, logs: Mapping[str, float]) -> None:
        """Append a finished epoch's numbers (``Run.epoch_metrics``); an epoch recorded again
        (a worker's copy arriving late) replaces the earlier row."""
        row = {"epoch": float(epoch), "step": float(step), **{k: float(v) for k, v in
                                                              logs.items()}}
        with self.run._lock:
            kept = [r for r in self.run._epochs if r["epoch"] != row["epoch"]]
            self.run._epochs[:] = sorted([*kept, row], key=lambda r: r["epoch"])

    def checkpointed(self, directory: str, first_step: int) -> None:
        """The run saves into ``directory`` and starts at ``first_step``: when it resumed
        (``first_step > 0``), link it to the last Run of this kernel that saved there
        (``Run.resumed_from``), whose rows before ``first_step`` continue its curves."""
        run = self.run
        run.checkpoint = directory
        earlier = _LAST_IN.get(directory)
        if first_step > 0 and earlier is not None and earlier is not run:
            run.resumed_from, run.resumed_at = earlier, first_step
        _LAST_IN[directory] = run

    def update(self, **facts: Any) -> None:
        """Set what the run's runners learn about it as it goes (the names of ``LEARNED``):
        its length, how its losses add up, what its dashboard labels, its all-reduce size, its
        ``--checkpoint`` directory, its input pipeline's measured rate, its ``--elastic``
        restarts, what it was set up with (``params``)."""
        unknown = sorted(set(facts) - LEARNED)
        if unknown:
            raise TypeError(f"RunWriter.update sets only {sorted(LEARNED)}, not {unknown}")
        for name, value in facts.items():
            setattr(self.run, name, value)

    def replace_note(self, marker: str, text: str) -> None:
        """Replace the notes that contain ``marker`` by ``text`` (a note whose count changes
        as the run goes on)."""
        notes = self.run.notes
        notes[:] = [n for n in notes if marker not in n]
        self.run.note(text)

    def finish(self, status: str, error: str | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; expected one of {STATUSES}")
        run = self.run
        run.status, run.error, run.ended = status, error, time.time()
        with run._lock:
            run._table.trim()      # a finished run keeps its rows, not a half-empty chunk


class RunObserver:
    """Something that follows a run while it trains: the dashboard, a progress line, the lab
    status bar, a checkpoint's check of the compiled step. Runners call ``on_step`` after each
    recorded step (or group of steps) and stop when ``should_stop`` says so; subclasses
    override what they need."""

    def on_step(self, run: Run) -> None:
        """New rows are in ``run``."""

    def should_stop(self) -> bool:
        """True to end the run after the current step (the Stop button)."""
        return False

    def on_traced(self, tf_function: Any, batch: Any, timed: bool) -> None:
        """A step variant was compiled and ran once (``timed``: the variant that times its
        all-reduce); ``tf_function.get_concrete_function(batch)`` is then free."""


#: checkpoint directory -> the last Run that saved there (``RunWriter.checkpointed``)
_LAST_IN: weakref.WeakValueDictionary[str, Run] = weakref.WeakValueDictionary()

#: name -> function(run, ...): how a Run is drawn or exported (see the module docstring).
_VIEWS: dict[str, Callable[..., Any]] = {}


def register_view(name: str, function: Callable[..., Any]) -> None:
    """Provide ``Run.plot`` (``name="plot"``), ``Run.to_tensorboard`` (``"tensorboard"``),
    ``Run.explain`` (``"explain"``) or its one-replica probe (``"baseline"``);
    called by the modules that draw, export or explain a Run, so that the store imports none
    of them."""
    _VIEWS[name] = function


def _view(name: str) -> Callable[..., Any]:
    try:
        return _VIEWS[name]
    except KeyError:
        raise RuntimeError(f"nothing provides Run {name!r}: `import nbdist` registers it") \
            from None


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _nanmean(values: Iterable[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else _NAN


class RunList(list):
    """``nbdist.runs``: every Run of this kernel, most recent last."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        #: fields every new Run takes unless given (the running cell's ``--name``, params)
        self.defaults: dict[str, Any] = {}

    def new(self, **kwargs: Any) -> Run:
        defaults = {k: dict(v) if isinstance(v, dict) else v for k, v in self.defaults.items()}
        run = Run(id=len(self) + 1, **{**defaults, **kwargs})
        self.append(run)
        return run


runs = RunList()


def runs_summary(runs: Sequence[Run]) -> str:
    """``"3 (last: done, 400 steps)"``: how many runs, and how the last one ended."""
    last = runs[-1]
    return f"{len(runs)} (last: {last.status}, {last.steps_done} steps)"
