"""The tutorials executed in this test session, by name: each runs once. The Binder check
(test_binder.py) executes 00, 04 and 05 in its fresh virtualenv, as Binder users run them;
test_notebooks.py checks those executions rather than running the tutorials again, and
executes the others (or all, where the Binder check did not run) itself."""

from __future__ import annotations

import nbformat

EXECUTED: dict[str, nbformat.NotebookNode] = {}
