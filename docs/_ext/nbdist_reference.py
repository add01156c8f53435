"""Reference tables read from nbdist's code when the docs are built, so they cannot drift.

Directives (MyST: ```` ```{nbdist-flags} line ```` ... ```` ``` ````):

- ``nbdist-flags line|cell|export``: every argument of the ``%distribute`` line parser, the
  ``%%distribute`` cell parser or ``%distribute export``'s parser (argparse actions: the flag,
  its value, its default and its help), in the parser's order.
- ``nbdist-usage line|cell|export``: the parser's usage line, as ``%distribute --help`` prints.
- ``nbdist-families``: the strategy families of ``nbdist.families.FAMILIES``.
- ``nbdist-faults``: the fault kinds of ``nbdist.cluster.protocol.FAULT_KINDS``.

Each page that uses one is rebuilt when the module it reads changes.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from docutils import nodes
from IPython.core.magic_arguments import MagicHelpFormatter
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

Cell = str | nodes.Node | Sequence[nodes.Node]
USAGE_WIDTH = 80   # columns of a usage line: a code block of the page shows them unscrolled


def _parsers() -> dict[str, tuple[argparse.ArgumentParser, ModuleType]]:
    from nbdist import export, magics

    return {"line": (magics._line_args.parser, magics),
            "cell": (magics._cell_args.parser, magics),
            "export": (export._export_args.parser, export)}


def _literal(text: str) -> nodes.literal:
    return nodes.literal(text=text)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Cell]],
           widths: Sequence[int]) -> nodes.table:
    """A docutils table: a header row, then one row per entry (text, or inline nodes)."""
    table = nodes.table(classes=["nbdist-reference"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    group.extend(nodes.colspec(colwidth=w) for w in widths)
    head, body = nodes.thead(), nodes.tbody()
    group += head
    group += body
    head += _row(headers)
    body.extend(_row(r) for r in rows)
    return table


def _row(cells: Sequence[Cell]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        paragraph = nodes.paragraph()
        if isinstance(cell, str):
            paragraph += nodes.Text(cell)
        elif isinstance(cell, nodes.Node):
            paragraph += cell
        else:
            paragraph.extend(cell)
        row += nodes.entry("", paragraph)
    return row


_SAYS_DEFAULT = re.compile(r"\s*\(default: (?P<default>.*)\)$")


def _help(action: argparse.Action) -> str:
    """An argument's help as argparse prints it (``%%`` is a percent sign there), without the
    "(default: ...)" the table shows in a column of its own."""
    return _SAYS_DEFAULT.sub("", (action.help or "").replace("%%", "%"))


def _default(action: argparse.Action) -> Cell:
    """What an argument is when it is not on the line: as its help says it (the value
    argparse fills in is often None for "decided later"), else argparse's own value."""
    says = _SAYS_DEFAULT.search((action.help or "").replace("%%", "%"))
    if says:
        return says["default"]
    if action.default is None or action.nargs == 0:   # a switch: off unless given
        return ""
    return _literal(str(action.default))


class _Reference(SphinxDirective):
    """A table built from a module of nbdist; the page depends on that module's file."""

    has_content = False

    def depends_on(self, *modules: ModuleType) -> None:
        for module in (*modules, sys.modules[__name__]):
            self.env.note_dependency(inspect.getfile(module))


class FlagsDirective(_Reference):
    """``nbdist-flags line|cell|export``: one row per argument of that parser."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        parser, module = self.parser()
        rows = []
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if action.option_strings:
                name: Cell = _literal(", ".join(action.option_strings))
                value: Cell = "" if action.nargs == 0 else _literal(str(action.metavar or ""))
            else:
                name, value = _literal(str(action.metavar or action.dest)), ""
            rows.append([name, value, _default(action), _help(action)])
        self.depends_on(module)
        return [_table(["Argument", "Value", "Default", "What it does"], rows,
                       [16, 10, 20, 54])]

    def parser(self) -> tuple[argparse.ArgumentParser, ModuleType]:
        which = self.arguments[0]
        parsers = _parsers()
        if which not in parsers:
            raise self.error(f"nbdist-flags takes one of {', '.join(parsers)}, not {which!r}")
        return parsers[which]


class UsageDirective(FlagsDirective):
    """``nbdist-usage line|cell|export``: the usage line argparse prints for that parser."""

    def run(self) -> list[nodes.Node]:
        parser, module = self.parser()
        self.depends_on(module)
        # as the help prints it, wrapped to a page's width; IPython's magic formatter writes
        # "::" and the usage indented by two spaces
        formatter = MagicHelpFormatter(parser.prog, width=USAGE_WIDTH)
        formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
        text = formatter.format_help().removeprefix("usage:").strip().removeprefix("::")
        usage = textwrap.dedent(text.strip("\n")).rstrip()
        return [nodes.literal_block(usage, usage, language="text")]


class FamiliesDirective(_Reference):
    """``nbdist-families``: one row per registered strategy family, in the registry's order."""

    def run(self) -> list[nodes.Node]:
        from nbdist import families

        rows = [[_literal(f.name), _literal(f.tf_class), f"{f.scope}. {f.use_case}.",
                 "this kernel" if f.in_kernel else "worker processes", f.gradient_sync,
                 _flag_list(f.flags)]
                for f in families.FAMILIES.values()]
        self.depends_on(families)
        return [_table(["Strategy", "TensorFlow", "What it is for", "Runs in",
                        "Gradients", "Placement flags"], rows, [12, 22, 26, 10, 14, 16])]


def _flag_list(flags: Sequence[str]) -> list[nodes.Node]:
    out: list[nodes.Node] = []
    for i, flag in enumerate(flags):
        if i:
            out.append(nodes.Text(" "))
        out.append(_literal(f"--{flag}"))
    return out


class FaultsDirective(_Reference):
    """``nbdist-faults``: one row per fault kind ``%distribute inject`` puts into a worker."""

    def run(self) -> list[nodes.Node]:
        from nbdist.cluster import protocol

        rows = [[_literal(k.name), k.help, "yes" if k.at_step else "no",
                 _literal(f"{k.delay:g}") if k.delay is not None else ""]
                for k in protocol.FAULT_KINDS.values()]
        self.depends_on(protocol)
        return [_table(["Fault", "What it does to the worker", "--at-step N",
                        "--delay S (default)"], rows, [10, 60, 10, 12])]


DIRECTIVES: dict[str, Callable[..., Any]] = {
    "nbdist-flags": FlagsDirective,
    "nbdist-usage": UsageDirective,
    "nbdist-families": FamiliesDirective,
    "nbdist-faults": FaultsDirective,
}


def setup(app: Sphinx) -> dict[str, Any]:
    for name, directive in DIRECTIVES.items():
        app.add_directive(name, directive)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
