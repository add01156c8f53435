"""What is installed, read from package metadata only (nothing is imported).

The kernel and every worker use this to compare versions (``cluster/compat.py``) and to find
the tf-keras that matches the installed TensorFlow (``nbdist.install_tf_keras``).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

#: Distributions that install the ``tensorflow`` package (one is enough).
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                    "tensorflow-macos", "tf-nightly", "tf-nightly-cpu")


def _path_rank(dist: importlib.metadata.Distribution) -> int:
    """Position on ``sys.path`` of the directory holding ``dist`` (len(sys.path) if none)."""
    where = os.path.abspath(str(dist.locate_file("")))
    for i, entry in enumerate(sys.path):
        if os.path.abspath(entry or os.curdir) == where:
            return i
    return len(sys.path)


def tensorflow_distribution() -> tuple[str, str] | None:
    """``(name, version)`` of the TensorFlow distribution ``import tensorflow`` would use.

    Read from metadata only: TensorFlow is not imported. When several TensorFlow distributions
    are installed, the one whose directory comes first on ``sys.path`` wins, as the import does.
    """
    best: tuple[int, str, str] | None = None
    for name in TF_DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        candidate = (_path_rank(dist), dist.metadata["Name"], dist.version)
        if best is None or candidate[0] < best[0]:
            best = candidate
    return None if best is None else (best[1], best[2])


def installed_version(package: str) -> str:
    """``package``'s installed version from its metadata, or "not installed"."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"
