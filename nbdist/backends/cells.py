"""A ``%%distribute`` cell made ready once, before any backend runs it.

``prepare_step_cell`` and ``prepare_scope_cell`` check what can be checked without the
strategy (the ``--checkpoint`` directory, the step's rewrite: errors in the cell show once,
from the kernel) and never create a Run. Where the step runs (the kernel, or each worker)
``step_inputs`` finds its dataset and checkpoint, again before any Run exists, and
``run_cell_code`` runs cell text the way IPython runs a cell.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rewrite import StepSource, register_source, rewrite_step
from ..spec import RunSpec


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


@dataclass
class StepInputs:
    """What a step cell trains on where it runs: dataset, steps per epoch, checkpoint."""

    dataset: Any
    per_epoch: int | None
    checkpoint: Any = None   # nbdist.checkpoint.StepCheckpoint for --checkpoint DIR


def prepare_step_cell(cell: str, spec: RunSpec, header: str, number: int,
                      filename: str | None = None) -> StepCell:
    """Rewrite a step cell (raising ``StepCodeError`` on the user's line); print it with
    ``--show-code``."""
    step = step_cell(cell, with_checkpoint_dir(spec), header, number, filename)
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


def with_checkpoint_dir(spec: RunSpec) -> RunSpec:
    """``--checkpoint DIR`` made absolute and checked writable, before anything runs."""
    if not spec.checkpoint:
        return spec
    from ..checkpoint import prepare_dir

    return dataclasses.replace(spec, checkpoint=prepare_dir(spec.checkpoint))


def step_inputs(cell: StepCell, strategy: Any, user_ns: dict[str, Any], replicas: int,
                say: Callable[[str], None] | None = print) -> StepInputs:
    """The ``--data`` dataset (checked against ``replicas``) and the ``--checkpoint``; the
    objects the cell trains checked (``stepobjects``): all before any Run exists."""
    from ..data import check_dataset, lookup_dataset, steps_per_epoch
    from ..stepobjects import check_step_objects

    spec = cell.spec
    assert spec.data is not None
    dataset = lookup_dataset(user_ns, spec.data)
    check_dataset(dataset, spec.data, replicas, spec.steps)
    check_step_objects(cell.text, user_ns, strategy)   # created under it, buildable
    checkpoint = None
    if spec.checkpoint:
        from ..checkpoint import StepCheckpoint

        checkpoint = StepCheckpoint.for_cell(spec.checkpoint, strategy, cell.text, user_ns,
                                             say=say)
    return StepInputs(dataset, steps_per_epoch(dataset, spec.steps), checkpoint)


def describe_loss(run: Any, cell: StepCell, in_sync: int) -> None:
    """How the Run's headline loss comes from the replicas' losses (``Run.loss_scale``)."""
    if in_sync <= 1:
        return
    if cell.source.global_batch_loss:
        run.sum_replica_losses(in_sync)
        return
    run.note(f"loss (global) is the mean of the {in_sync} replicas' losses: the cell does not "
             "divide its loss by the global batch (tf.nn.compute_average_loss(..., "
             "global_batch_size=...)), and the optimizer sums the replicas' gradients, so they "
             f"are {in_sync} times the gradients of that mean")


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
