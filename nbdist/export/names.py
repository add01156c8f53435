"""Which names a cell defines and which it reads from earlier cells (pure ``ast``/``symtable``).

A cell *reads* a name from an earlier cell when a top-level statement loads it before the cell
binds it, or when a function or class of the cell refers to a global the cell never binds.
A step cell is the body of a function of ``batch``: every name it assigns is its own.
"""

from __future__ import annotations

import ast
import symtable
from dataclasses import dataclass

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
           ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class CellNames:
    defined: frozenset[str]     # bound at the cell's top level
    reads: frozenset[str]       # read from what earlier cells bound
    imported: frozenset[str]    # bound by import statements
    functions: frozenset[str]   # bound by def or class


def cell_names(code: str) -> CellNames:
    """The names ``code`` (a plain or scope cell) binds and reads."""
    tree = ast.parse(code)
    table = symtable.symtable(code, "<cell>", "exec")
    top = {s.get_name(): s for s in table.get_symbols()}
    defined = {n for n, s in top.items() if s.is_assigned() or s.is_imported()
               or s.is_namespace()}
    nested_reads: set[str] = set()
    for child in table.get_children():
        nested_reads |= _globals_read(child)
        defined |= _globals_assigned(child)
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
    return frozenset(_globals_read(table.get_children()[0]))


def _globals_read(table: symtable.SymbolTable) -> set[str]:
    found = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    for child in table.get_children():
        found |= _globals_read(child)
    return found


def _globals_assigned(table: symtable.SymbolTable) -> set[str]:
    found = {s.get_name() for s in table.get_symbols()
             if s.is_declared_global() and s.is_assigned()}
    for child in table.get_children():
        found |= _globals_assigned(child)
    return found


def _read_before_bound(tree: ast.Module) -> set[str]:
    """Names a top-level statement loads before any earlier statement of the cell bound them."""
    bound: set[str] = set()
    reads: set[str] = set()
    for statement in tree.body:
        loads, stores = _top_level_names(statement)
        reads |= loads - bound
        bound |= stores
    return reads


def _top_level_names(statement: ast.stmt) -> tuple[set[str], set[str]]:
    """(loaded, bound) names of one statement, outside the scopes it opens (function and
    class bodies, comprehensions), but with their decorators, defaults and bases."""
    loads: set[str] = set()
    stores: set[str] = set()
    todo: list[ast.AST] = [statement]
    while todo:
        node = todo.pop()
        if isinstance(node, _SCOPES):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                stores.add(node.name)
                todo += node.decorator_list
                todo += node.bases if isinstance(node, ast.ClassDef) else [
                    *node.args.defaults, *[d for d in node.args.kw_defaults if d]]
            elif isinstance(node, ast.Lambda):
                todo += [*node.args.defaults, *[d for d in node.args.kw_defaults if d]]
            else:   # the first iterable of a comprehension runs in the enclosing scope
                todo.append(node.generators[0].iter)
            continue
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else stores).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            stores |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, ast.NamedExpr):
            stores.add(node.target.id)
        todo.extend(ast.iter_child_nodes(node))
    return loads, stores
