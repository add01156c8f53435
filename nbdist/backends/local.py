"""``LocalBackend``: the strategies that run inside the kernel.

``one_device``, ``mirrored``, ``central_storage`` and ``tpu``: the kernel builds the
tf.distribute strategy (``strategies.build_strategy``), step cells run with ``StepRunner``
and scope cells under ``strategy.scope()`` with every ``model.fit`` recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import ConfigError
from ..spec import StrategySpec
from ..step.cache import StepCache
from ..strategies import StrategyHandle
from ..telemetry.run import Run, RunList, RunObserver
from .base import Backend, BackendStatus, refuse_keras_choice
from .cells import ScopeCell, StepCell, run_cell_code, step_inputs
from .kernelstate import check_kernel_usable


class LocalBackend(Backend):
    """A tf.distribute strategy inside the kernel."""

    exclusive = False   # another strategy can be built beside it

    def __init__(self, spec: StrategySpec, runs: RunList, shell: Any):
        self.spec = spec
        self.runs = runs
        self.shell = shell
        self.handle: StrategyHandle | None = None
        self.traced_steps = StepCache()   # steps traced under this strategy, for re-runs

    @classmethod
    def create(cls, spec: StrategySpec, runs: RunList, shell: Any,
               keras: str | None = None) -> LocalBackend:
        refuse_keras_choice(keras)
        return cls(spec, runs, shell)

    # -- lifecycle -------------------------------------------------------------------------
    def serves(self, spec: StrategySpec, keras: str | None) -> bool:
        return self.handle is not None and spec == self.spec and keras is None

    def start(self) -> None:
        from ..strategies import build_strategy

        check_kernel_usable()   # after parameter_server, TensorFlow may be stuck to it
        self.handle = build_strategy(self.spec)

    def stop(self) -> list[int]:
        self.traced_steps.clear()
        return []   # nothing to stop: logical devices stay until the kernel restarts

    # -- what it runs on -------------------------------------------------------------------
    def kernel_strategy(self) -> Any:
        return None if self.handle is None else self.handle.strategy

    @property
    def replicas(self) -> int:
        return self._handle().replicas

    @property
    def devices(self) -> tuple[str, ...]:
        return self._handle().devices

    def _handle(self) -> StrategyHandle:
        if self.handle is None:
            raise ConfigError(f"The {self.spec.name} strategy is not built yet.")
        return self.handle

    def status(self) -> BackendStatus:
        h = self._handle()
        split_cpu = h.device_kind == "CPU" and len(h.devices) > 1
        logical = ", logical devices of one CPU" if split_cpu else ""
        return BackendStatus(
            spec=self.spec, headline=f"{self.spec.name} ({self.spec.tf_class})",
            replicas=h.replicas, devices=h.devices,
            details=(f"replicas   {h.replicas}",
                     f"devices    {', '.join(h.devices)} ({h.device_kind}{logical})"),
            code=h.equivalent_code(),
        )

    # -- cells -----------------------------------------------------------------------------
    def run_step_cell(self, cell: StepCell, observers: list[RunObserver]) -> Run:
        """Train with ``StepRunner`` in the kernel."""
        from ..step.runner import StepRunner

        h = self._handle()
        user_ns = self.shell.user_ns
        inputs = step_inputs(cell, h.strategy, user_ns, h.replicas)
        per_epoch = inputs.per_epoch
        run = self.runs.new(
            mode="step", strategy=self.spec.name, replicas=h.replicas, devices=h.devices,
            total_steps=per_epoch * cell.spec.epochs if per_epoch else None,
            epochs=cell.spec.epochs, step_cell=cell,
        )
        if inputs.note:
            run.note(inputs.note)
        runner = StepRunner(cell.source, user_ns, cell.spec, run, observers=observers,
                            checkpoint=inputs.checkpoint, dataset=inputs.dataset, handle=h,
                            cache=self.traced_steps)
        try:
            return runner.execute()
        finally:
            runner.release()   # its gradient-registry entries; a cached trace runs without

    def run_scope_cell(self, cell: ScopeCell, observers: list[RunObserver]) -> Any:
        """Run the cell under ``strategy.scope()``; record every ``model.fit``."""
        from ..fitrecord import recording_fit
        from ..scaledloss import noting_scaled_loss

        h = self._handle()

        def new_run() -> Run:
            return self.runs.new(mode="fit", strategy=self.spec.name, replicas=h.replicas,
                                 devices=h.devices)

        fits = None
        if cell.spec.checkpoint:
            from ..checkpoint import FitCheckpoint

            fits = FitCheckpoint(cell.spec.checkpoint, say=print)
        with h.strategy.scope(), recording_fit(
                new_run, observers, self.spec.family.fit_loss_unreliable,
                extra_callbacks=fits.callbacks if fits else None) as started, \
                noting_scaled_loss(h.replicas):
            result = run_cell_code(self.shell, f"# {cell.header}\n{cell.text}")
        if fits is not None and not started:
            from ..checkpoint import NOTHING_TRAINED

            print(NOTHING_TRAINED.format(dir=cell.spec.checkpoint))
        return result

    @contextlib.contextmanager
    def plain_cell_fits(self, busy: Callable[[], bool], recorded: Callable[[Run], None],
                        observers: list[RunObserver]) -> Iterator[None]:
        """Around a cell without ``%%distribute``: a ``model.fit`` of a Keras 3 model made under
        this strategy trains on every replica anyway, so it is recorded into a Run too
        (``recorded(run)`` is told; ``observers`` see its steps). ``busy()``: a
        ``%%distribute`` cell records it itself."""
        from ..fitrecord import recording_fit

        h = self.handle
        if h is None:
            yield
            return

        def ours(model: Any) -> bool:
            return not busy() and getattr(model, "distribute_strategy", None) is h.strategy

        def new_run() -> Run:
            run = self.runs.new(mode="fit", strategy=self.spec.name, replicas=h.replicas,
                                devices=h.devices)
            run.note("recorded from a cell without %%distribute: the model was built under "
                     "the strategy, so its fit trains on every replica")
            recorded(run)
            return run

        with recording_fit(new_run, observers, self.spec.family.fit_loss_unreliable, only=ours):
            yield
