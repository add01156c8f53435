"""Shared fixtures: one real IPython shell with nbdist loaded and 4 logical CPU devices.

TensorFlow fixes its device layout once per process, so the in-process tests share one layout
(4 logical CPUs, made by the first `%distribute mirrored --devices 4`). Tests of device setup
that need a fresh process run a subprocess instead.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbdist")
    shell.run_line_magic("distribute", "mirrored --devices 4")
    yield shell
