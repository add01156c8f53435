"""The kernel's nbdist state: the chosen strategy and the runs made under it.

The magics only parse; everything they do goes through ``Session`` so that the picker widget
and the lab extension act through the same code path.
"""

from __future__ import annotations

import ast
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from .errors import ConfigError, NbdistError
from .rewrite import rewrite_step
from .spec import RunSpec, StrategySpec
from .strategies import StrategyHandle, build_strategy
from .telemetry.run import Run, runs


class Session:
    """One per kernel (see ``current_session``)."""

    def __init__(self, shell: Any):
        self.shell = shell
        self.handle: StrategyHandle | None = None
        self.runs = runs
        self.listeners: list[Callable[[], None]] = []   # called when the state changes
        self.lab_channel: Any = None                     # nbdist.lab.comm.LabChannel, if open
        self.cluster: Any = None        # a MultiWorkerCluster or ParameterServerCluster
        self._cells = 0

    # -- strategy --------------------------------------------------------------------------
    def configure(self, spec: StrategySpec, keras: str = "auto") -> Any:
        """Make ``spec`` the kernel's strategy (a no-op if it already is).

        Returns the StrategyHandle, or for ``multiworker`` the MultiWorkerCluster running the
        worker processes (``keras``: which Keras they run, see ``resolve_keras``).
        """
        if spec.name in ("multiworker", "parameter_server"):
            return self._configure_cluster(spec, keras)
        if self.cluster is not None:
            self._stop_cluster()
        if self.handle is None or self.handle.spec != spec:
            from .cluster.paramserver.context import check_kernel_usable

            check_kernel_usable()   # after parameter_server, TensorFlow may be stuck to it
            self.handle = build_strategy(spec)
            self._changed()
        return self.handle

    def _configure_cluster(self, spec: StrategySpec, keras: str) -> Any:
        from .cluster.multiworker.backend import MultiWorkerCluster

        if spec.name == "parameter_server":
            return self._configure_ps(spec)
        current = self.cluster
        if current is not None and current.spec == spec and keras in ("auto", current.keras_choice):
            return current
        self._stop_cluster()
        cluster = MultiWorkerCluster(spec, self.runs, keras=keras)
        keras = "tf_keras" if cluster.keras == "legacy" else "Keras 3"
        what = (f"workers on the engines of ipyparallel profile {spec.cluster!r}"
                if spec.cluster else f"{cluster.n} worker processes")
        print(f"nbdist: starting {what}; they run {keras} as tf.keras "
              f"({cluster.keras_note}), this kernel keeps its own Keras.")
        cluster.start()
        self.handle, self.cluster = None, cluster
        self._changed()
        return cluster

    def _configure_ps(self, spec: StrategySpec) -> Any:
        from .cluster.paramserver.backend import ParameterServerCluster

        if self.cluster is not None and self.cluster.spec == spec:
            return self.cluster
        cluster = ParameterServerCluster(spec, self.runs)   # validates before stopping
        self._stop_cluster()
        print(f"nbdist: starting {cluster.n} worker(s) and {cluster.n_ps} parameter server(s) "
              "as tf.distribute.Server processes; this kernel is their coordinator.")
        cluster.start()
        self.handle, self.cluster = None, cluster
        self._changed()
        return cluster

    def _stop_cluster(self) -> list[int]:
        cluster, self.cluster = self.cluster, None
        return cluster.stop() if cluster is not None else []

    def restart(self) -> Any:
        """Replace the worker processes with fresh ones (after a fault, or to reset them)."""
        if self.cluster is None:
            raise ConfigError("There are no worker processes to restart. Start them with "
                              "`%distribute multiworker --workers N`.")
        self.cluster = self.cluster.restarted()
        self._changed()
        return self.cluster

    def push(self, *names: str, **values: Any) -> None:
        """Copy kernel variables (by name) and ``values`` into every worker's namespace."""
        missing = [n for n in names if n not in self.shell.user_ns]
        if missing:
            raise ConfigError(f"push: no variable {', '.join(map(repr, missing))} in the kernel.")
        self._require_cluster("push").push(
            {**{n: self.shell.user_ns[n] for n in names}, **values})

    def pull(self, name: str, worker: int = 0) -> Any:
        """The value of ``name`` in worker ``worker``'s namespace."""
        return self._require_cluster("pull").pull(name, worker)

    def _require_cluster(self, what: str) -> Any:
        if self.cluster is None:
            raise ConfigError(f"`{what}` moves values between the kernel and worker processes; "
                              "start them first with `%distribute multiworker --workers N`.")
        return self.cluster

    def require(self, inline: StrategySpec | None) -> Any:
        """The strategy a cell runs under: the session's, or the cell's inline one."""
        current = self.cluster.spec if self.cluster is not None else (
            self.handle.spec if self.handle is not None else None)
        if inline is not None:
            if current is None:
                return self.configure(inline)
            if inline != current:
                raise ConfigError(
                    f"This cell asks for `{inline.magic_line()}` but the kernel's strategy is "
                    f"`{current.magic_line()}`. Drop the strategy from the cell line, "
                    "or switch the kernel with `%distribute stop` and then the new line."
                )
        if self.cluster is not None:
            return self.cluster
        if self.handle is None:
            raise ConfigError(
                "No strategy is set. Run `%distribute mirrored --devices 2` (or another "
                "strategy) first, or put the strategy on the cell line: "
                "`%%distribute mirrored --devices 2`."
            )
        return self.handle

    def stop(self) -> list[int]:
        """Forget the strategy and stop any worker processes (returns pids that had to be
        killed). Logical CPU devices stay: TensorFlow cannot undo them."""
        killed = self._stop_cluster()
        self.handle = None
        self._changed()
        return killed

    def status_text(self) -> str:
        if self.cluster is not None:
            if self.cluster.spec.name == "parameter_server":
                from .cluster.paramserver.status import status_text
            else:
                from .cluster.multiworker.status import status_text

            return status_text(self.cluster, self.runs)
        if self.handle is None:
            return "nbdist: no strategy set. Try `%distribute mirrored --devices 2`."
        h = self.handle
        split_cpu = h.device_kind == "CPU" and len(h.devices) > 1
        logical = ", logical devices of one CPU" if split_cpu else ""
        lines = [
            f"strategy   {h.spec.name} ({h.spec.tf_class})",
            f"replicas   {h.replicas}",
            f"devices    {', '.join(h.devices)} ({h.device_kind}{logical})",
            f"magic      {h.spec.magic_line()}",
            f"runs       {len(self.runs)}"
            + (f" (last: {self.runs[-1].status}, {self.runs[-1].steps_done} steps)"
               if self.runs else ""),
            "",
            "Equivalent TensorFlow:",
            *("    " + line for line in h.equivalent_code().splitlines()),
        ]
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        """A JSON snapshot for the lab extension's status bar."""
        from . import __version__

        h = self.handle
        last = self.runs[-1] if self.runs else None
        return {
            "version": __version__,
            "strategy": h.spec.name if h else None,
            "magic_line": h.spec.magic_line() if h else None,
            "replicas": h.replicas if h else 0,
            "devices": list(h.devices) if h else [],
            "workers_total": 0,
            "workers_alive": 0,
            "dead_workers": [],
            "stragglers": [],
            "run": None if last is None else {
                "id": last.id, "status": last.status, "step": last.steps_done,
                "epoch": int(last.last.get("epoch", 0)), "total_steps": last.total_steps,
            },
        } | self._cluster_state()

    def _cluster_state(self) -> dict[str, Any]:
        if self.cluster is None:
            return {}
        if self.cluster.spec.name == "parameter_server":
            from .cluster.paramserver.status import state
        else:
            from .cluster.multiworker.status import state

        spec = self.cluster.spec
        return {"strategy": spec.name, "magic_line": spec.magic_line(), **state(self.cluster)}

    # -- cells -----------------------------------------------------------------------------
    def run_step_cell(self, cell: str, spec: RunSpec, observers: list[Any],
                      header: str = "") -> Run:
        """Step mode: rewrite the cell into a per-replica step and train with it."""
        from .data import lookup_dataset, steps_per_epoch
        from .runner import StepRunner

        handle = self.require(spec.strategy)
        spec = _with_checkpoint_dir(spec)
        if handle is self.cluster:
            return self._on_cluster(self.cluster.run_step_cell, cell, spec, observers, header)
        self._cells += 1
        source = rewrite_step(
            f"# {header}\n{cell}", filename=f"<nbdist-step-{self._cells}>",
            loss=spec.loss, grads=spec.grads,
        )
        if spec.show_code:
            print(source.source)
        assert spec.data is not None
        dataset = lookup_dataset(self.shell.user_ns, spec.data)
        checkpoint = None
        if spec.checkpoint:
            from .checkpoint import StepCheckpoint

            checkpoint = StepCheckpoint.for_cell(spec.checkpoint, handle.strategy, cell,
                                                 self.shell.user_ns, say=print)
        per_epoch = (steps_per_epoch(dataset, spec.steps)
                     if hasattr(dataset, "cardinality") else None)
        run = self.runs.new(
            mode="step", strategy=handle.spec.name, replicas=handle.replicas,
            devices=handle.devices, total_steps=per_epoch * spec.epochs if per_epoch else None,
        )
        self._changed()
        runner = StepRunner(handle, source, self.shell.user_ns, spec, run,
                            observers=[*observers, _Notify(self._changed)], checkpoint=checkpoint)
        try:
            return runner.execute()
        finally:
            self._changed()

    def run_scope_cell(self, cell: str, spec: RunSpec, observers: list[Any],
                       header: str = "") -> Any:
        """Scope mode: run the cell under ``strategy.scope()``; record every ``model.fit``."""
        from .kerashooks import recording_fit

        handle = self.require(spec.strategy)
        spec = _with_checkpoint_dir(spec)
        if handle is self.cluster:
            extra = {"checkpoint": spec.checkpoint} if spec.checkpoint else {}
            return self._on_cluster(self.cluster.run_scope_cell, cell, None, observers, header,
                                    **extra)
        text = f"# {header}\n{cell}"
        filename = self.shell.compile.cache(text)
        tree = ast.parse(self.shell.transform_cell(text), filename=filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None

        def new_run() -> Run:
            run = self.runs.new(mode="fit", strategy=handle.spec.name,
                                replicas=handle.replicas, devices=handle.devices)
            self._changed()
            return run

        user_ns = self.shell.user_ns
        central = handle.spec.name == "central_storage"
        fits = None
        if spec.checkpoint:
            from .checkpoint import FitCheckpoint

            fits = FitCheckpoint(spec.checkpoint, say=print)
        with handle.strategy.scope(), recording_fit(
                new_run, observers, central,
                extra_callbacks=fits.callbacks if fits else None) as started:
            exec(self.shell.compile(tree, filename, "exec"), user_ns)  # noqa: S102 - user's cell
            result = None
            if last is not None:
                expr = ast.Expression(last.value)
                result = eval(self.shell.compile(expr, filename, "eval"), user_ns)  # noqa: S307
        if fits is not None and not started:
            from .checkpoint import NOTHING_TRAINED

            print(NOTHING_TRAINED.format(dir=spec.checkpoint))
        self._changed()
        return result

    def _on_cluster(self, method: Callable[..., Any], cell: str, spec: RunSpec | None,
                    observers: list[Any], header: str, **options: Any) -> Any:
        observers = [*observers, _Notify(self._changed)]
        try:
            if spec is None:
                return method(cell, observers, header=header, **options)
            return method(cell, spec, observers, header=header)
        finally:
            self._changed()

    # -- listeners -------------------------------------------------------------------------
    def flush_listeners(self, *_: Any) -> None:
        """After each cell: make sure the lab extension has the latest state."""
        if self.lab_channel is not None:
            self.lab_channel.publish()   # state that changed outside nbdist (a worker died)
            self.lab_channel.flush()

    def _changed(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # a broken status display must never stop training
                pass


def _with_checkpoint_dir(spec: RunSpec) -> RunSpec:
    """``--checkpoint DIR`` made absolute and checked writable, before anything runs."""
    if not spec.checkpoint:
        return spec
    from .checkpoint import prepare_dir

    return dataclasses.replace(spec, checkpoint=prepare_dir(spec.checkpoint))


class _Notify:
    """Observer that tells the session's listeners (the lab status bar) about progress.

    At most 5 times a second: building the state on every step cost ~20% of a tiny model's
    throughput (measured with benchmarks/overhead.py).
    """

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
