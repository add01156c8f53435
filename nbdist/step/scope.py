"""The statements a step body cannot contain, and how the error explains each.

``rewrite`` compiles the cell as the body of a function, so ``return``, ``yield``, ``await``,
``global``... cannot appear in it (outside nested functions). ``ScopeScan`` finds them while
it walks the cell's own scope for the names it binds (``names.ScopeNames``: ``loss`` and
``grads`` are what the step returns). Pure ``ast``.
"""

from __future__ import annotations

import ast

from .names import ScopeNames

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


class ScopeScan(ScopeNames):
    """Walk the cell's own scope (``names.ScopeNames``: what it binds is ``assigned``) and
    record the statements a step body cannot contain (``problems``), also in the parts of
    nested scopes that run in the cell's scope (decorators, defaults, annotations...)."""

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[tuple[ast.AST, str]] = []

    def visit(self, node: ast.AST) -> None:
        kind = FORBIDDEN.get(type(node))
        if kind is not None:
            self.problems.append((node, kind))
        super().visit(node)
