"""Which names a cell reads, binds and depends on: every question nbdist asks of a cell's
names, answered here once (pure ``ast``/``symtable``: no TensorFlow, no IPython).

* ``ScopeNames``: what a cell's own scope binds and loads, outside the scopes it opens. A step
  cell is the body of a function: the names it assigns are its locals (``loss``, ``grads``),
  which the step returns (``step.scope`` adds the statements a step body cannot contain).
* ``cell_names``: what a plain cell binds and what it reads from earlier cells, and
  ``step_reads``: what a step cell reads from the notebook (``%distribute export`` follows
  them back to the cells that define them).
* ``traced_step_reads``: the globals of the generated step function (``step.rewrite``), which
  the trace cache compares from one run of a cell to the next.
* ``loads_and_stores``: every name a cell loads, in order, and every name it stores, in any
  scope (the checkpoint finds the objects a step trains with them).
* ``code_names``: the globals a function's compiled code names; the checkpoint and the trace
  cache follow the notebook's functions a step calls through them.
* ``name_lines`` (where a name appears, for messages naming a cell line) and ``identifiers``
  (every identifier a cell mentions, which the names ``rewrite`` adds must avoid).
"""

from __future__ import annotations

import ast
import functools
import symtable
import types
from collections.abc import Callable
from dataclasses import dataclass


class ScopeNames(ast.NodeVisitor):
    """Walk a cell's own scope, skipping the bodies of the def/lambda/class/comprehension
    scopes it opens, and record the names it binds and loads.

    The parts of a nested scope that run in the cell's scope (decorators, defaults, bases,
    class keywords, a comprehension's first iterable) are visited; so are a function's
    annotations, but what they name is not counted as read (Python 3.14 evaluates them only
    when asked, and never under ``from __future__ import annotations``).
    """

    def __init__(self) -> None:
        self.assigned: set[str] = set()   # assignment targets, ``:=`` targets, imports
        self.defined: set[str] = set()    # def and class statements
        self.loads: set[str] = set()
        self._own = True   # False inside a comprehension or an annotation

    def visit_Name(self, node: ast.Name) -> None:
        if not self._own:
            return
        if isinstance(node.ctx, ast.Store):
            self.assigned.add(node.id)
        elif isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:  # a bare annotation `x: int` binds nothing
            self.visit(node.target)
            self.visit(node.value)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        # `:=` binds in the enclosing scope even inside a comprehension.
        self.assigned.add(node.target.id)
        self.visit(node.value)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self.assigned.add(alias.asname or alias.name.split(".")[0])

    visit_ImportFrom = visit_Import

    def _visit_all(self, nodes: list[ast.expr | None], own: bool = True) -> None:
        outer, self._own = self._own, self._own and own
        for node in nodes:
            if node is not None:
                self.visit(node)
        self._own = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.defined.add(node.name)
        args = node.args
        annotations = [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs]
        annotations += [a.annotation for a in (args.vararg, args.kwarg) if a is not None]
        self._visit_all([*node.decorator_list, *args.defaults, *args.kw_defaults])
        self._visit_all([*annotations, node.returns], own=False)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_all([*node.args.defaults, *node.args.kw_defaults])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.defined.add(node.name)
        self._visit_all([*node.decorator_list, *node.bases, *(k.value for k in node.keywords)])

    def _visit_comprehension(self, node: ast.expr) -> None:
        first, *_ = node.generators
        self.visit(first.iter)
        outer, self._own = self._own, False
        for field, value in ast.iter_fields(node):
            if field != "generators":
                self.visit(value)
        for gen in node.generators:
            self._visit_all([gen.target, *gen.ifs, None if gen is first else gen.iter])
        self._own = outer

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension


@dataclass(frozen=True)
class CellNames:
    defined: frozenset[str]     # bound at the cell's top level
    reads: frozenset[str]       # read from what earlier cells bound
    imported: frozenset[str]    # bound by import statements
    functions: frozenset[str]   # bound by def or class


def cell_names(code: str) -> CellNames:
    """The names ``code`` (a plain or scope cell) binds and reads.

    A cell *reads* a name from an earlier cell when a top-level statement loads it before the
    cell binds it, or when a function or class of the cell refers to a global the cell never
    binds.
    """
    tree = ast.parse(code)
    table = symtable.symtable(code, "<cell>", "exec")
    top = {s.get_name(): s for s in table.get_symbols()}
    defined = {n for n, s in top.items() if s.is_assigned() or s.is_imported()
               or s.is_namespace()}
    nested_reads: set[str] = set()
    for child in table.get_children():
        nested_reads |= _globals(child, _referenced)
        defined |= _globals(child, _assigned_global)
    reads = _read_before_bound(tree) | (nested_reads - defined)
    return CellNames(
        defined=frozenset(defined), reads=frozenset(reads),
        imported=frozenset(n for n, s in top.items() if s.is_imported()),
        functions=frozenset(node.name for node in tree.body if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))))


def step_reads(code: str, batch: str = "batch") -> frozenset[str]:
    """The names a step cell reads from the notebook (its assignments are its locals)."""
    source = f"def _step({batch}):\n" + "".join(f"    {line}\n" for line in code.splitlines())
    if not code.strip():
        source += "    pass\n"
    table = symtable.symtable(source, "<step>", "exec")
    return frozenset(_globals(table.get_children()[0], _referenced))


@functools.lru_cache(maxsize=32)
def traced_step_reads(text: str, factory_name: str, step_name: str) -> frozenset[str]:
    """The names the generated step function (``text``, from ``rewrite``) and what it nests
    look up as globals."""
    top = symtable.symtable(text, "<nbdist-step>", "exec")
    factory = next(t for t in top.get_children() if t.get_name() == factory_name)
    found: set[str] = set()
    for table in factory.get_children():
        if table.get_name() == step_name:
            found |= _globals(table, symtable.Symbol.is_global)
    return frozenset(found)


def _referenced(symbol: symtable.Symbol) -> bool:
    return symbol.is_global() and symbol.is_referenced()


def _assigned_global(symbol: symtable.Symbol) -> bool:
    return symbol.is_declared_global() and symbol.is_assigned()


def _globals(table: symtable.SymbolTable, keep: Callable[[symtable.Symbol], bool]) -> set[str]:
    """The names of ``table``'s symbols, and its nested tables', that ``keep`` accepts."""
    found = {s.get_name() for s in table.get_symbols() if keep(s)}
    for child in table.get_children():
        found |= _globals(child, keep)
    return found


def _read_before_bound(tree: ast.Module) -> set[str]:
    """Names a top-level statement loads before any earlier statement of the cell bound them."""
    bound: set[str] = set()
    reads: set[str] = set()
    for statement in tree.body:
        scan = ScopeNames()
        scan.visit(statement)
        reads |= scan.loads - bound
        bound |= scan.assigned | scan.defined
    return reads


def loads_and_stores(code: str) -> tuple[list[str], set[str]]:
    """Every name ``code`` loads (in order, once each) and every name it stores or deletes,
    in any of its scopes."""
    read: list[str] = []
    stored: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                read.append(node.id)
            else:
                stored.add(node.id)
    return list(dict.fromkeys(read)), stored


def code_names(code: types.CodeType, nested: bool = True) -> list[str]:
    """The global (and attribute) names a function's code uses, in order, once each; with
    ``nested``, also those of the functions, lambdas and comprehensions it defines."""
    names = list(code.co_names)
    if nested:
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                names += code_names(const)
    return list(dict.fromkeys(names))


def name_lines(tree: ast.AST, name: str, stored: bool = False) -> list[int]:
    """The lines where ``name`` appears as a name (``stored``: where it is assigned)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == name
            and (not stored or isinstance(node.ctx, ast.Store))]


_ID_FIELDS = frozenset({"id", "arg", "name", "asname", "names", "attr", "rest", "module"})


def identifiers(tree: ast.AST) -> set[str]:
    """Every identifier the cell mentions: names, args, attributes, defs, import aliases."""
    found: set[str] = set()
    for node in ast.walk(tree):
        for field, value in ast.iter_fields(node):
            if field in _ID_FIELDS:
                for item in value if isinstance(value, list) else [value]:
                    if isinstance(item, str):
                        found.update(item.split("."))
    return found
