"""Counted nouns read as English, including multi-word and irregular ones; what users read
says "the notebook's strategy", never the session's."""

import ast
import re
from pathlib import Path

from nbdist.words import count


def test_counted_nouns():
    assert count(1, "replica") == "1 replica"
    assert count(4, "replica") == "4 replicas"
    assert count(0, "step") == "0 steps"
    assert count(3, "op") == "3 ops"
    assert count(2, "process") == "2 processes"
    assert count(2, "worker process") == "2 worker processes"
    assert count(1, "fresh worker process") == "1 fresh worker process"
    assert count(2, "parameter server") == "2 parameter servers"
    assert count(2, "index", "indices") == "2 indices"


# -- what users read names their notebook and kernel, never nbdist's internal Session --------
ROOT = Path(__file__).resolve().parents[1]
SESSION_WORDS = re.compile(r"\b(?:session's|this session\b|the session is\b)", re.I)


def messages_of(path: Path) -> list[tuple[int, str]]:
    """The strings users read in a module: every string constant but the docstrings of its
    private parts (``nbdist/__init__.py``'s docstrings are the API reference: kept)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    if path.name != "__init__.py" or path.parent.name != "nbdist":
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                 ast.AsyncFunctionDef)) and ast.get_docstring(node) is not None:
                docstrings.add(id(node.body[0].value))
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings)


def session_wording(package: Path, pages: list[Path]) -> list[str]:
    found = [f"{path.relative_to(package.parent)}:{line}: {text.strip()[:80]!r}"
             for path in sorted(package.rglob("*.py")) for line, text in messages_of(path)
             if SESSION_WORDS.search(text)]
    for page in pages:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if SESSION_WORDS.search(line):
                found.append(f"{page.relative_to(package.parent)}:{number}: {line.strip()[:80]!r}")
    return found


def test_messages_and_pages_say_the_notebooks_strategy_not_the_sessions():
    """``Session`` is an internal class: users have a notebook and a kernel. The architecture
    page, for contributors, may name the class."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    pages = [p for p in pages if p.name != "architecture.md"]
    assert session_wording(ROOT / "nbdist", pages) == []


def test_the_wording_check_finds_a_message_a_help_string_and_a_page(tmp_path):
    package = tmp_path / "nbdist"
    package.mkdir()
    (package / "x.py").write_text(
        '"""The session\'s module docstring: internal, allowed."""\n'
        'def f(n):\n'
        '    """The session\'s strategy: a private docstring, allowed."""\n'
        '    raise ValueError(f"{n} is not the session\'s " "strategy")\n'
        'HELP = "a dataset of this session\'s strategy"\n')
    (package / "__init__.py").write_text(
        'def strategy():\n    """The session\'s strategy (the API reference shows it)."""\n')
    page = tmp_path / "guide.md"
    page.write_text("# Guide\n\nThe session is unchanged.\n")
    assert session_wording(package, [page]) == [
        "nbdist/__init__.py:2: \"The session's strategy (the API reference shows it).\"",
        "nbdist/x.py:4: \"is not the session's strategy\"",
        "nbdist/x.py:5: \"a dataset of this session's strategy\"",
        "guide.md:3: 'The session is unchanged.'",
    ]
