"""The notebook's cells as ``%distribute export`` sees them: IPython's input history (what
the user typed, ``In[n]``) and what the session recorded about each ``%%distribute`` cell."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from ..cellnames import CellNames, cell_names
from ..spec import RunSpec, StrategySpec

PLAIN, SCOPE, STEP, NBDIST, NOT_RUN = "plain", "scope", "step", "nbdist", "not run"
_NBDIST_LINE = re.compile(r"^\s*(%load_ext\s+nbdist\b|%distribute\b)")
_MAGIC = "%%distribute"


@dataclass(frozen=True)
class NotebookCell:
    number: int                     # In[number]
    kind: str                       # PLAIN, SCOPE, STEP, NBDIST (only nbdist lines), NOT_RUN
    code: str                       # the Python to export (nbdist's own lines commented out)
    names: CellNames | None = None
    spec: RunSpec | None = None     # a %%distribute cell's flags
    strategy: StrategySpec | None = None
    keras: str | None = None
    header: str = ""                # its %%distribute line
    ipython: tuple[str, ...] = ()   # lines a Python script cannot run (magics, !shell)
    nbdist_names: frozenset[str] = frozenset()   # bound by `import nbdist...` (left out)

    @property
    def label(self) -> str:
        return f"In[{self.number}]"


def notebook_cells(shell: Any, session: Any) -> list[NotebookCell]:
    """Every cell of this kernel's history before the current one, oldest first."""
    raw = shell.history_manager.input_hist_raw
    ran = {c.number: c for c in session.ran_cells}
    cells = []
    last = len(raw) - (1 if "%distribute export" in raw[-1] else 0)   # not this cell
    for number in range(1, last):
        cell = _classify(shell, number, raw[number], ran.get(number))
        if cell is not None:
            cells.append(cell)
    return cells


def _classify(shell: Any, number: int, text: str, ran: Any) -> NotebookCell | None:
    if not text.strip():
        return None
    first, _, body = text.lstrip("\n").partition("\n")
    if first.split()[:1] == [_MAGIC]:
        if ran is None:   # refused or failed: nothing it did can be relied on
            return NotebookCell(number, NOT_RUN, body, header=first.strip())
        kind = STEP if ran.spec.step else SCOPE
        names = None if kind == STEP else _names(shell, ran.text)[0]
        return NotebookCell(number, kind, ran.text, names, ran.spec, ran.strategy, ran.keras,
                            first.strip(), _ipython_lines(shell, ran.text) if names else ())
    lines = text.splitlines()
    kept = [f"# {line.strip()}   (nbdist's line: the script makes its own strategy)"
            if _NBDIST_LINE.match(line) else line for line in lines]
    if all(_NBDIST_LINE.match(line) or not line.strip() or line.lstrip().startswith("#")
           for line in lines):
        return NotebookCell(number, NBDIST, "\n".join(kept))
    code, nbdist_names = _without_nbdist_imports(shell, "\n".join(kept))
    names, ipython = _names(shell, code)
    return NotebookCell(number, PLAIN, code, names, ipython=ipython, nbdist_names=nbdist_names)


def _names(shell: Any, code: str) -> tuple[CellNames, tuple[str, ...]]:
    """The cell's names (read through IPython's transform when it has IPython syntax) and
    its lines that are not Python."""
    ipython = _ipython_lines(shell, code)
    python = shell.transform_cell(code) if ipython else code
    try:
        return cell_names(python), ipython
    except SyntaxError:
        return cell_names(""), ipython or ("(the cell is not valid Python)",)


def _ipython_lines(shell: Any, code: str) -> tuple[str, ...]:
    if shell.transform_cell(code).strip() == code.strip():
        return ()
    found = tuple(f"line {i} `{line.strip()}`" for i, line in enumerate(code.splitlines(), 1)
                  if line.strip() and shell.transform_cell(line).strip() != line.strip())
    return found or ("IPython syntax",)


def _without_nbdist_imports(shell: Any, code: str) -> tuple[str, frozenset[str]]:
    """``import nbdist`` / ``from nbdist... import`` commented out (the script trains without
    nbdist), and the names they bound."""
    try:
        tree = ast.parse(shell.transform_cell(code))
    except SyntaxError:
        return code, frozenset()
    lines = code.splitlines()
    if len(lines) != len(shell.transform_cell(code).splitlines()):
        return code, frozenset()   # IPython syntax changed the line numbers: leave the cell
    names: set[str] = set()
    for node in tree.body:
        module = (node.module if isinstance(node, ast.ImportFrom) else
                  node.names[0].name if isinstance(node, ast.Import) else None)
        if module is None or module.split(".")[0] != "nbdist" or node.end_lineno is None:
            continue
        names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        for i in range(node.lineno - 1, node.end_lineno):
            lines[i] = f"# {lines[i]}   (the script trains without nbdist)"
    return "\n".join(lines), frozenset(names)
