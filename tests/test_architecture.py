"""The architecture page is the code's plan, and the code keeps to it.

``docs/architecture.md`` lists, under "Allowed imports", one line per part of nbdist (a
top-level module, or a package with all its modules): ``part: may import a, b, ...``, from
the top of the house down. These tests read that list and the import graph of ``nbdist/``
(every ``import`` and ``from ... import``, at module level and inside functions, relative
ones resolved) and fail on an import the page does not allow, on a part the page does not
list, and on a cycle between packages (siblings of one package, at every depth). The checker
itself is tested on small packages written to ``tmp_path``, so it cannot pass by finding
nothing.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
HEADING = "## Allowed imports"
RULE = re.compile(r"^(\S+): may import (.+)$")


@dataclass(frozen=True)
class Import:
    """``importer`` (a dotted module name) imports ``imported`` at ``where`` (file:line)."""
    importer: str
    imported: str
    where: str
    statement: str


def read_rules(page: str) -> list[tuple[str, set[str]]]:
    """The page's "Allowed imports" block: (part, the parts it may import), top first."""
    after = page.split(HEADING, 1)[1]
    block = re.search(r"```text\n(.*?)```", after, re.S).group(1)
    rules = []
    for line in block.strip().splitlines():
        match = RULE.match(line.strip())
        assert match, f"{PAGE.name}: not a `part: may import ...` line: {line!r}"
        allowed = match.group(2).strip()
        rules.append((match.group(1),
                      set() if allowed == "nothing" else {a.strip() for a in allowed.split(",")}))
    return rules


def modules_of(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        is_init = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_init else parts)] = (path, is_init)
    return modules


def source_of(lines: list[str], node: ast.stmt) -> str:
    """``node``'s statement on one line (``ast.get_source_segment`` splits the whole file
    again for each node)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset]
    return " ".join([lines[first][node.col_offset:], *lines[first + 1:last],
                     lines[last][:node.end_col_offset]])


@functools.cache
def imports_of(package: Path) -> tuple[Import, ...]:
    """Every import of one of ``package``'s modules by another, anywhere in a module."""
    modules = modules_of(package)
    found = []
    for name, (path, is_init) in modules.items():
        text = path.read_text()
        lines = text.splitlines()
        where = path.relative_to(package.parent).as_posix()
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_init else name.split(".")[:-1]
                    here = here[:len(here) - node.level + 1]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                targets = []
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    targets.append(whole if whole in modules else base)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            statement = source_of(lines, node)
            for target in dict.fromkeys(targets):
                if target in modules and target != name:
                    found.append(Import(name, target, f"{where}:{node.lineno}",
                                        " ".join(statement.split())))
    return tuple(found)


def part_of(module: str) -> str:
    """The part of the house a module belongs to: ``nbdist.step.loop`` -> ``step``; the
    package's own ``__init__`` is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rule_violations(package: Path, rules: list[tuple[str, set[str]]]) -> list[str]:
    """What breaks the page: its own order, a part it does not list, an import not allowed."""
    order = [part for part, _ in rules]
    allowed = dict(rules)
    problems = [f"{PAGE.name}: {part} is listed twice" for part in set(order)
                if order.count(part) > 1]
    for i, (part, may) in enumerate(rules):
        for other in sorted(may - set(order[i + 1:])):
            problems.append(f"{PAGE.name}: {part} may import {other}, which is not listed "
                            f"below it (the list goes one way, from the top down)")
    parts = {part_of(m) for m in modules_of(package)}
    problems += [f"{package.name}/{p}: a part {PAGE.name} does not list under {HEADING!r}"
                 for p in sorted(parts - set(order))]
    problems += [f"{PAGE.name}: {p} is listed but is no part of {package.name}/"
                 for p in sorted(set(order) - parts)]
    for imp in imports_of(package):
        mine, theirs = part_of(imp.importer), part_of(imp.imported)
        if mine != theirs and mine in allowed and theirs not in allowed[mine]:
            may = ", ".join(sorted(allowed[mine])) or "nothing"
            problems.append(f"{imp.where}: `{imp.statement}`: {mine} may not import {theirs} "
                            f"({PAGE.name}: `{mine}: may import {may}`)")
    return problems


def package_cycles(package: Path) -> list[str]:
    """Cycles between the modules and subpackages of one package, at every depth: ``a``
    imports from ``b`` (anything in it) and ``b``, through its imports, from ``a``."""
    imports = imports_of(package)
    packages = {m for m, (_, is_init) in modules_of(package).items() if is_init}
    problems = []
    for parent in sorted(packages):
        depth = parent.count(".") + 1
        graph: dict[str, set[str]] = {}
        example: dict[tuple[str, str], Import] = {}
        for imp in imports:
            a, b = imp.importer.split("."), imp.imported.split(".")
            if len(a) <= depth or len(b) <= depth or a[:depth] != parent.split(".") \
                    or b[:depth] != a[:depth] or a[depth] == b[depth]:
                continue
            graph.setdefault(a[depth], set()).add(b[depth])
            example.setdefault((a[depth], b[depth]), imp)
        while True:
            try:
                tuple(graphlib.TopologicalSorter(graph).static_order())
                break
            except graphlib.CycleError as err:
                cycle = list(reversed(err.args[1]))      # each imports the next
            steps = [example[(a, b)] for a, b in zip(cycle, cycle[1:], strict=False)]
            problems.append(
                f"package cycle in {parent}: {' -> '.join(cycle)} ("
                + "; ".join(f"{s.where}: `{s.statement}`" for s in steps) + ")")
            graph[cycle[0]].discard(cycle[1])             # report the others too
    return problems


# -- the house ----------------------------------------------------------------------------------
def test_every_import_in_nbdist_is_one_the_architecture_page_allows():
    problems = rule_violations(ROOT / "nbdist", read_rules(PAGE.read_text()))
    assert problems == [], "\n".join(["imports against docs/architecture.md:", *problems])


def test_no_package_of_nbdist_imports_itself_through_another():
    problems = package_cycles(ROOT / "nbdist")
    assert problems == [], "\n".join(problems)


def test_no_module_of_nbdist_imports_itself_through_another():
    """Counting imports inside functions and under TYPE_CHECKING: a deferred import that
    closes a circle still ties the two modules' ideas together."""
    graph: dict[str, set[str]] = {m: set() for m in modules_of(ROOT / "nbdist")}
    for imp in imports_of(ROOT / "nbdist"):
        graph[imp.importer].add(imp.imported)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
        cycle = None
    except graphlib.CycleError as err:
        cycle = err.args[1]
    assert cycle is None, f"import cycle (each imports the next): {' -> '.join(reversed(cycle))}"


def test_the_code_layout_on_the_page_is_in_the_order_of_the_allowed_imports():
    page = PAGE.read_text()
    layout = re.search(r"## Code layout.*?```text\n(.*?)```", page, re.S).group(1)
    listed = [re.match(r"nbdist/(\w+)", line).group(1) for line in layout.splitlines()
              if line.startswith("nbdist/")]
    order = [part for part, _ in read_rules(page)]
    assert set(listed) <= set(order), set(listed) - set(order)
    assert listed == sorted(listed, key=order.index)


# -- the checker --------------------------------------------------------------------------------
def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


RULES = """
## Allowed imports

```text
__init__: may import top, low
top: may import low
low: may import nothing
```
"""


def test_the_checker_finds_an_upward_import_even_inside_a_function(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "from . import top\n",
        "top.py": "from .low import base\n",
        "low/__init__.py": "",
        "low/base.py": "import os\n\n\ndef late():\n    from ..top import thing\n",
    })
    problems = rule_violations(package, read_rules(RULES))
    assert problems == ["pkg/low/base.py:5: `from ..top import thing`: low may not import top "
                        "(architecture.md: `low: may import nothing`)"]


def test_the_checker_finds_an_unlisted_part_and_a_page_that_goes_upward(tmp_path):
    package = write_package(tmp_path, {"__init__.py": "", "top.py": "", "low.py": "",
                                       "new.py": ""})
    rules = read_rules(RULES.replace("low: may import nothing", "low: may import top"))
    assert rule_violations(package, rules) == [
        "architecture.md: low may import top, which is not listed below it (the list goes "
        "one way, from the top down)",
        "pkg/new: a part architecture.md does not list under '## Allowed imports'",
    ]


def test_the_checker_finds_a_package_cycle_through_modules_that_do_not_cycle(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/one.py": "from ..b.two import x\n",
        "a/names.py": "",
        "b/__init__.py": "",
        "b/two.py": "def f():\n    import pkg.a.names\n",
    })
    assert package_cycles(package) == [
        "package cycle in pkg: a -> b -> a (pkg/a/one.py:1: `from ..b.two import x`; "
        "pkg/b/two.py:2: `import pkg.a.names`)"]
