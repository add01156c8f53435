"""Which cells the script needs: the step cell, then, walking back through the notebook,
every cell that defines a name a needed cell reads (its latest definition before the reader).
A needed cell that a script cannot run, or a name no exportable cell defines, is an error
naming the cell; every other cell left out is listed with the reason in the script."""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field

from ..cellnames import step_reads
from ..errors import ExportError
from .history import NBDIST, NOT_RUN, STEP, NotebookCell

#: Names the script itself provides: the strategy, and the worker index nbdist gives workers.
PROVIDED = frozenset({"strategy", "nbdist_worker", "nbdist_workers"})
_BUILTINS = frozenset(dir(builtins)) - {"display", "get_ipython"}


@dataclass
class Plan:
    step: NotebookCell
    cells: list[NotebookCell]                     # exported before the step, oldest first
    left_out: list[tuple[NotebookCell, str]] = field(default_factory=list)
    step_reads: frozenset[str] = frozenset()
    provided: frozenset[str] = frozenset()        # PROVIDED names some exported cell reads


def plan_export(cells: list[NotebookCell], number: int | None = None) -> Plan:
    """The cells that train like step cell ``In[number]`` (default: the last that ran)."""
    steps = [c for c in cells if c.kind == STEP]
    step = _choose_step(steps, number, cells)
    assert step.spec is not None and step.spec.data is not None
    reads = step_reads(step.code)
    needed: dict[str, NotebookCell] = {n: step for n in reads | {step.spec.data}}
    used: list[NotebookCell] = []
    earlier = [c for c in cells if c.number < step.number]
    for cell in reversed(earlier):
        if cell.names is None or cell.kind in (NBDIST, NOT_RUN):
            continue
        hits = (cell.names.defined - cell.nbdist_names) & needed.keys() - PROVIDED
        if not hits:
            continue
        if cell.ipython:
            _refuse_ipython(cell, hits, needed, step)
        used.append(cell)
        for name in hits - cell.names.reads:
            del needed[name]
        for name in cell.names.reads:
            needed.setdefault(name, cell)
    missing = {n: c for n, c in needed.items() if n not in PROVIDED | _BUILTINS}
    if missing:
        _refuse_missing(missing, cells, step)
    exported = {c.number for c in used}
    left_out = [(c, _why_left_out(c, step)) for c in cells
                if c.number not in exported and c is not step]
    return Plan(step, sorted(used, key=lambda c: c.number), left_out, reads,
                frozenset(needed.keys() & PROVIDED))


def _choose_step(steps: list[NotebookCell], number: int | None,
                 cells: list[NotebookCell]) -> NotebookCell:
    if number is None:
        if not steps:
            raise ExportError(
                "There is no training to export: no `%%distribute --step --data NAME` cell has "
                "run to the end in this kernel. `%distribute export FILE` writes a script of a "
                "step cell's training; run one first (scope-mode cells are exported with it).")
        return steps[-1]
    for cell in steps:
        if cell.number == number:
            return cell
    ran = ", ".join(c.label for c in steps) or "none"
    what = next((f"In[{number}] is not a step cell that ran to the end"
                 for c in cells if c.number == number), f"there is no In[{number}]")
    raise ExportError(f"--cell {number}: {what}. Step cells that ran: {ran}. Give one of "
                      "them, or drop --cell to export the last.")


def _refuse_ipython(cell: NotebookCell, hits: set[str], needed: dict[str, NotebookCell],
                    step: NotebookCell) -> None:
    names = ", ".join(f"`{n}`" for n in sorted(hits))
    readers = ", ".join(sorted({needed[n].label for n in hits}))
    raise ExportError(
        f"Cannot export the training of {step.label}: {cell.label} defines {names}, which "
        f"{readers} needs, but it has IPython syntax a Python script cannot run: "
        f"{'; '.join(cell.ipython)}. Write those lines in Python (e.g. subprocess.run for a "
        "`!` shell command) or move them to a cell of their own, run the cells again, then "
        "`%distribute export` again.")


def _refuse_missing(missing: dict[str, NotebookCell], cells: list[NotebookCell],
                    step: NotebookCell) -> None:
    parts = []
    for name, reader in sorted(missing.items()):
        source = next((c for c in reversed(cells)
                       if c.number < reader.number and name in c.nbdist_names), None)
        where = (f" (imported from nbdist in {source.label}: the script trains without "
                 "nbdist)" if source is not None else "")
        parts.append(f"`{name}` read by {reader.label}{where}")
    raise ExportError(
        f"Cannot export the training of {step.label}: no cell before it that a script can run "
        f"defines {', '.join(parts)}. A name set by `%distribute push`, by a cell that failed "
        "or was run without history, or by code outside the notebook cannot be placed in the "
        "script. Define it in a cell (plain or %%distribute) before the step cell, run them "
        "again, then `%distribute export` again.")


def _why_left_out(cell: NotebookCell, step: NotebookCell) -> str:
    if cell.kind == NBDIST:
        return "nbdist's lines only: the script makes its own strategy"
    if cell.kind == NOT_RUN:
        return f"`{cell.header}` did not run to the end"
    if cell.kind == STEP:
        return f"another step cell (`{cell.header}`); export it with --cell {cell.number}"
    if cell.number > step.number:
        return "after the step cell"
    extra = f"; it has IPython syntax ({'; '.join(cell.ipython)})" if cell.ipython else ""
    return "defines nothing the training reads" + extra
