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


def pytest_sessionstart(session):
    """Split the CPU into 4 logical devices before any test can initialise TensorFlow's devices
    (tests that build models directly would otherwise lock the process to one CPU device)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)


@pytest.fixture(scope="session")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbdist")
    shell.run_line_magic("distribute", "mirrored --devices 4")
    yield shell
