"""The kernel's nbdist state: the chosen strategy and the runs made under it.

The magics only parse; everything they do goes through ``Session`` so that the picker widget
and the lab extension act through the same code path.
"""

from __future__ import annotations

import ast
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
        self.lab_channel: Any = None                     # nbdist.labcomm.LabChannel, if open
        self._cells = 0

    # -- strategy --------------------------------------------------------------------------
    def configure(self, spec: StrategySpec) -> StrategyHandle:
        """Make ``spec`` the kernel's strategy (a no-op if it already is)."""
        if self.handle is None or self.handle.spec != spec:
            self.handle = build_strategy(spec)
            self._changed()
        return self.handle

    def require(self, inline: StrategySpec | None) -> StrategyHandle:
        """The strategy a cell runs under: the session's, or the cell's inline one."""
        if inline is not None:
            if self.handle is None:
                return self.configure(inline)
            if inline != self.handle.spec:
                raise ConfigError(
                    f"This cell asks for `{inline.magic_line()}` but the kernel's strategy is "
                    f"`{self.handle.spec.magic_line()}`. Drop the strategy from the cell line, "
                    "or switch the kernel with `%distribute stop` and then the new line."
                )
        if self.handle is None:
            raise ConfigError(
                "No strategy is set. Run `%distribute mirrored --devices 2` (or another "
                "strategy) first, or put the strategy on the cell line: "
                "`%%distribute mirrored --devices 2`."
            )
        return self.handle

    def stop(self) -> None:
        """Forget the strategy. Logical CPU devices stay: TensorFlow cannot undo them."""
        self.handle = None
        self._changed()

    def status_text(self) -> str:
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
        }

    # -- cells -----------------------------------------------------------------------------
    def run_step_cell(self, cell: str, spec: RunSpec, observers: list[Any],
                      header: str = "") -> Run:
        """Step mode: rewrite the cell into a per-replica step and train with it."""
        from .data import lookup_dataset, steps_per_epoch
        from .runner import StepRunner

        handle = self.require(spec.strategy)
        self._cells += 1
        source = rewrite_step(
            f"# {header}\n{cell}", filename=f"<nbdist-step-{self._cells}>",
            loss=spec.loss, grads=spec.grads,
        )
        if spec.show_code:
            print(source.source)
        assert spec.data is not None
        dataset = lookup_dataset(self.shell.user_ns, spec.data)
        per_epoch = (steps_per_epoch(dataset, spec.steps)
                     if hasattr(dataset, "cardinality") else None)
        run = self.runs.new(
            mode="step", strategy=handle.spec.name, replicas=handle.replicas,
            devices=handle.devices, total_steps=per_epoch * spec.epochs if per_epoch else None,
        )
        self._changed()
        runner = StepRunner(handle, source, self.shell.user_ns, spec, run,
                            observers=[*observers, _Notify(self._changed)])
        try:
            return runner.execute()
        finally:
            self._changed()

    def run_scope_cell(self, cell: str, spec: RunSpec, observers: list[Any],
                       header: str = "") -> Any:
        """Scope mode: run the cell under ``strategy.scope()``; record every ``model.fit``."""
        from .kerashooks import recording_fit

        handle = self.require(spec.strategy)
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
        with handle.strategy.scope(), recording_fit(new_run, observers, central):
            exec(self.shell.compile(tree, filename, "exec"), user_ns)  # noqa: S102 - user's cell
            result = None
            if last is not None:
                expr = ast.Expression(last.value)
                result = eval(self.shell.compile(expr, filename, "eval"), user_ns)  # noqa: S307
        self._changed()
        return result

    # -- listeners -------------------------------------------------------------------------
    def flush_listeners(self, *_: Any) -> None:
        """After each cell: make sure the lab extension has the latest state."""
        if self.lab_channel is not None:
            self.lab_channel.flush()

    def _changed(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:  # a broken status display must never stop training
                pass


class _Notify:
    """Observer that tells the session's listeners about progress (throttled by them)."""

    def __init__(self, callback: Callable[[], None]):
        self.callback = callback

    def on_step(self, run: Run) -> None:
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
