"""Turn a ``%%distribute --step`` cell into the source of a per-replica step function.

The cell is the body of the step. ``rewrite_step`` copies its lines (not ``ast.unparse``, so
comments and line structure survive) into a template, each line shifted by a fixed offset so
that an error on generated line ``L`` is cell line ``L - line_offset``::

    def _nbdist_make_step(_nbdist_rt):
        def _nbdist_step(batch):
            batch = _nbdist_rt.begin(batch)   # lets a timed step timestamp the batch's arrival
            <cell lines, indented by 8 spaces>
            return _nbdist_rt.end(loss, grads)
        return _nbdist_step

Like IPython's ``ast_mod``, the helper names are renamed (``_nbdist_rt_1``...) when the cell
uses them. What the cell's scope binds is found by ``cellnames``, what a step body cannot
contain by ``step.scope``. Pure ``ast``/``tokenize``: this module imports neither TensorFlow
nor IPython.
"""

from __future__ import annotations

import ast
import io
import keyword
import linecache
import tokenize
import warnings
from dataclasses import dataclass

from ..cellnames import identifiers, name_lines
from ..errors import ConfigError, StepCodeError
from .scope import (
    ScopeScan,
    keras_loop_call,
    keras_loop_message,
    problem_message,
    side_effects,
)

_INDENT = " " * 8
_LINE_OFFSET = 3  # template lines before the first cell line
_STRING_STARTS = {getattr(tokenize, n, -1) for n in ("FSTRING_START", "TSTRING_START")} - {-1}
_STRING_ENDS = {getattr(tokenize, n, -1) for n in ("FSTRING_END", "TSTRING_END")} - {-1}


@dataclass(frozen=True)
class StepSource:
    """The generated module text for one step cell, and how to map its lines back."""

    source: str
    filename: str
    cell: str
    factory_name: str
    step_name: str
    runtime_name: str
    loss: str
    grads: str | None
    line_offset: int
    #: the cell divides its loss by the global batch (``tf.nn.compute_average_loss``, or a
    #: name with ``global_batch`` in it): the replicas' losses then add up to the batch's loss
    global_batch_loss: bool = False
    #: (cell line, its text, what it does) for each Python side effect of the cell, which the
    #: compiled step runs only while TensorFlow traces it (``scope.side_effects``)
    side_effects: tuple[tuple[int, str, str], ...] = ()

    def cell_line(self, generated_line: int) -> int | None:
        """Return the cell line shown at ``generated_line``, or None for a template line."""
        line = generated_line - self.line_offset
        return line if 1 <= line <= len(_split_lines(self.cell)) else None

    def register(self) -> None:
        """Put ``source`` into ``linecache`` so inspect, tracebacks and AutoGraph can read it."""
        register_source(self.filename, self.source)


def register_source(filename: str, text: str) -> None:
    """Register ``text`` in ``linecache`` under ``filename``; ``checkcache`` keeps it."""
    lines = [line + "\n" for line in _split_lines(text)]
    linecache.cache[filename] = (len(text), None, lines, filename)


def rewrite_step(
    cell: str,
    *,
    filename: str,
    loss: str = "loss",
    grads: str | None = None,
    batch: str = "batch",
) -> StepSource:
    """Return the source of a factory ``make(runtime) -> step(batch)`` built from ``cell``.

    ``grads=None`` passes ``grads`` to ``runtime.end`` when the cell assigns it, else None; an
    explicit ``grads`` name must be assigned by the cell. Raises ``StepCodeError`` (naming the
    cell line) for code that cannot be a step body, ``ConfigError`` for a bad variable name.
    """
    for what, name in (("--loss", loss), ("--grads", grads), ("the batch parameter", batch)):
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            raise ConfigError(
                f"{what} {name!r} is not a Python variable name. Give the name of a variable "
                "of the step cell, such as `loss` or `my_grads`."
            )
    lines = _split_lines(cell)
    tree = _parse(lines, filename)
    if not tree.body:
        raise StepCodeError(
            "The step cell is empty: in step mode the cell is the body of the per-replica "
            f"training step. Write the step code (it must assign `{loss}`), or run the cell "
            "without `--step`."
        )
    scan = ScopeScan()
    scan.visit(tree)
    if scan.problems:
        node, kind = min(scan.problems, key=lambda p: (p[0].lineno, p[0].col_offset))
        raise StepCodeError(problem_message(kind, loss), **_where(node.lineno, lines))
    loop = keras_loop_call(tree)
    if loop is not None:
        raise StepCodeError(keras_loop_message(loop), **_where(loop.lineno, lines))
    if loss not in scan.assigned:
        near = sorted(n for n in scan.assigned if "loss" in n.lower())
        hint = (f" This cell computes `{near[0]}`: add `--loss {near[0]}` to the "
                "`%%distribute` line to record it." if near else "")
        raise StepCodeError(
            f"The step never assigns `{loss}`: nbdist returns it from every step to report "
            "it (`--loss NAME` names the variable recorded as the step's loss, also in a step "
            f"that only evaluates). Assign the step's loss in the cell (`{loss} = ...`), or "
            f"name the variable that holds it with `--loss NAME`.{hint}"
        )
    if grads is None:
        grads = "grads" if "grads" in scan.assigned else None
    elif grads not in scan.assigned:
        raise StepCodeError(
            f"`--grads {grads}` was given but the step never assigns `{grads}`. Assign the "
            f"gradients to it (`{grads} = tape.gradient({loss}, model.trainable_variables)`) "
            "or drop `--grads`."
        )
    taken = identifiers(tree) | {loss, batch} | ({grads} if grads else set())
    factory, step, runtime = (
        _free_name(base, taken) for base in ("_nbdist_make_step", "_nbdist_step", "_nbdist_rt")
    )
    source = "\n".join(
        [
            f"def {factory}({runtime}):",
            f"    def {step}({batch}):",
            f"        {batch} = {runtime}.begin({batch})",
            *_indent_cell(lines),
            f"        return {runtime}.end({loss}, {grads})",
            f"    return {step}",
            "",
        ]
    )
    _check_compiles(source, filename, lines)
    return StepSource(
        source=source,
        filename=filename,
        cell=cell,
        factory_name=factory,
        step_name=step,
        runtime_name=runtime,
        loss=loss,
        grads=grads,
        line_offset=_LINE_OFFSET,
        global_batch_loss=divides_by_global_batch(tree),
        side_effects=tuple((line, lines[line - 1].strip(), what)
                           for line, what in side_effects(tree, scan.assigned)),
    )


def assigned_line(cell: str, name: str) -> int | None:
    """The cell line of the last assignment to ``name`` (None if it cannot be parsed)."""
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return None
    return max(name_lines(tree, name, stored=True), default=None)


def divides_by_global_batch(tree: ast.AST) -> bool:
    """True if the cell calls ``compute_average_loss`` (which divides by the global batch,
    given or not) or names something ``global_batch...`` (``/ GLOBAL_BATCH_SIZE``)."""
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr
                if isinstance(node, ast.Attribute) else node.arg
                if isinstance(node, ast.keyword) else None)
        if name and (name == "compute_average_loss" or "global_batch" in name.lower()):
            return True
    return False


def _split_lines(text: str) -> list[str]:
    """Split on the line breaks Python itself recognises (not form feeds or U+2028)."""
    parts = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return parts[:-1] if parts[-1] == "" else parts


def _where(lineno: int | None, lines: list[str]) -> dict[str, int | str | None]:
    """The ``cell_line``/``line_text`` keywords of a StepCodeError for a cell line."""
    if lineno is None or not lines:
        return {"cell_line": None, "line_text": ""}
    lineno = min(max(lineno, 1), len(lines))
    return {"cell_line": lineno, "line_text": lines[lineno - 1]}


def _parse(lines: list[str], filename: str) -> ast.Module:
    """Parse the cell on its own, so syntax errors name the cell's line numbers."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes etc. warn when the caller compiles
            return ast.parse("\n".join(lines) + "\n", filename=filename)
    except SyntaxError as error:
        where = _where(error.lineno, lines)
        what = "this line is" if where["cell_line"] else "The cell is"
        raise StepCodeError(
            f"{what} not valid Python ({type(error).__name__}: {error.msg}). Fix its syntax "
            "and run the cell again.",
            **where,
        ) from None
    except ValueError as error:  # null bytes on Python 3.10 (a SyntaxError later)
        message = f"The cell cannot be parsed: {error}. Remove those characters."
        raise StepCodeError(message) from None


def _check_compiles(source: str, filename: str, lines: list[str]) -> None:
    """Compile the generated module; map errors only a function body has back to the cell."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as error:
        cell_line = None if error.lineno is None else error.lineno - _LINE_OFFSET
        inside = cell_line is not None and 1 <= cell_line <= len(lines)
        raise StepCodeError(
            f"{error.msg}. The cell is compiled as the body of the step function, where this "
            "line is not allowed: change or remove it (module-level code such as "
            "`from __future__ import ...` or `import *` belongs in an ordinary cell).",
            **_where(cell_line if inside else None, lines),
        ) from None


def indent_code(text: str, width: int) -> str:
    """``text`` indented by ``width`` spaces, except continuation lines of multi-line strings
    (how ``%distribute export`` places a cell's code in a block)."""
    return "\n".join(_indent_cell(_split_lines(text), " " * width))


def _indent_cell(lines: list[str], indent: str = _INDENT) -> list[str]:
    """Indent every cell line by 8 spaces except continuation lines of multi-line strings.

    Leading tabs become spaces (AutoGraph refuses code mixing both in its indentation).
    """
    keep = _string_continuation_rows("\n".join(lines) + "\n")
    out = []
    for row, line in enumerate(lines, start=1):
        if row in keep:
            out.append(line)
        elif not line.strip():
            out.append("")
        else:
            stripped = line.lstrip(" \t\f")
            out.append(indent + " " * _indent_width(line[: len(line) - len(stripped)]) + stripped)
    return out


def _indent_width(lead: str) -> int:
    """The column Python's tokenizer gives leading whitespace (tab stops of 8, \\f resets)."""
    col = 0
    for char in lead:
        col = 0 if char == "\f" else (col // 8 + 1) * 8 if char == "\t" else col + 1
    return col


def _string_continuation_rows(text: str) -> set[int]:
    """Rows (1-based) that continue a string token begun on an earlier row."""
    rows: set[int] = set()
    depth, start = 0, 0
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in _STRING_STARTS:
            start = tok.start[0] if depth == 0 else start
            depth += 1
        elif tok.type in _STRING_ENDS:
            depth -= 1
            if depth == 0:
                rows.update(range(start + 1, tok.end[0] + 1))
        elif tok.type == tokenize.STRING:
            rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return rows


def _free_name(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever the cell does not use."""
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    return name
