"""A ``%%distribute`` cell made ready once, before any backend runs it.

``prepare_step_cell`` and ``prepare_scope_cell`` check what can be checked without the
strategy (that the ``--checkpoint`` directory can be written, the step's rewrite: errors in
the cell show once, from the kernel) and never create a Run. Where the step runs (the kernel,
or each worker) ``step_data`` finds its ``--data`` and reads it the way TensorFlow does under
the strategy (``nbdist.data``), then ``step_checkpoint`` creates the ``--checkpoint``
directory: both before any Run exists, so a refused ``--data`` changes nothing
(``step_inputs`` does both). ``run_cell_code`` runs cell text the way IPython runs a cell.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..spec import RunSpec, StrategySpec
from ..step.rewrite import StepSource, register_source, rewrite_step

if TYPE_CHECKING:
    from ..data import ReadData


@dataclass(frozen=True)
class StepCell:
    """A step-mode cell: the text the user typed, its flags and its rewritten step."""

    text: str
    header: str          # the ``%%distribute ...`` line, shown as the first line of the cell
    spec: RunSpec        # ``--checkpoint`` made absolute
    source: StepSource
    number: int          # this session's cell counter: names the cell's file and messages

    @property
    def filename(self) -> str:
        return self.source.filename


@dataclass(frozen=True)
class ScopeCell:
    """A scope-mode cell: run as it is under ``strategy.scope()``."""

    text: str
    header: str
    spec: RunSpec
    number: int

    @property
    def filename(self) -> str:
        return f"<nbdist-cell-{self.number}>"


@dataclass(frozen=True)
class RanCell:
    """A ``%%distribute`` cell that ran without error (what ``%distribute export`` reads)."""

    number: int                # IPython's execution count: the cell is In[number]
    text: str                  # the cell without its ``%%distribute`` line
    spec: RunSpec
    strategy: StrategySpec     # the session's strategy it ran under
    keras: str | None = None   # multiworker: "legacy" when the workers ran tf_keras


@dataclass
class StepInputs:
    """What a step cell trains on where it runs: its input, steps per epoch, checkpoint."""

    dataset: Any             # the distributed dataset (per-worker under parameter_server)
    per_epoch: int | None
    checkpoint: Any = None   # nbdist.checkpoint.StepCheckpoint for --checkpoint DIR
    note: str | None = None  # how TensorFlow reads --data here, for the Run


def prepare_step_cell(cell: str, spec: RunSpec, header: str, number: int,
                      filename: str | None = None) -> StepCell:
    """Rewrite a step cell (raising ``StepCodeError`` on the user's line); print it with
    ``--show-code``. ``--checkpoint DIR`` is checked, not created (``step_checkpoint`` does
    that once ``--data`` passed its checks)."""
    step = step_cell(cell, with_checkpoint_dir(spec, create=False), header, number, filename)
    if spec.show_code:
        print(step.source.source)
    return step


def step_cell(cell: str, spec: RunSpec, header: str, number: int,
              filename: str | None = None) -> StepCell:
    """The rewritten step cell, with no side effect (how workers rebuild the kernel's)."""
    source = rewrite_step(f"# {header}\n{cell}", filename=filename or f"<nbdist-step-{number}>",
                          loss=spec.loss, grads=spec.grads)
    return StepCell(cell, header, spec, source, number)


def prepare_scope_cell(cell: str, spec: RunSpec, header: str, number: int) -> ScopeCell:
    return ScopeCell(cell, header, with_checkpoint_dir(spec), number)


def with_checkpoint_dir(spec: RunSpec, create: bool = True) -> RunSpec:
    """``--checkpoint DIR`` made absolute and checked writable (and created, with ``create``),
    before anything runs."""
    if not spec.checkpoint:
        return spec
    from ..checkpoint import check_dir, prepare_dir

    full = prepare_dir(spec.checkpoint) if create else check_dir(spec.checkpoint)
    return dataclasses.replace(spec, checkpoint=full)


def step_data(cell: StepCell, strategy: Any, user_ns: dict[str, Any], replicas: int,
              say: Callable[[str], None] | None = print,
              coordinator: Any = None) -> ReadData:
    """The ``--data`` input, checked and read as TensorFlow reads it under ``strategy``
    (``nbdist.data``), with its steps per epoch; then the objects the cell trains checked
    (``step.objects``). ``replicas``: the replicas this process feeds; ``coordinator``:
    parameter_server's ClusterCoordinator (per-worker datasets). Changes nothing."""
    from ..data import classify, distributed_input, lookup_dataset, per_worker_input
    from ..step.objects import check_step_objects

    spec = cell.spec
    assert spec.data is not None
    data = classify(lookup_dataset(user_ns, spec.data), spec.data,
                    per_worker=coordinator is not None)
    if coordinator is not None:
        read = per_worker_input(data, strategy, coordinator, spec.steps)
    else:
        read = distributed_input(data, strategy, replicas, spec.steps, say)
    check_step_objects(cell.text, user_ns, strategy)   # created under it, buildable
    return read


def step_checkpoint(cell: StepCell, strategy: Any, user_ns: dict[str, Any],
                    say: Callable[[str], None] | None = print) -> Any:
    """``--checkpoint DIR``: the directory created, the objects the cell names found
    (``StepCheckpoint``); None without the flag."""
    if not cell.spec.checkpoint:
        return None
    from ..checkpoint import StepCheckpoint, prepare_dir

    directory = prepare_dir(cell.spec.checkpoint)
    return StepCheckpoint.for_cell(directory, strategy, cell.text, user_ns, say=say)


def step_inputs(cell: StepCell, strategy: Any, user_ns: dict[str, Any], replicas: int,
                say: Callable[[str], None] | None = print,
                coordinator: Any = None) -> StepInputs:
    """``step_data`` then ``step_checkpoint``: everything a step loop needs, before its Run."""
    data = step_data(cell, strategy, user_ns, replicas, say, coordinator)
    return StepInputs(data.dataset, data.per_epoch, step_checkpoint(cell, strategy, user_ns, say),
                      data.note)


def run_cell_code(shell: Any, text: str, filename: str | None = None) -> Any:
    """Run ``text`` in ``shell``'s namespace as IPython runs a cell; return the value of its
    last expression (or None).

    The text is registered in ``linecache`` (under ``filename``, or IPython's own cell name)
    so that tracebacks and AutoGraph can read it.
    """
    if filename is None:
        filename = shell.compile.cache(text)
    else:
        register_source(filename, text)
    tree = ast.parse(shell.transform_cell(text), filename=filename)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    namespace = shell.user_ns
    exec(shell.compile(tree, filename, "exec"), namespace)  # noqa: S102 - the user's cell
    if last is None:
        return None
    expression = ast.Expression(last.value)
    return eval(shell.compile(expression, filename, "eval"), namespace)  # noqa: S307
