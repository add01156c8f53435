"""Render a ``Plan`` as a standalone script (see ``template``): no nbdist needed to train."""

from __future__ import annotations

import ast
import json
import os
from string import Template
from typing import Any

from ..families import Family, families, find_family
from ..step.rewrite import divides_by_global_batch, indent_code, rewrite_step
from . import template
from .history import SCOPE, NotebookCell
from .plan import Plan


def exportable() -> list[Family]:
    """The families a script can make (``Family.script``), in the registry's order."""
    return [f for f in families() if f.script is not None]


def _names(chosen: list[Family]) -> str:
    """A Python tuple of the families' names, as the script writes it."""
    quoted = [json.dumps(f.name) for f in chosen]
    return f"({', '.join(quoted)}{',' if len(quoted) == 1 else ''})"


def _make_strategy() -> str:
    """The body of the script's ``make_strategy``: one branch per exportable family."""
    branches = []
    for fam in exportable():
        assert fam.script is not None
        branches.append(f"    if name == {json.dumps(fam.name)}:\n"
                        + indent_code(fam.script.make, 8))
    return "\n".join(branches)


def launch_job(name: str, file: str) -> str:
    """The ``python -m nbdist.launch`` arguments that run ``file`` as a local job: under the
    family ``name`` when it has several processes, else under the first one that has."""
    chosen = find_family(name)
    if chosen is None or chosen.script is None or chosen.script.launch is None:
        chosen = next(f for f in exportable() if f.script and f.script.launch)
    assert chosen.script is not None
    return f"{chosen.script.launch} {file} --strategy {chosen.name}"


def render(plan: Plan, filename: str, user_ns: dict[str, Any], strategy: str | None = None,
           legacy_keras: bool = False) -> str:
    """The script's text. ``strategy`` overrides the session's as the default ``--strategy``;
    ``user_ns``: the kernel's namespace, to tell a dataset from a dataset function."""
    step = plan.step
    _check_names(plan)
    spec, session = step.spec, step.strategy
    assert spec is not None and session is not None and spec.data is not None
    source = rewrite_step(step.code, filename="<export>", loss=spec.loss, grads=spec.grads)
    default = strategy or session.name
    head = Template(template.HEAD).substitute(
        title=f"Training of {os.path.basename(filename)}: the notebook's step cell "
              f"In[{step.number}] under tf.distribute.",
        magic_line=session.magic_line(), step_number=step.number,
        file=os.path.basename(filename), left_out=_left_out(plan),
        keras=('\nos.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # the notebook ran '
               "tf_keras as tf.keras\n") if legacy_keras else "",
        strategies=_names(exportable()),
        coordinated=_names([f for f in exportable() if f.script and f.script.coordinated]),
        make_strategy=_make_strategy(),
        strategy=json.dumps(default), devices=session.devices or 1, epochs=spec.epochs,
        steps=spec.steps, checkpoint=_literal(spec.checkpoint),
        worker_line=("nbdist_worker, nbdist_workers = worker_index_and_count()   # nbdist's "
                     "names for them" if plan.provided & {"nbdist_worker", "nbdist_workers"}
                     else ""))
    global_batch = divides_by_global_batch(ast.parse(step.code))
    grads = (f"tf.linalg.global_norm({source.grads})" if source.grads
             else 'tf.constant(float("nan"))')
    distribute = _distribute(user_ns.get(spec.data), spec.data in _functions(plan))
    step_text = Template(template.STEP).substitute(
        batch="batch", step_number=step.number, header=step.header,
        body=indent_code(step.code, 4), returns=f"{source.loss}, {grads}",
        reduce="SUM" if global_batch else "MEAN",
        loss_scale="strategy.num_replicas_in_sync" if global_batch else "1",
        data=spec.data, distribute=distribute, **_per_worker(distribute),
        checkpointed=", ".join(f"{n}={n}" for n in _checkpoint_candidates(plan)) or "",
    )
    return head + "".join(_cell_block(c) for c in plan.cells) + step_text


def check_strategy(name: str | None, given: bool = True) -> None:
    """Refuse a strategy the script cannot make: ``--strategy NAME`` (``given``), or else the
    strategy the step cell ran under."""
    from ..errors import ExportError

    fam = find_family(name)
    if name is None or (fam is not None and fam.script is not None):
        return
    why = f" ({fam.no_script})" if fam is not None and fam.no_script else ""
    can = ", ".join(f.name for f in exportable())
    if given:
        raise ExportError(f"--strategy {name!r}: the script can use {can}{why}.")
    raise ExportError(f"The step cell ran under `{name}`, which the script cannot make{why}. "
                      f"Choose one it can with --strategy NAME: {can}.")


def _check_names(plan: Plan) -> None:
    """A cell that binds a name the script's own code uses would break it: refuse."""
    from ..errors import ExportError

    clashes = sorted((name, cell.label) for cell in plan.cells if cell.names is not None
                     for name in cell.names.defined & template.TEMPLATE_NAMES)
    clashes += sorted((name, plan.step.label)
                      for name in plan.step_reads & template.TEMPLATE_NAMES)
    if clashes:
        names = ", ".join(f"`{n}` ({where})" for n, where in clashes)
        raise ExportError(
            f"Cannot export the training of {plan.step.label}: the script's own code uses "
            f"the names {names}, which the notebook's cells use for something else. Rename "
            "them in the cells, run the cells again, then `%distribute export` again.")


def _literal(value: str | None) -> str:
    return "None" if value is None else json.dumps(value)


def _left_out(plan: Plan) -> str:
    if not plan.left_out:
        return "    none"
    return "\n".join(f"    {cell.label}: {why}" for cell, why in plan.left_out)


def _cell_block(cell: NotebookCell) -> str:
    if cell.kind == SCOPE:
        return (f"\nwith strategy.scope():   # {cell.label}: `{cell.header}`\n"
                f"{indent_code(cell.code, 4)}\n")
    return f"\n# {cell.label}\n{cell.code}\n"


def _functions(plan: Plan) -> set[str]:
    """Names whose latest definition in the exported cells is a ``def``."""
    latest: dict[str, bool] = {}
    for cell in plan.cells:
        assert cell.names is not None
        latest.update({n: n in cell.names.functions for n in cell.names.defined})
    return {n for n, is_function in latest.items() if is_function}


def _distribute(value: Any, defined_by_def: bool) -> str:
    """How the script distributes ``--data``: the kernel's value says what it is; under
    multiworker it is in the workers, and a ``def`` makes it a dataset function."""
    if defined_by_def or value is not None and callable(value) and \
            not hasattr(value, "element_spec"):
        return "strategy.distribute_datasets_from_function(data)"
    if value is not None and hasattr(value, "element_spec") and not hasattr(value, "batch"):
        return "data"   # a DistributedDataset the cells made with `strategy`
    return "strategy.experimental_distribute_dataset(data)"


def _per_worker(distribute: str) -> dict[str, str]:
    """parameter_server: each worker's dataset, repeated, and the batches of one epoch."""
    if distribute.startswith("strategy.distribute_datasets_from_function"):
        return {"per_worker": "lambda: strategy.distribute_datasets_from_function(\n"
                              "            lambda context: data(context).repeat())",
                "per_worker_batches": "data(tf.distribute.InputContext())"}
    return {"per_worker": "data.repeat()", "per_worker_batches": "data"}


def _checkpoint_candidates(plan: Plan) -> list[str]:
    """The names the step reads that an exported cell binds by assignment (the script keeps
    those a tf.train.Checkpoint can save: models, optimizers, variables)."""
    latest: dict[str, NotebookCell] = {}
    for cell in plan.cells:
        assert cell.names is not None
        for name in cell.names.defined:
            latest[name] = cell
    out = []
    for name in sorted(plan.step_reads):
        cell = latest.get(name)
        if cell is not None and cell.names is not None and \
                name not in cell.names.imported | cell.names.functions:
            out.append(name)
    return out
