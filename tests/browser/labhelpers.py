"""Helpers for the browser tests (fixtures live in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def write_notebook(directory: Path, name: str, cells: list[str]) -> str:
    nb = {
        "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                   "source": c} for c in cells],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                    "language": "python"}},
        "nbformat": 4, "nbformat_minor": 5,
    }
    (directory / name).write_text(json.dumps(nb))
    return name


def run_all_and_wait(page, timeout_ms: int = 180_000) -> None:
    """Run every cell and wait until the kernel is idle with every cell executed."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        "() => { const w = window.jupyterapp.shell.currentWidget;"
        " const cells = w.content.widgets.filter(c => c.model.type === 'code');"
        " return w.sessionContext.session.kernel.status === 'idle' &&"
        " cells.every(c => c.model.executionCount !== null); }",
        timeout=timeout_ms)


def shot(page, name: str) -> Path:
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path
