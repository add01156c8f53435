"""The documentation as a reader meets it: the site builds with warnings as errors, and every
example of README.md and of each docs/ page runs as written.

A page is a notebook: its fenced blocks whose info string is exactly ``python`` are its cells,
in order, run in one fresh ``python3`` kernel per page from the repository root, as a reader
pasting them one by one would. Every other block is text: ``bash``, ``text``, a
```` ```{code-block} python ```` directive, or ```` ```python title="ipcluster_config.py" ````
(a file's content, not a cell). A page without a python block is not collected here. The
executed pages are written to ``test-artifacts/docs/`` for inspection.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
ARTIFACTS = ROOT / "test-artifacts" / "docs"
#: Printed by a cell, each is a failure: a magic refused its line, nbdist warned, or
#: TensorFlow's start-up lines reached the cell (nbdist keeps them out of the cell that
#: loads TensorFlow: tflogs.import_tensorflow_quietly).
BAD_OUTPUT = ("UsageError", "Warning: nbdist", "nbdist: the dashboard stopped drawing",
              "absl::InitializeLog", "oneDNN custom operations")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def python_blocks(markdown: str) -> list[str]:
    """The page's cells: the body of each fenced block whose info string is exactly
    ``python``, in order, without the fence's indentation (a block inside a list item)."""
    blocks: list[str] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        i += 1
        if not opening or (opening["fence"][0] == "`" and "`" in opening["info"]):
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body = []
        while i < len(lines):   # a block ends at a fence of its character, at least as long
            closing = _FENCE.match(lines[i])
            i += 1
            if closing and closing["fence"][0] == fence[0] and \
                    len(closing["fence"]) >= len(fence) and not closing["info"].strip():
                break
            line = lines[i - 1]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
        if opening["info"].strip() == "python":
            blocks.append("\n".join(body).strip("\n"))
    return blocks


def page_notebook(markdown: str) -> nbformat.NotebookNode:
    """A notebook of the page's python blocks, one code cell each."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(block) for block in python_blocks(markdown)]
    return nb


def _pages() -> list[str]:
    """README.md, then every docs/ page in path order (not the build's output)."""
    found = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")
                   if not {"_build", "notebooks"} & set(p.relative_to(DOCS).parts))
    return ["README.md", *found]


PAGES_WITH_CODE = [p for p in _pages() if python_blocks((ROOT / p).read_text("utf-8"))]


def test_the_site_builds_with_warnings_as_errors(tmp_path):
    """Sphinx builds docs/ (MyST pages, the rendered tutorials, the reference read from the
    code) with no warning: a broken link, a page missing from the contents, a docstring
    that is not valid reStructuredText. A notebook a user made in notebooks/ while working
    through the tutorials (an untitled one, with a traceback) is not part of the site."""
    import nbformat

    users = ROOT / "notebooks" / "Untitled-docs-test.ipynb"
    cell = nbformat.v4.new_code_cell("%load_ext nbdist", outputs=[nbformat.v4.new_output(
        "error", ename="ValueError", evalue="x", traceback=["\x1b[0;31mValueError\x1b[0m"])])
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), users)
    try:
        build = subprocess.run(
            [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
             str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT,
            timeout=600)
    finally:
        users.unlink()
    assert build.returncode == 0, f"sphinx failed:\n{build.stdout}\n{build.stderr}"
    assert not (tmp_path / "html" / "notebooks" / "Untitled-docs-test.html").exists()
    magics = (tmp_path / "html" / "reference" / "magics.html").read_text("utf-8")
    for flag in ("--devices", "--steps-per-call", "--at-step", "--force", "parameter_server",
                 "partition"):
        assert flag in magics, f"the flags reference lacks {flag}"


def test_fences_decide_what_runs():
    """Exactly ```python blocks are cells: not other languages, not a directive, not a file
    shown with a title; a longer fence holds a shorter one; list items' blocks dedented."""
    page = "\n".join([
        "# A page", "```python", "x = 1", "```", "```bash", "echo no", "```",
        "```{code-block} python", "no = 1", "```", '```python title="ipcluster_config.py"',
        "c = get_config()", "```", "````markdown", "```python", "inner = 1", "```", "````",
        "1. a step:", "", "   ```python", "   y = x + 1", "", "   print(y)", "   ```",
        "~~~python", "z = 3", "~~~"])
    assert python_blocks(page) == ["x = 1", "y = x + 1\n\nprint(y)", "z = 3"]


@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_every_python_block_runs_in_order(page, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    # The kernel inherits the environment: this checkout's nbdist, less C++ noise.
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys(paths)))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    nb = page_notebook((ROOT / page).read_text("utf-8"))
    client = NotebookClient(nb, timeout=600, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(ROOT)}})
    started, failure = time.monotonic(), ""
    try:
        client.execute()
    except CellExecutionError as err:
        failure = _ANSI.sub("", str(err))
    finally:
        out = ARTIFACTS / f"{page.removeprefix('docs/').removesuffix('.md')}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
        print(f"{page}: {len(nb.cells)} blocks in {time.monotonic() - started:.1f} s")
    assert not failure, f"{page}: a python block failed (executed: {out}):\n{failure[-4000:]}"
    printed = [f"block {n + 1} ({cell.source.splitlines()[0]!r}): {_ANSI.sub('', text)[:600]}"
               for n, cell in enumerate(nb.cells) for o in cell.get("outputs", [])
               for text in [o.get("text", "") if o.output_type == "stream" else ""]
               if any(bad in text for bad in BAD_OUTPUT)]
    assert not printed, f"{page} printed what a reader must not see:\n" + "\n".join(printed)
