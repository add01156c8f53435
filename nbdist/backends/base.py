"""What every strategy family gives the Session: the ``Backend`` protocol and its status.

A backend runs the cells of one strategy family: ``LocalBackend`` (strategies inside the
kernel), ``MultiWorkerCluster`` (a worker process per replica group, cells run on every
worker) and ``ParameterServerCluster`` (the kernel coordinates worker and parameter-server
processes). Each family's descriptor (``nbdist.families.Family.backend``) names its backend
class and ``nbdist.factory.make_backend`` makes it; a new family whose training no backend
here runs adds one module implementing ``Backend``. Nothing branches on strategy names.

``BackendStatus`` is the one structured status: ``status_text`` renders it for
``%distribute status``, ``nbdist.lab.state.LabState`` for the JupyterLab extension's status
bar.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..spec import StrategySpec
from ..telemetry.run import Run, RunList, RunObserver, runs_summary
from .cells import ScopeCell, StepCell

#: The line refusals below suggest when this kernel never ran a worker family's line.
WORKERS_LINE = "%distribute multiworker --workers N"


# Refusals of operations that need worker processes, for backends (and a Session) without any;
# ``line``: the strategy line to suggest.
def no_workers(what: str, line: str = WORKERS_LINE) -> str:
    return (f"`{what}` moves values between the kernel and worker processes; start them "
            f"first with `{line}`.")


def no_workers_to_restart(line: str = WORKERS_LINE) -> str:
    return f"There are no worker processes to restart. Start them with `{line}`."


def no_faults(line: str = WORKERS_LINE) -> str:
    return f"`inject` puts a real fault into a worker process, which needs `{line}` first."


@dataclass(frozen=True)
class BackendStatus:
    """A backend's state, as ``%distribute status`` and the lab extension show it."""

    spec: StrategySpec
    headline: str                       # "mirrored (tf.distribute.MirroredStrategy)"
    replicas: int
    devices: tuple[str, ...]
    details: tuple[str, ...] = ()       # the family's own lines of the status text, in order
    workers_total: int = 0
    workers_alive: int = 0
    dead_workers: tuple[int, ...] = ()
    magic_flags: str = ""               # flags that are not part of the spec (--keras ...)
    code_title: str = "Equivalent TensorFlow:"
    code: str = ""                      # the hand-written TensorFlow that builds the same


class Backend(abc.ABC):
    """What a Session needs from a strategy family.

    The abstract methods are what every family does; the others are capabilities some
    families have, declared here with what a family without them does (refuse with a message
    that says what to run instead, or nothing). The Session calls them and never asks which
    family it holds.
    """

    spec: StrategySpec
    #: True if it must stop before another backend starts (it holds processes, ports or the
    #: kernel's TensorFlow context); a backend that is not stays if its successor fails.
    exclusive: bool = False
    #: Which Keras the workers run ("legacy": tf_keras as tf.keras), recorded with each cell
    #: for export; None where cells run on the kernel's own Keras.
    worker_keras: str | None = None

    @classmethod
    @abc.abstractmethod
    def create(cls, spec: StrategySpec, runs: RunList, shell: Any,
               keras: str | None = None) -> Backend:
        """A backend for ``spec``, validated but not started (no process, no strategy yet);
        ``keras`` is ``--keras``, refused by families whose Keras is the kernel's own."""

    @property
    @abc.abstractmethod
    def replicas(self) -> int: ...

    @property
    @abc.abstractmethod
    def devices(self) -> tuple[str, ...]: ...

    @abc.abstractmethod
    def serves(self, spec: StrategySpec, keras: str | None) -> bool:
        """True if this backend already is what ``spec`` (and ``--keras``) ask for."""

    @abc.abstractmethod
    def start(self) -> None:
        """Build the strategy, start processes; on failure leave nothing running."""

    @abc.abstractmethod
    def stop(self) -> list[int]:
        """Stop everything; return the pids that had to be killed."""

    @abc.abstractmethod
    def status(self) -> BackendStatus: ...

    @abc.abstractmethod
    def run_step_cell(self, cell: StepCell, observers: list[RunObserver]) -> Run: ...

    @abc.abstractmethod
    def run_scope_cell(self, cell: ScopeCell, observers: list[RunObserver]) -> Any: ...

    # -- capabilities some families have ---------------------------------------------------
    def starting_message(self) -> str | None:
        """What to tell the user before a slow ``start`` (None: nothing)."""
        return None

    def exposure(self) -> str | None:
        """Which ports of its processes other hosts can reach, said once at start and in
        the status (None: none)."""
        return None

    def kernel_strategy(self) -> Any:
        """The tf.distribute strategy object in the kernel (published as ``strategy``), or
        None: not built yet, or it lives in each worker process."""
        return None

    def plain_cell_fits(self, busy: Callable[[], bool], recorded: Callable[[Run], None],
                        observers: list[RunObserver]) -> contextlib.AbstractContextManager[Any]:
        """A context around a cell without ``%%distribute``, recording the ``model.fit`` calls
        that train under this strategy anyway (``busy()``: a ``%%distribute`` cell records its
        own; ``recorded(run)`` is told of each Run). By default it records nothing."""
        return contextlib.nullcontext()

    def push(self, values: dict[str, Any]) -> None:
        """Copy ``values`` into every worker's namespace."""
        raise ConfigError(no_workers("push"))

    def pull(self, name: str, worker: int, into: Any = None) -> Any:
        """The value of ``name`` in worker ``worker``'s namespace; a Keras model as a model of
        the kernel's Keras (``into``, the kernel's model of that name, if its weights fit)."""
        raise ConfigError(no_workers("pull"))

    def inject(self, fault: str | None, worker: str | None, at_step: int | None,
               delay: float | None) -> str:
        """Put a real fault into a worker process (``cluster.injection``); the message."""
        raise ConfigError(no_faults())

    def restarted(self) -> Backend:
        """A fresh backend with the same settings (this one is stopped first)."""
        raise ConfigError(no_workers_to_restart())


def refuse_keras_choice(keras: str | None) -> None:
    """``--keras`` given to a family whose Keras is the kernel's own."""
    if keras is not None:
        raise ConfigError("--keras chooses the Keras of worker processes: it applies to "
                          "`multiworker` only.")


def status_text(status: BackendStatus, runs: Sequence[Run]) -> str:
    """``%distribute status``."""
    lines = [f"strategy   {status.headline}", *status.details,
             f"magic      {status.spec.magic_line()}"
             + (f" {status.magic_flags}" if status.magic_flags else ""),
             f"runs       {runs_summary(runs) if runs else 0}"]
    if status.code:
        lines += ["", status.code_title, *("    " + line for line in status.code.splitlines())]
    return "\n".join(lines)
