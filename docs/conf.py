"""Sphinx configuration of nbdist's documentation (MyST markdown pages, tutorials rendered
from the notebooks without running them, the reference generated from the code).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (tests/test_docs.py
does, with warnings as errors)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]   # this checkout's nbdist; the extension

from nbdist.version import __version__  # noqa: E402

project = "nbdist"
author = "nbdist contributors"
copyright = "nbdist contributors"
release = version = __version__

extensions = [
    "myst_nb",                 # MyST markdown for the pages, and the tutorials' notebooks
    "sphinx.ext.autodoc",      # the Python API from docstrings (prose, no napoleon needed)
    "nbdist_reference",        # docs/_ext: the magics' flags, families and faults tables
]

# docs/notebooks links the repository's notebooks/ (the tutorials stay there, one copy): they
# are rendered as pages, and a link to ../notebooks/NAME.ipynb (as GitHub shows the
# repository) or notebooks/NAME.ipynb leads to the page (see setup below).
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
# Only the tutorials (NN-name.ipynb) of notebooks/: a notebook a user makes there while working
# through them (JupyterLab's Untitled.ipynb) is not part of the site.
include_patterns = ["*.md", "guide/*.md", "reference/*.md", "notebooks/[0-9][0-9]-*.ipynb"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# The tutorials are committed without outputs; running them needs TensorFlow and minutes.
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3       # [text](page.md#a-heading) links resolve
smartquotes_action = "qe"      # keep "--flag" as typed (no en dash); quotes and ellipses only

# Signatures and docstrings come from the code; nothing here needs TensorFlow or plotly
# (``import nbdist`` loads neither), so no module is mocked.
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"   # Run is made by nbdist, not by users: no fields

html_theme = "alabaster"
html_theme_options = {"page_width": "1160px"}   # room for the reference tables
html_title = f"nbdist {version}"
html_static_path: list[str] = []


def setup(app: Any) -> None:
    from sphinx.transforms.post_transforms import SphinxPostTransform

    linked = {os.path.realpath(p): p.name for p in DOCS.iterdir() if p.is_symlink()}

    class LinkedFolders(SphinxPostTransform):
        """A markdown link into a linked folder names it by its real path (Sphinx resolves
        links' symlinks), which is outside docs/: name the page inside docs/ instead, before
        MyST resolves the link (its resolver runs at priority 9)."""

        default_priority = 8

        def run(self, **kwargs: Any) -> None:
            from sphinx.addnodes import pending_xref

            for node in self.document.findall(pending_xref):
                target = node.get("reftarget", "")
                for real, name in linked.items():
                    if node.get("reftype") == "myst" and target.startswith(real + os.sep):
                        node["reftarget"] = name + target[len(real):]

    app.add_post_transform(LinkedFolders)
