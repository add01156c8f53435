"""Re-running an unchanged step cell reuses its traced step.

Rewriting and tracing a step cell can cost more than a whole epoch of a small model, and a
notebook runs the same cell again and again. ``StepCache`` keeps, per cell, what a step loop
traced (its compiled variants; ``loop.StepLoop`` keeps and adopts them for every
family) together with everything the trace depends on, and hands it back to a later run only
when all of it still matches:

* the cell (its text after the ``%%distribute`` line), ``--loss``/``--grads`` and whether
  steps run one per call or grouped (``--steps-per-call``);
* every name the step reads from the notebook's namespace, also through the notebook's own
  functions it calls: the same object (a rebuilt model or optimizer, a reassigned variable
  retrace), the same value for plain numbers and strings (which a trace bakes in), and for
  models, optimizers and variables the same variables with the same shapes;
* the strategy (the same object) and its replicas, and the dataset's ``element_spec``.

What a run is compared with is taken when the previous run ended (a Keras optimizer builds its
variables during the first trace). One entry per cell, at most ``size`` cells; the backend
clears it when its strategy goes (``%distribute stop``, another strategy). An entry holds the
objects it compares with, which the traced step holds anyway.
"""

from __future__ import annotations

import dataclasses
import types
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..cellnames import code_names, traced_step_reads
from .rewrite import StepSource

_PLAIN = (type(None), bool, int, float, complex, str, bytes)
_HEADER = "# %%distribute"


@dataclass
class TracedStep:
    """What a run traced, kept for the next run of the same cell."""

    compiled: dict[bool, Any]           # timed? -> the callable the runner calls
    functions: dict[bool, Any]          # timed? -> its tf.function (for ``on_traced``)
    keys: dict[bool, list[str]]         # the step output's rows
    kept: Any                           # what the family keeps besides (the timed probe)
    factory: Any                        # the generated ``make_step`` (for a variant not traced)
    filename: str                       # the traced code's file (errors map through it)
    notes: list[str] = field(default_factory=list)
    depends: Any = None                 # ``depends_on(...)`` when the run ended
    loss_scale: int = 1                 # ``Run.loss_scale`` the trace decided


class StepCache:
    """The traced steps of the last ``size`` step cells of one strategy (see the module doc)."""

    size = 4

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], TracedStep] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def find(self, key: tuple[Any, ...], depends: Any) -> TracedStep | None:
        """The entry for ``key`` if it was traced against the same ``depends``; an entry whose
        dependencies changed is dropped (its trace is stale)."""
        entry = self._entries.get(key)
        if entry is not None and same(entry.depends, depends):
            self._entries.move_to_end(key)
            self.hits += 1
            return entry
        self._entries.pop(key, None)
        self.misses += 1
        return None

    def keep(self, key: tuple[Any, ...], entry: TracedStep) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def forget(self, key: tuple[Any, ...]) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def execute_cached(cache: StepCache, key: tuple[Any, ...], depends: Callable[[], Any],
                   adopt: Callable[[TracedStep], None], execute: Callable[[], Any],
                   traced: Callable[[], TracedStep | None]) -> Any:
    """Run ``execute`` (a step loop's) with the traced step of ``key`` adopted if it is still
    valid; keep what it traced for the next run when it ended done or stopped."""
    entry = cache.find(key, depends())
    if entry is not None:
        adopt(entry)
    try:
        run = execute()
    except BaseException:
        cache.forget(key)
        raise
    entry = traced() if run.status in ("done", "stopped") else None
    if entry is None:
        cache.forget(key)
    else:
        entry.depends = depends()
        cache.keep(key, entry)
    return run


def adopted_source(source: StepSource, entry: TracedStep) -> StepSource:
    """``source`` under the traced code's file name (errors map to cell lines through it)."""
    source = dataclasses.replace(source, filename=entry.filename)
    source.register()
    return source


def cell_key(source: StepSource, grouped: bool) -> tuple[Any, ...]:
    """What identifies a cell's trace: its text without the ``%%distribute`` line (whose
    ``--steps``/``--epochs`` change no trace), its loss and gradients, grouped steps or not."""
    body = source.cell
    if body.startswith(_HEADER):
        body = body.partition("\n")[2]
    return (body, source.loss, source.grads, grouped)


def depends_on(source: StepSource, user_ns: dict[str, Any], strategy: Any,
               dataset: Any) -> tuple[Any, ...]:
    """Everything the traced step depends on besides the cell (see the module doc)."""
    names = traced_step_reads(source.source, source.factory_name, source.step_name)
    reached: dict[str, tuple[Any, ...]] = {}
    _reach(sorted(names), user_ns, reached, level=2)
    return (strategy, getattr(strategy, "num_replicas_in_sync", None), _element_spec(dataset),
            reached)


def _element_spec(dataset: Any) -> Any:
    try:   # a per-worker dataset may not know it
        return getattr(dataset, "element_spec", None)
    except (NotImplementedError, ValueError):
        return None


def same(a: Any, b: Any) -> bool:
    """``depends_on`` results equal: objects by identity, plain values and specs by value."""
    if a is None or b is None:
        return False
    strategy_a, replicas_a, spec_a, names_a = a
    strategy_b, replicas_b, spec_b, names_b = b
    if strategy_a is not strategy_b or replicas_a != replicas_b or names_a.keys() != names_b.keys():
        return False
    try:
        if spec_a != spec_b:
            return False
    except Exception:   # a spec that cannot be compared: do not reuse
        return False
    return all(_same_state(names_a[n], names_b[n]) for n in names_a)


def _same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "value":
        return type(a[1]) is type(b[1]) and a[1] == b[1]
    if a[1] is not b[1] or len(a[2]) != len(b[2]):
        return False
    return all(va is vb and sa == sb for (va, sa), (vb, sb) in zip(a[2], b[2], strict=True))


def _reach(names: list[str], namespace: dict[str, Any], out: dict[str, tuple[Any, ...]],
           level: int) -> None:
    """Record the state of each name found in ``namespace``; follow the notebook's functions
    ``level`` calls deep (a function reading a global ``model`` depends on it too)."""
    for name in names:
        if name in out or name not in namespace:
            continue
        value = namespace[name]
        out[name] = _state(value)
        if (level > 0 and isinstance(value, types.FunctionType)
                and value.__globals__ is namespace):
            _reach(sorted(code_names(value.__code__)), namespace, out, level - 1)


def _state(value: Any) -> tuple[Any, ...]:
    if type(value) in _PLAIN:
        return ("value", value)
    return ("object", value, _variables(value))


def _variables(value: Any) -> tuple[tuple[Any, str], ...]:
    """(variable, shape) of a variable, or of a model's/optimizer's/module's variables."""
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return ()
    if hasattr(value, "assign") and hasattr(value, "shape"):   # a variable
        return ((value, str(value.shape)),)
    try:
        variables = getattr(value, "variables", None)
        if callable(variables) or variables is None:   # legacy optimizers: a method
            return ()
        return tuple((v, str(getattr(v, "shape", ""))) for v in variables)
    except Exception:   # an object whose ``variables`` is something else entirely
        return ()
