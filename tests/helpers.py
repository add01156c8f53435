"""Helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ok(shell, code: str):
    """Run a cell; fail the test with the cell's error if it raised."""
    result = shell.run_cell(textwrap.dedent(code), store_history=False)
    if result.error_before_exec or result.error_in_exec:
        raise AssertionError(f"cell failed: {result.error_before_exec or result.error_in_exec!r}")
    return result.result


def run_err(shell, code: str) -> BaseException:
    """Run a cell that must fail; return its exception."""
    result = shell.run_cell(textwrap.dedent(code), store_history=False)
    err = result.error_before_exec or result.error_in_exec
    assert err is not None, "the cell was expected to fail but succeeded"
    return err


def run_python(code: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter (fresh TensorFlow device state)."""
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)
