"""The statements a step body cannot contain, and how the error explains each.

``rewrite`` compiles the cell as the body of a function, so ``return``, ``yield``, ``await``,
``global``... cannot appear in it (outside nested functions). ``ScopeScan`` finds them while
it walks the cell's own scope for the names it binds (``names.ScopeNames``: ``loss`` and
``grads`` are what the step returns). Pure ``ast``.
"""

from __future__ import annotations

import ast

from ..cellnames import ScopeNames

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


#: Keras methods that run a loop of their own: they cannot run inside a compiled step.
KERAS_LOOPS = ("fit", "evaluate", "predict")

#: Methods of a notebook list whose call a compiled step makes only once (``add`` and
#: ``update`` are left out: ``tf.add``, a metric's ``update``).
_MUTATORS = ("append", "extend", "insert")


def keras_loop_call(tree: ast.AST) -> ast.Call | None:
    """The first ``model.fit(...)`` (or ``evaluate``/``predict``) the step cell calls."""
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr in KERAS_LOOPS]
    return min(calls, key=lambda n: (n.lineno, n.col_offset), default=None)


def keras_loop_message(call: ast.Call) -> str:
    what = call.func.attr if isinstance(call.func, ast.Attribute) else "fit"
    return (f"`.{what}(...)` runs Keras' own loop over the data, which cannot run inside the "
            "step that nbdist compiles and calls once per batch: use scope mode (drop --step): "
            f"`%%distribute` runs the cell under the strategy's scope and records every "
            f"`{what}`.")


def side_effects(tree: ast.Module, assigned: set[str]) -> list[tuple[int, str]]:
    """(line, what it does) for each Python side effect the compiled step runs only while
    it is traced: ``print(...)`` and a notebook list's ``append`` (``assigned``: the cell's
    own names, whose lists live only in the trace)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "print":
            found.append((node.lineno, "prints once, a symbolic tensor rather than its value: "
                                       "use `tf.print(...)` to print at every step"))
        elif (isinstance(func, ast.Attribute) and func.attr in _MUTATORS
              and isinstance(func.value, ast.Name) and func.value.id not in assigned):
            found.append((node.lineno, f"changes `{func.value.id}` once, with symbolic tensors: "
                                       "keep per-step values in a tf.Variable (`.assign(...)`), "
                                       "or read the recorded ones from nbdist.runs[-1].metrics"))
    return sorted(found)
