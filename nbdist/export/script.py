"""Render a ``Plan`` as a standalone script (see ``template``): no nbdist needed to train."""

from __future__ import annotations

import ast
import json
import os
import textwrap
from string import Template
from typing import Any

from ..families import Family, families, find_family
from ..step.rewrite import divides_by_global_batch, indent_code, rewrite_step
from ..telemetry.lossform import remembered_reduction
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


def multi_process() -> list[Family]:
    """The exportable families whose script is one job of several processes (TF_CONFIG)."""
    return [f for f in exportable() if f.script is not None and f.script.launch is not None]


def fit_cells(plan: Plan) -> list[NotebookCell]:
    """The exported cells that call ``.fit(...)`` (a Keras ``model.fit``)."""
    found = []
    for cell in plan.cells:
        try:
            tree = ast.parse(cell.code)
        except SyntaxError:
            continue
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "fit" for node in ast.walk(tree)):
            found.append(cell)
    return found


def _keras_choice(plan: Plan, legacy_keras: bool) -> str:
    """The lines that choose the script's Keras, before TensorFlow is imported (it reads
    TF_USE_LEGACY_KERAS then): tf_keras when the notebook ran it; when an exported cell calls
    Keras 3 ``fit``, tf_keras under the strategies of several processes, where that ``fit``
    fails, as nbdist's workers run it."""
    if legacy_keras:
        return ('os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # the notebook ran '
                "tf_keras as tf.keras")
    cells = fit_cells(plan)
    if not cells:
        return ""
    labels = ", ".join(c.label for c in cells)
    return Template(template.LEGACY_FOR_FIT).substitute(
        cells=labels, requirement=tf_keras_requirement(),
        verb="calls" if len(cells) == 1 else "call")


def tf_keras_requirement() -> str:
    """The pip requirement of the tf-keras matching this TensorFlow (``tf-keras`` when it
    cannot be told)."""
    from ..errors import ConfigError
    from ..install_tf_keras import requirement

    try:
        return requirement()[0]
    except ConfigError:
        return "tf-keras"


_UPDATES = {"apply_gradients": 0, "apply": 1, "minimize": 1}   # the variables' argument


def _build_optimizers(step_code: str) -> str:
    """Lines that build each Keras 3 optimizer the step updates, under the strategy's scope,
    for the variables the step updates. Keras 3 creates an optimizer's variables on its first
    ``apply``; inside the traced step under a strategy that fails ("You must feed a value for
    placeholder tensor"). nbdist builds them in the notebook; the script does it in the open.
    Found in the step's text: ``OPT.apply_gradients(zip(grads, VARS))``, ``OPT.apply(grads,
    VARS)``, ``OPT.minimize(loss, VARS, ...)`` where OPT and VARS name no local of the step
    (a local VARS assigned once from such an expression is replaced by it)."""
    try:
        tree = ast.parse(step_code)
    except SyntaxError:
        return ""
    stores: dict[str, int] = {"batch": 1}   # the step's argument is one of its locals
    values: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value

    def global_expr(expr: ast.expr, depth: int = 0) -> ast.expr | None:
        if isinstance(expr, ast.Name) and expr.id in stores:
            if stores[expr.id] != 1 or expr.id not in values or depth > 4:
                return None
            return global_expr(values[expr.id], depth + 1)
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        return None if names & stores.keys() else expr

    builds: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in _UPDATES):
            continue
        position = _UPDATES[node.func.attr]
        variables: ast.expr | None = None
        keyword = {"apply_gradients": "grads_and_vars", "apply": "trainable_variables",
                   "minimize": "var_list"}[node.func.attr]
        given = node.args[position] if len(node.args) > position else next(
            (k.value for k in node.keywords if k.arg == keyword), None)
        if node.func.attr == "apply_gradients":
            if isinstance(given, ast.Call) and isinstance(given.func, ast.Name) and \
                    given.func.id == "zip" and len(given.args) == 2:
                variables = given.args[1]
        else:
            variables = given
        optimizer = node.func.value   # itself a global: a local could be a new optimizer
        if {n.id for n in ast.walk(optimizer) if isinstance(n, ast.Name)} & stores.keys() or \
                any(isinstance(n, ast.Call) for n in ast.walk(optimizer)):
            continue
        variables = global_expr(variables) if variables is not None else None
        if variables is not None:
            builds.setdefault(ast.unparse(optimizer), ast.unparse(variables))
    if not builds:
        return ""
    lines = [f"    if hasattr({opt}, \"build\") and not getattr({opt}, \"built\", True):\n"
             f"        {opt}.build({variables})" for opt, variables in builds.items()]
    return template.BUILD_OPTIMIZERS + "\n".join(lines) + "\n"


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
        keras=_keras_choice(plan, legacy_keras),
        strategies=_names(exportable()),
        coordinated=_names([f for f in exportable() if f.script and f.script.coordinated]),
        multi_process=_names(multi_process()),
        make_strategy=_make_strategy(),
        strategy=json.dumps(default), devices=session.devices or 1, epochs=spec.epochs,
        steps=spec.steps, checkpoint=_literal(spec.checkpoint),
        checkpoint_every=_checkpoint_every(spec.checkpoint_every),
        worker_line=("nbdist_worker, nbdist_workers = worker_index_and_count()   # nbdist's "
                     "names for them" if plan.provided & {"nbdist_worker", "nbdist_workers"}
                     else ""))
    traced = remembered_reduction(step.code)   # as the notebook's run traced it (lossform)
    global_batch = divides_by_global_batch(ast.parse(step.code)) if traced is None else traced
    grads = (f"tf.linalg.global_norm({source.grads})" if source.grads
             else 'tf.constant(float("nan"))')
    distribute = _distribute(user_ns.get(spec.data), spec.data in _functions(plan))
    step_text = Template(template.STEP).substitute(
        batch="batch", step_number=step.number, header=step.header,
        body=indent_code(step.code, 4), returns=f"{source.loss}, {grads}",
        reduce="SUM" if global_batch else "MEAN",
        loss_scale="strategy.num_replicas_in_sync" if global_batch else "1",
        data=spec.data, distribute=distribute, **_per_worker(distribute),
        checkpointed=_wrapped([f"{n}={n}" for n in _checkpoint_candidates(plan)],
                              len("        checkpoint = EpochCheckpoint(args.checkpoint, ")),
        build_optimizers=_build_optimizers(step.code),
    )
    return _imports_checked(head, "".join(_cell_block(c) for c in plan.cells), step_text)


def _imports_checked(head: str, cells: str, tail: str) -> str:
    """The script with the cells' imports as a linter expects them (``ruff check`` passes): a
    module-level import of names the script's own code already imported (``import tensorflow
    as tf``) is left out; one of names nothing in the script reads (a cell imports more than the
    exported cells use), or of some the script imported too, is marked ``# noqa`` for them."""
    script = ast.parse(head + cells + tail)
    read = {node.id for node in ast.walk(script)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    ours = {_bound(alias) for node in ast.parse(head + tail).body
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    ours |= {t.id for node in ast.parse(head).body if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Name)}
    lines = cells.splitlines(keepends=True)
    for node, alone in _module_imports(ast.parse(cells)):
        if node.lineno != node.end_lineno or "#" in lines[node.lineno - 1]:
            continue
        bound = [_bound(alias) for alias in node.names]
        text = lines[node.lineno - 1].rstrip("\n")
        if all(name in ours for name in bound) and not alone:
            lines[node.lineno - 1] = ""
            continue
        codes = [code for code, names in (("F401", set(bound) - read),
                                          ("F811", set(bound) & ours)) if names]
        if codes:   # the cell's line as typed: unused here, or imported above too
            lines[node.lineno - 1] = f"{text}  # noqa: {', '.join(codes)} - as the cell has it\n"
    return head + "".join(lines) + tail


def _module_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """The imports that bind module-level names: at the top level, or in a scope cell's
    ``with strategy.scope():`` block; each with whether it is its block's only statement."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, False))
        elif isinstance(node, ast.With):
            found += [(child, len(node.body) == 1) for child in node.body
                      if isinstance(child, (ast.Import, ast.ImportFrom))]
    return found


def _bound(alias: ast.alias) -> str:
    """The name an import binds: ``np`` for ``numpy as np``, ``os`` for ``os.path``."""
    return alias.asname or alias.name.split(".")[0]


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


def _wrapped(items: list[str], column: int, width: int = 99) -> str:
    """``items`` joined by commas from ``column`` on, in lines of at most ``width``
    characters (a call's arguments, continued under its first)."""
    lines = [""]
    for item in items:
        if lines[-1] and column + len(lines[-1]) + len(item) + 2 > width:
            lines[-1] += ","
            lines.append("")
        lines[-1] += f", {item}" if lines[-1] else item
    return ("\n" + " " * column).join(lines)


def _literal(value: str | None) -> str:
    return "None" if value is None else json.dumps(value)


def _left_out(plan: Plan) -> str:
    if not plan.left_out:
        return "    none"
    return "\n".join(textwrap.fill(f"{cell.label}: {why}", 99, initial_indent="    ",
                                   subsequent_indent="      ", break_on_hyphens=False)
                     for cell, why in plan.left_out)


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


def _checkpoint_every(every: int | None) -> str:
    """The cell's --checkpoint-every, said to be left out: the script saves each epoch."""
    if every is None:
        return ""
    return (f"    # the cell's --checkpoint-every {every} is not carried over: this script "
            "saves after every\n    # epoch and resumes at the start of the next one\n")


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
