"""TensorFlow's own log output in nbdist's cells: quiet by default, everything on request.

By default, inside ``%distribute`` lines and ``%%distribute`` cells (in the kernel and on
worker processes) TensorFlow's Python logger is kept at WARNING (no ``Reduce to ... then
broadcast``, ``Using MirroredStrategy with devices ...``), Keras' warnings about datasets
(``shuffle=True`` ignored, input ran out of data) are hidden, and TensorFlow's C++ log level
(``TF_CPP_MIN_LOG_LEVEL``) is 2 (no oneDNN/CPU-feature start-up lines, no INFO or WARNING
lines from C++) unless it was set already. The C++ level is read once, when TensorFlow
first logs: ``%load_ext nbdist`` sets it, so load nbdist before importing TensorFlow.

To see everything: ``nbdist.set_verbose()`` (or ``NBDIST_VERBOSE=1`` in the environment
before starting Jupyter, which also lets the C++ lines through). Worker processes started
afterwards get the same setting.

Imports nothing from nbdist (a bottom-layer module, like ``errors``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator

__all__ = ["import_tensorflow_quietly", "native_stderr", "quiet_cpp_logs", "quiet_tensorflow",
           "set_verbose", "verbose", "worker_environment"]

ENV = "NBDIST_VERBOSE"
QUIET_CPP_LEVEL = "2"
# Keras' warnings about the dataset a fit was given, hidden by default (regexes).
KERAS_DATASET_WARNINGS = (
    r"`shuffle=True` was passed, but will be ignored",
    r"Your input ran out of data",
)
_LOGGERS = ("tensorflow", "absl")


def verbose() -> bool:
    """Whether TensorFlow's INFO logs are shown (``NBDIST_VERBOSE`` set to 1/true/yes)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def set_verbose(on: bool = True) -> None:
    """Show TensorFlow's and Keras' INFO logs and warnings in ``%%distribute`` cells (``on``)
    or hide them again (``set_verbose(False)``). Worker processes started afterwards follow.

    The C++ log level cannot change once TensorFlow has logged: for its lines too, set
    ``NBDIST_VERBOSE=1`` before starting Jupyter (or ``TF_CPP_MIN_LOG_LEVEL=0``)."""
    os.environ[ENV] = "1" if on else "0"


def worker_environment() -> dict[str, str]:
    """The log settings worker processes start with: the kernel's ``TF_CPP_MIN_LOG_LEVEL``
    (else 0 when verbose, else 2) and its ``NBDIST_VERBOSE``."""
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL") or ("0" if verbose() else QUIET_CPP_LEVEL)
    return {"TF_CPP_MIN_LOG_LEVEL": level, ENV: "1" if verbose() else "0"}


def quiet_cpp_logs() -> None:
    """Set ``TF_CPP_MIN_LOG_LEVEL`` to 2 unless it is set or nbdist is verbose (it acts only
    if TensorFlow has not logged yet in this process)."""
    if not verbose() and not os.environ.get("TF_CPP_MIN_LOG_LEVEL"):
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = QUIET_CPP_LEVEL


#: What TensorFlow's C++ prints to the process's stderr while it loads, whatever
#: ``TF_CPP_MIN_LOG_LEVEL`` says (its logger is not initialised yet): absl's notice, oneDNN's
#: and the CPU-feature lines. A kernel shows them as a red block under the first cell.
_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|\] oneDNN custom operations are on"
    r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    r"|^To enable the following instructions: .*rebuild TensorFlow with the appropriate")


def import_tensorflow_quietly() -> None:
    """Import TensorFlow with its start-up lines left out of the cell (``_STARTUP_NOISE``);
    anything else it writes to stderr meanwhile is passed on. Does nothing when TensorFlow is
    imported already or when ``verbose()``. The lines come from C++ straight to file
    descriptor 2, so that descriptor is pointed at a file for the import."""
    if "tensorflow" in sys.modules or verbose():
        return
    with native_stderr() as caught:
        import tensorflow  # noqa: F401
    kept = [line for line in caught if not _STARTUP_NOISE.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)


@contextlib.contextmanager
def native_stderr() -> Iterator[list[str]]:
    """What C++ code writes to file descriptor 2 while the block runs (TensorFlow's and gRPC's
    log lines bypass Python's ``sys.stderr``): kept out of the cell and put, line by line, in
    the list this yields when the block ends. Without a usable descriptor 2 the block runs as
    is and the list stays empty."""
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield lines
        return
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines += [line for line in caught.read().decode(errors="replace").splitlines()
                      if line.strip()]


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


_FILTER = _BelowWarning()


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """TensorFlow's Python loggers show WARNING and above, Keras' dataset warnings are hidden;
    as they were afterwards. Does nothing when ``verbose()``.

    A filter, not ``setLevel``: TensorFlow sets its logger to INFO when it is first imported
    in an interactive shell, which may happen inside the cell."""
    if verbose():
        yield
        return
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    added = [lg for lg in loggers if _FILTER not in lg.filters]
    for lg in added:
        lg.addFilter(_FILTER)
    try:
        with warnings.catch_warnings():
            for message in KERAS_DATASET_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg in added:
            lg.removeFilter(_FILTER)
