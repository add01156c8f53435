"""A step cell's own scope: the names it binds and the statements a step body cannot contain.

``rewrite`` compiles the cell as the body of a function, so ``return``, ``yield``, ``await``,
``global``... cannot appear in it (outside nested functions), and the names it assigns
(``loss``, ``grads``) are what the step returns. Pure ``ast``.
"""

from __future__ import annotations

import ast

#: Statements a step body cannot contain, and how the error names them.
FORBIDDEN: dict[type[ast.AST], str] = {
    ast.Return: "return",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Await: "await",
    ast.AsyncFor: "async for",
    ast.AsyncWith: "async with",
    ast.Nonlocal: "nonlocal",
    ast.Global: "global",
}


def problem_message(kind: str, loss: str) -> str:
    """The explanation and fix for a statement the step body cannot contain."""
    body = (
        "the cell is the body of the step function, which nbdist compiles with tf.function "
        f"and which returns `{loss}` for you after the cell's last line"
    )
    state = (
        "keep state in tf.Variables created in a scope-mode cell (`%%distribute` without "
        "`--step`) and update them with `.assign(...)`"
    )
    if kind == "return":
        return f"`return` cannot end a step cell: {body}. Remove the `return` statement."
    if kind in ("yield", "yield from"):
        return f"`{kind}` would turn the step into a generator: {body}. Remove the statement."
    if kind == "nonlocal":
        return f"`nonlocal` has no enclosing function to refer to: {body}. Remove it and {state}."
    if kind == "global":
        return (
            "`global` cannot be used in a step: the step runs as a compiled function, so a "
            "Python global is assigned once while tracing, not at every step. Remove the "
            f"statement and {state}."
        )
    return f"`{kind}` needs an async function, but {body}. Remove `{kind}`."


class ScopeScan(ast.NodeVisitor):
    """Walk the cell's own scope, skipping nested def/lambda/class/comprehension scopes.

    Records the names the scope binds (``assigned``) and the statements a step body cannot
    contain (``problems``). The parts of a nested scope that run in the cell's scope
    (decorators, defaults, bases, a comprehension's first iterable) are still visited.
    """

    def __init__(self) -> None:
        self.assigned: set[str] = set()
        self.problems: list[tuple[ast.AST, str]] = []
        self._in_comprehension = False

    def visit(self, node: ast.AST) -> None:
        kind = FORBIDDEN.get(type(node))
        if kind is not None:
            self.problems.append((node, kind))
        super().visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Store) and not self._in_comprehension:
            self.assigned.add(node.id)

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

    def _visit_all(self, nodes: list[ast.expr | None]) -> None:
        for node in nodes:
            if node is not None:
                self.visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        annotations = [a.annotation for a in args.posonlyargs + args.args + args.kwonlyargs]
        annotations += [a.annotation for a in (args.vararg, args.kwarg) if a is not None]
        self._visit_all([*node.decorator_list, *args.defaults, *args.kw_defaults])
        self._visit_all([*annotations, node.returns])

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_all([*node.args.defaults, *node.args.kw_defaults])

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_all([*node.decorator_list, *node.bases, *(k.value for k in node.keywords)])

    def _visit_comprehension(self, node: ast.expr) -> None:
        first, *_ = node.generators
        self.visit(first.iter)
        outer, self._in_comprehension = self._in_comprehension, True
        for field, value in ast.iter_fields(node):
            if field != "generators":
                self.visit(value)
        for gen in node.generators:
            self._visit_all([gen.target, *gen.ifs, None if gen is first else gen.iter])
        self._in_comprehension = outer

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension
