"""The kernel's nbdist state: the chosen strategy and the runs made under it.

The magics only parse; everything they do goes through ``Session`` so that the picker widget
and the lab extension act through the same code path. The Session holds one ``Backend``
(made by ``factory.make_backend``) and never asks which strategy family it is.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from .backends.base import (
    WORKERS_LINE,
    Backend,
    BackendStatus,
    no_faults,
    no_workers,
    no_workers_to_restart,
    status_text,
)
from .backends.cells import RanCell, prepare_scope_cell, prepare_step_cell
from .backends.kernelstate import strategy_mismatch
from .data.iterate import release_free_memory_when_idle
from .displayguard import DisplayGuard
from .errors import ConfigError, NbdistError
from .factory import make_backend
from .families import family
from .runparams import cell_params, cell_params_names, learning_rate_of
from .spec import RunSpec, StrategySpec
from .step.baseline import measure_baseline
from .step.inputrate import measure_input
from .step.pasted import use_session_strategy
from .telemetry.run import Run, RunObserver, RunWriter, register_view, runs
from .tflogs import import_tensorflow_quietly

#: The strategy line messages suggest in a kernel that never ran one.
GENERIC_LINE = "%distribute mirrored --devices 2"


def _saved_to(run: Run, checkpoint: str | None) -> None:
    """``--checkpoint DIR`` on a Run trained in worker processes, whose own Run there linked
    it: the kernel's Run saved to DIR, and resumed at its first step if that is not 0."""
    if checkpoint is None or run.checkpoint is not None or run.mode != "step":
        return
    import os

    from .telemetry.run import RunWriter

    steps = run.metrics["step"]
    RunWriter(run).checkpointed(os.path.join(checkpoint, "step"),   # as StepCheckpoint's
                                int(steps.min()) if len(steps) else 0)


def _learning_rate_after(made: list[Run], text: str, user_ns: dict[str, Any]) -> None:
    """The learning rate of runs whose optimizer the cell itself made (a scope cell that
    builds and compiles its model): read once the cell has run."""
    missing = [run for run in made if "learning_rate" not in run.params]
    if not missing:
        return
    rate = learning_rate_of(user_ns.get(name) for name in cell_params_names(text))
    if rate is not None:
        for run in missing:
            RunWriter(run).update(params={**run.params, "learning_rate": rate})


def missing_in_kernel(missing: list[str], user_ns: dict[str, Any]) -> str:
    """``%distribute push`` of names the kernel does not have: the close ones it has."""
    import difflib

    have = [n for n in user_ns if not n.startswith("_") and n not in ("In", "Out")]
    close = {n: difflib.get_close_matches(n, have, n=3) for n in missing}
    hints = "; ".join(f"for {n!r}, did you mean {' or '.join(f'`{c}`' for c in found)}?"
                      for n, found in close.items() if found)
    return (f"push: no variable {', '.join(map(repr, missing))} in the kernel: push sends "
            "the kernel's variables as they are now. "
            + (f"{hints[0].upper()}{hints[1:]} " if hints else "")
            + "Run the cell that assigns it first, or check its spelling "
            "(`%who` lists the kernel's variables).")


class Session:
    """One per kernel (see ``current_session``): the kernel's backend and its runs."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.backend: Backend | None = None
        self.runs = runs
        self.listeners: list[Callable[[], None]] = []   # called when the state changes
        self._display = DisplayGuard(logging.getLogger(__name__))   # for the listeners
        self.lab_channel: Any = None                     # nbdist.lab.comm.LabChannel, if open
        self._cells = 0
        self._in_cell = False                            # a %%distribute cell is running
        self._release_memory = False                     # hand free heap memory back after the cell
        self._published: Any = None                      # the `strategy` nbdist put in user_ns
        self._plain: contextlib.ExitStack | None = None  # around a cell without %%distribute
        self._told: set[str] = set()                     # one-time notes already printed
        self.ran_cells: list[RanCell] = []               # %%distribute cells that succeeded
        # the last strategy line that took effect, and its spec: what messages suggest
        # once the strategy is stopped (or failed to start again)
        self.last_line: str | None = None
        self.last_spec: StrategySpec | None = None
        # the status bar's bottleneck of the live (or last) run, once a status bar follows
        # the runs (``follow_verdict``)
        self.verdict: Any = _NoVerdict()

    def follow_verdict(self, make: Callable[[Callable[[], None]], Any]) -> None:
        """Keep a verdict on the runs for the state (``load_ipython_extension`` registers the
        lab status bar's ``lab.verdict.LiveVerdict``, so that the session imports no view):
        ``make(changed)`` builds it, a RunObserver with ``verdict``, ``finish(run)`` and
        ``clear()`` that calls ``changed()`` when its verdict changes."""
        self.verdict = make(self._changed)

    # -- strategy --------------------------------------------------------------------------
    def configure(self, spec: StrategySpec, keras: str | None = None,
                  line: str | None = None) -> Backend:
        """Make ``spec`` the kernel's strategy (a no-op if it already is); return its backend.

        ``keras``: which Keras worker processes run (``multiworker --keras``); ``line``: the
        ``%distribute`` line as the user typed it (None: the spec's own). The new backend
        is validated before the current one is stopped: a refused line changes nothing.
        """
        import_tensorflow_quietly()   # its start-up lines are not the user's business
        current = self.backend
        if current is not None and current.serves(spec, keras):
            self._remember(spec, keras, line)
            return current
        fresh = make_backend(spec, self.runs, self.shell, keras)   # validates, starts nothing
        if current is not None and current.exclusive:
            self._stop_backend()
        message = fresh.starting_message()
        if message:
            print(message)
        fresh.start()   # if this fails, a backend that was not exclusive stays the kernel's
        exposed = fresh.exposure()
        if exposed:
            print(exposed)
        self._stop_backend()
        self.backend = fresh
        self._remember(spec, keras, line)
        self.verdict.clear()
        self._publish_strategy()
        self._changed()
        return fresh

    def _remember(self, spec: StrategySpec, keras: str | None, line: str | None) -> None:
        if line is None:
            line = spec.magic_line() + (f" --keras {keras}" if keras else "")
        self.last_line, self.last_spec = line, spec

    def _suggest(self) -> str:
        """The strategy line a message suggests: this kernel's last one, else a generic one."""
        if self.last_line is None:
            return f"`{GENERIC_LINE}` (or another strategy)"
        return f"`{self.last_line}` again (the last strategy of this kernel)"

    def _workers_line(self) -> str:
        """The line refusals that need worker processes suggest: this kernel's last one if
        its family has workers, else a generic one."""
        last = self.last_spec
        if last is not None and self.last_line is not None and not family(last.name).in_kernel:
            return self.last_line
        return WORKERS_LINE

    def strategy(self) -> Any:
        """The session's tf.distribute strategy in this kernel (``nbdist.strategy()``)."""
        if self.backend is None:
            last = self.last_spec
            if last is not None and not family(last.name).in_kernel:
                raise ConfigError(
                    f"No strategy is set. Run {self._suggest()}; under it the strategy lives "
                    "in each worker process, not in the kernel: use `strategy` inside a "
                    "`%%distribute` cell, where every worker has its own.")
            raise ConfigError(f"No strategy is set: run {self._suggest()} first; `strategy` "
                              "is then the notebook's.")
        strategy = self.backend.kernel_strategy()
        if strategy is None:
            raise ConfigError(
                f"Under `{self.backend.spec.magic_line()}` the strategy lives in each worker "
                "process, not in the kernel: use `strategy` inside a `%%distribute` cell, "
                "where every worker has its own.")
        return strategy

    def _publish_strategy(self) -> None:
        """Put the session's strategy in the user's namespace as ``strategy`` (what every
        TensorFlow tutorial calls it), unless that name holds something of the user's."""
        ns = self.shell.user_ns
        ours = "strategy" not in ns or ns["strategy"] is self._published
        strategy = None if self.backend is None else self.backend.kernel_strategy()
        if not ours:
            if strategy is not None and ns["strategy"] is not strategy:
                self._tell_once("strategy", (
                    "nbdist: `strategy` already names something of yours, so nbdist left it "
                    "alone; the notebook's strategy is `nbdist.strategy()`."))
            return
        if strategy is None:
            ns.pop("strategy", None)
        else:
            ns["strategy"] = strategy
        self._published = strategy

    def _stop_backend(self) -> list[int]:
        backend, self.backend = self.backend, None
        return backend.stop() if backend is not None else []

    def restart(self) -> Backend:
        """Replace the worker processes with fresh ones (after a fault, or to reset them)."""
        if self.backend is None:
            raise ConfigError(no_workers_to_restart(self._workers_line()))
        self.backend = self.backend.restarted()
        self._changed()
        return self.backend

    def push(self, *names: str, **values: Any) -> None:
        """Copy kernel variables (by name) and ``values`` into every worker's namespace."""
        missing = [n for n in names if n not in self.shell.user_ns]
        if missing:
            raise ConfigError(missing_in_kernel(missing, self.shell.user_ns))
        self._require_backend("push").push(
            {**{n: self.shell.user_ns[n] for n in names}, **values})

    def pull(self, name: str, worker: int = 0, into: Any = None) -> Any:
        """The value of ``name`` in worker ``worker``'s namespace. A Keras model comes as a
        model of this kernel's Keras: ``into`` (a kernel model) with the weights set in place
        when they have the same shapes, else one built from the model's config. Where cells
        run on this kernel's Keras, a Keras model ``into`` is already here: it is returned."""
        from .kerasmodel import is_keras_model

        backend = self._require_backend("pull")
        if backend.worker_keras is None and is_keras_model(into):
            return into
        return backend.pull(name, worker, into)

    def inject(self, fault: str | None, worker: str | None, at_step: int | None = None,
               delay: float | None = None) -> str:
        """``%distribute inject``: a real fault in a worker process (``cluster.injection``)."""
        if self.backend is None:
            raise ConfigError(no_faults(self._workers_line()))
        message = self.backend.inject(fault, worker, at_step, delay)
        self._changed()
        return message

    def _require_backend(self, what: str) -> Backend:
        if self.backend is None:
            raise ConfigError(no_workers(what, self._workers_line()))
        return self.backend

    def require(self, inline: StrategySpec | None) -> Backend:
        """The backend a cell runs on: the session's, or the cell's inline strategy's."""
        current = self.backend
        if inline is not None:
            if current is None:
                return self.configure(inline)
            if inline != current.spec:
                raise ConfigError(strategy_mismatch(inline, current.spec))
        if current is None:
            on_cell = self.last_spec.magic_line() if self.last_spec else GENERIC_LINE
            raise ConfigError(
                f"No strategy is set. Run {self._suggest()} first, or put the strategy on "
                f"the cell line: `%{on_cell}`."
            )
        return current

    def stop(self) -> list[int]:
        """Forget the strategy and stop any worker processes (returns pids that had to be
        killed). Logical CPU devices stay: TensorFlow cannot undo them."""
        killed = self._stop_backend()
        self.verdict.clear()
        self._publish_strategy()
        self._changed()
        return killed

    def status_text(self) -> str:
        if self.backend is None:
            return f"nbdist: no strategy set. Try {self._suggest()}."
        return status_text(self.backend.status(), self.runs)

    def status(self) -> BackendStatus | None:
        """The backend's status (what the lab extension's status bar shows); None without a
        strategy."""
        return self.backend.status() if self.backend is not None else None

    # -- cells -----------------------------------------------------------------------------
    def run_step_cell(self, cell: str, spec: RunSpec, observers: list[RunObserver],
                      header: str = "") -> Run:
        """Step mode: rewrite the cell into a per-replica step and train with it."""
        self._refuse_elastic(spec)
        backend = self.require(spec.strategy)
        return self._run(backend, backend.run_step_cell, prepare_step_cell, cell, spec,
                         observers, header)

    def run_scope_cell(self, cell: str, spec: RunSpec, observers: list[RunObserver],
                       header: str = "") -> Any:
        """Scope mode: run the cell under ``strategy.scope()``; record every ``model.fit``."""
        backend = self.require(spec.strategy)
        return self._run(backend, backend.run_scope_cell, prepare_scope_cell, cell, spec,
                         observers, header)

    def _refuse_elastic(self, spec: RunSpec) -> None:
        """``--elastic`` under a family whose workers cannot be restarted mid-cell: refused
        before anything starts (an inline strategy included)."""
        chosen = spec.strategy or (self.backend.spec if self.backend is not None else None)
        if spec.elastic is None or chosen is None or not family(chosen.name).no_elastic:
            return
        raise ConfigError(
            f"--elastic is not available under {chosen.name}: "
            f"{family(chosen.name).no_elastic}. It restarts the workers of `multiworker` "
            "(`%distribute multiworker --workers 2`) when one dies and resumes the cell from "
            "its --checkpoint; here drop --elastic (--checkpoint alone resumes the cell when "
            "you run it again). The cell did not run.")

    def _run(self, backend: Backend, method: Callable[[Any, list[RunObserver]], Any],
             prepare: Callable[..., Any], cell: str, spec: RunSpec, observers: list[RunObserver],
             header: str) -> Any:
        import_tensorflow_quietly()
        self._cells += 1
        # strategy code pasted from a tutorial: the session's strategy, or refused here
        text, said = use_session_strategy(cell, backend.spec,
                                          lambda: (backend.replicas, backend.devices))
        prepared = prepare(text, spec, header, self._cells)   # refuses before any Run exists
        if said:
            print(said)
        self._in_cell = True
        before, made_from = (self.runs[-1] if self.runs else None), len(self.runs)
        # each Run the cell makes is named and described as it is made: its dashboard's title
        self.runs.defaults = {"title": spec.name,
                              "params": cell_params(text, spec, self.shell.user_ns)}
        try:
            result = method(prepared, [*observers, _Notify(self._changed), self.verdict])
            self.ran_cells.append(RanCell(self._history_number(cell), cell, spec,
                                          backend.spec, backend.worker_keras))
            return result
        finally:
            self.runs.defaults = {}
            self._in_cell = False
            _learning_rate_after(self.runs[made_from:], text, self.shell.user_ns)
            if self.runs and self.runs[-1] is not before:
                _saved_to(self.runs[-1], prepared.spec.checkpoint)
            if self.runs:
                self.verdict.finish(self.runs[-1])
            self._changed()
            self._release_memory = True

    def _history_number(self, cell: str) -> int:
        """The running cell's In[n] (IPython stores a cell before running it); 0 if it is
        not in the history (run with store_history=False)."""
        raw = getattr(self.shell.history_manager, "input_hist_raw", [""])
        return len(raw) - 1 if raw[-1].rstrip().endswith(cell.rstrip()) else 0

    # -- cells without %%distribute --------------------------------------------------------
    def pasted_in_plain_cell(self, lines: list[str]) -> list[str]:
        """IPython input transformer (``shell.input_transformers_post``): while a strategy is
        set, strategy code pasted into a cell without ``%%distribute`` uses the session's
        strategy, or is refused before anything runs, as in a ``%%distribute`` cell. Without a
        strategy, and for the code a ``%%distribute`` cell runs, it changes nothing."""
        backend = self.backend
        if backend is None or self._in_cell:
            return lines
        cell = "".join(lines)
        text, said = use_session_strategy(
            cell, backend.spec, lambda: (backend.replicas, backend.devices), first_line=1,
            plain=True, kernel_has_it=backend.kernel_strategy() is not None)
        if said is None:
            return lines
        print(said)
        return text.splitlines(keepends=True)

    def pre_run_cell(self, info: Any = None) -> None:
        """Before any cell: while a strategy is set, record a ``model.fit`` of a model built
        under it (the backend decides which; a ``%%distribute`` cell records its own)."""
        self.post_run_cell()
        if self.backend is None:
            return
        stack = contextlib.ExitStack()
        stack.enter_context(self.backend.plain_cell_fits(
            lambda: self._in_cell, self._recorded_plain_fit,
            [_Notify(self._changed)]))    # the status bar follows it
        self._plain = stack

    def post_run_cell(self, *_: Any) -> None:
        stack, self._plain = self._plain, None
        if stack is not None:
            stack.close()
        if self._release_memory:   # what the cell's steps freed (nbdist.allocator): here, not
            self._release_memory = False   # in the magic, whose frames still held some of it
            release_free_memory_when_idle()

    def _recorded_plain_fit(self, run: Run) -> None:
        self._tell_once("plain fit", (
            f"nbdist: this model.fit is recorded as run {run.id} (nbdist.runs[-1]): the model "
            "was built under the notebook's strategy, so it trains on every replica here too. "
            "Fit it in a `%%distribute` cell to see the live dashboard."))
        self._changed()

    def _tell_once(self, key: str, text: str) -> None:
        if key not in self._told:
            self._told.add(key)
            print(text)

    # -- listeners -------------------------------------------------------------------------
    def flush_listeners(self, *_: Any) -> None:
        """After each cell: make sure the lab extension has the latest state."""
        if self.lab_channel is not None:
            self.lab_channel.publish()   # state that changed outside nbdist (a worker died)
            self.lab_channel.flush()

    def _changed(self) -> None:
        for listener in list(self.listeners):   # a broken status display must not stop training
            with self._display.guard("listener", "nbdist: a status display failed ({error}), "
                                     "a bug in nbdist; training goes on."):
                listener()


def _measure_input(run: Run) -> Any:
    """``Run.explain``'s input measurement, on the data of this kernel's notebook."""
    try:
        user_ns = current_session().shell.user_ns
    except NbdistError:   # no IPython shell: a Run explained from a script
        user_ns = None
    return measure_input(run, user_ns)


def _measure_baseline(run: Run) -> Any:
    """``Run.explain(baseline=True)``'s one-replica probe, on this kernel's strategy."""
    session = current_session()
    return measure_baseline(run, session.shell.user_ns, session.backend)


# the probes need the kernel's namespace and strategy, which the session holds (the Run
# store imports none of them, nor does ``step`` import the session)
register_view("input_rate", _measure_input)
register_view("baseline", _measure_baseline)


class _NoVerdict(RunObserver):
    """The verdict of a session that no status bar follows: nothing to show."""

    verdict = None

    def finish(self, run: Run) -> None:
        """The run ended: nothing to explain for."""

    def clear(self) -> None:
        """The strategy changed: nothing to forget."""


class _Notify(RunObserver):
    """Observer that tells the session's listeners (the lab status bar) about progress, at most
    5 times a second (on every step it would cost a tiny model a large share of its throughput:
    benchmarks/overhead.py measures it)."""

    interval = 0.2

    def __init__(self, callback: Callable[[], None]):
        self.callback = callback
        self._next = 0.0

    def on_step(self, run: Run) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            self.callback()

    def should_stop(self) -> bool:
        return False


_SESSION: Session | None = None


def current_session(shell: Any = None) -> Session:
    """The kernel's Session, created on first use."""
    global _SESSION
    if _SESSION is None:
        if shell is None:
            from IPython import get_ipython

            shell = get_ipython()
        if shell is None:
            raise NbdistError("nbdist needs an IPython shell: run it in Jupyter or IPython.")
        _SESSION = Session(shell)
    return _SESSION
