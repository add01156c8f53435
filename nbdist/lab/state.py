"""The state the kernel sends to the JupyterLab extension (see ``lab.comm``): one dataclass,
``LabState``, built from the backend's status and the runs, checked by its own field types
when it is made, and serialized once (``to_json``). Its TypeScript twin is
``labextension/src/state.ts``; ``labextension/test/fixtures/states.json`` holds the states both
sides must accept and reject.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

from ..spec import STRATEGY_NAMES
from ..telemetry.explain import BOTTLENECKS
from ..telemetry.run import STATUSES as RUN_STATUSES
from ..telemetry.run import Run

if TYPE_CHECKING:
    from ..backends.base import BackendStatus

__all__ = ["RUN_STATUSES", "LabState", "RunState", "Verdict", "kernel_state"]

# The names a field may take; ``Literal`` so that the check below reads them off the type.
RunStatus = Literal[RUN_STATUSES]            # type: ignore[valid-type]
Bottleneck = Literal[BOTTLENECKS]            # type: ignore[valid-type]
StrategyName = Literal[tuple(STRATEGY_NAMES)]  # type: ignore[valid-type]


class _Checked:
    """A dataclass whose fields are checked against their annotations when it is made: ints
    are counts (>= 0, not bools), a ``Literal`` is one of its values, a list holds its item
    type, ``X | None`` is X or None, a nested dataclass is one of its kind."""

    def __post_init__(self) -> None:
        for name, hint in _hints(type(self)).items():
            _check(f"{_where(self)}{name}", hint, getattr(self, name))
        self._check_together()

    def _check_together(self) -> None:
        """Rules between fields (none by default)."""

    @classmethod
    def from_json(cls, d: Any, where: str = "") -> Any:
        """The state ``d`` (as JSON carries it) describes; ``ValueError`` names the first key
        that is missing, unknown or of the wrong type."""
        hints = _hints(cls)
        names = list(hints)
        label = where or "state"
        if not isinstance(d, dict):
            raise ValueError(f"nbdist state: {label} must be a dict, got {type(d).__name__}")
        missing = [k for k in names if k not in d]
        unknown = sorted(str(k) for k in d if k not in names)
        if missing or unknown:
            raise ValueError(f"nbdist state: {label} has missing keys {missing} and unknown "
                             f"keys {unknown}; expected exactly {names}")
        values = {}
        for name in names:
            nested = _dataclass_of(hints[name])
            value = d[name]
            if nested is not None and value is not None:
                value = nested.from_json(value, f"{where}{name}")
            values[name] = value
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The state as JSON carries it (fresh dicts and lists: later changes to this object's
        sources cannot alter what was sent)."""
        return dataclasses.asdict(self)   # type: ignore[call-overload, no-any-return]


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s fields and their types, in order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}   # type: ignore[arg-type]


def _where(obj: Any) -> str:
    return getattr(obj, "_prefix", "")


def _dataclass_of(hint: Any) -> Any:
    for arg in (hint, *typing.get_args(hint)):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def _check(where: str, hint: Any, value: Any) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return
        (hint,) = [a for a in args if a is not type(None)]
        if value is None:
            raise ValueError(f"nbdist state: {where} must not be None")
        _check(where, hint, value)
    elif origin is Literal:
        if value not in args:
            raise ValueError(f"nbdist state: {where} must be one of {list(args)}, got {value!r}")
    elif origin is list:
        if not isinstance(value, list):
            raise ValueError(f"nbdist state: {where} must be a list, got {value!r}")
        for item in value:
            _check(f"{where} item", args[0], item)
    elif hint is int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"nbdist state: {where} must be an int >= 0, got {value!r}")
    elif hint is str:
        if not isinstance(value, str):
            raise ValueError(f"nbdist state: {where} must be a str, got {value!r}")
    elif not isinstance(value, hint):
        raise ValueError(f"nbdist state: {where} must be a {hint.__name__}, got {value!r}")


@dataclass(frozen=True)
class RunState(_Checked):
    """The current (or last) run of the kernel."""

    _prefix = "run."

    id: int
    status: RunStatus
    step: int
    #: counted from 1, as the dashboard's header shows it (0: no step yet)
    epoch: int
    total_steps: int | None


@dataclass(frozen=True)
class Verdict(_Checked):
    """Why the current (or last) run is as fast as it is (``nbdist.lab.verdict``)."""

    _prefix = "verdict."

    run: int                    # the run explained: its id
    step: int                   # the step it had reached
    bottleneck: Bottleneck
    advice: str | None          # the first advice, without the numbers; None: nothing to fix


@dataclass(frozen=True)
class LabState(_Checked):
    """What the JupyterLab extension's status bar shows of the kernel."""

    version: str
    strategy: StrategyName | None
    magic_line: str | None
    replicas: int
    devices: list[str]
    workers_total: int
    workers_alive: int
    dead_workers: list[int]
    stragglers: list[str]
    run: RunState | None
    verdict: Verdict | None

    def _check_together(self) -> None:
        if (self.strategy is None) != (self.magic_line is None):
            raise ValueError(
                "nbdist state: strategy and magic_line must both be None or both be set, got "
                f"strategy={self.strategy!r}, magic_line={self.magic_line!r}")
        if self.magic_line is not None and not self.magic_line.startswith("%distribute "):
            raise ValueError("nbdist state: magic_line must be a line magic such as "
                             f"'%distribute mirrored --devices 2', got {self.magic_line!r}")
        if self.workers_alive > self.workers_total:
            raise ValueError(f"nbdist state: workers_alive ({self.workers_alive}) exceeds "
                             f"workers_total ({self.workers_total})")

    @classmethod
    def empty(cls, version: str | None = None) -> LabState:
        """A kernel with nbdist loaded and no strategy chosen yet."""
        return cls.of(None, [], version)

    @classmethod
    def of(cls, status: BackendStatus | None, runs: Sequence[Run], version: str | None = None,
           verdict: Verdict | None = None) -> LabState:
        """The state of a kernel whose backend reports ``status`` (None: no strategy yet), with
        ``runs``; ``verdict``: the latest explained run's, shown while it is the last run's."""
        if version is None:
            from ..version import __version__ as version
        last = runs[-1] if runs else None
        return cls(
            version=version,
            strategy=status.spec.name if status else None,
            magic_line=status.spec.magic_line() if status else None,
            replicas=status.replicas if status else 0,
            devices=list(status.devices) if status else [],
            workers_total=status.workers_total if status else 0,
            workers_alive=status.workers_alive if status else 0,
            dead_workers=list(status.dead_workers) if status else [],
            stragglers=[s.label for s in last.stragglers()]
            if last and last.status == "running" else [],
            run=None if last is None else RunState(
                id=last.id, status=last.status, step=last.steps_done,
                epoch=int(last.last.get("epoch", -1)) + 1, total_steps=last.total_steps),
            verdict=verdict if last is not None and verdict is not None
            and verdict.run == last.id else None,
        )


def kernel_state(session: Any) -> LabState:
    """The state of the kernel's ``nbdist.session.Session`` (untyped here: the session imports
    the lab's verdict): its backend's status, its runs and the verdict on the latest."""
    return LabState.of(session.status(), session.runs, verdict=session.verdict.verdict)
