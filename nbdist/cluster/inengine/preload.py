"""The local engines' entry point: import TensorFlow in the background, then be an engine.

``python -m nbdist.cluster.inengine.preload [ipengine arguments]`` starts a thread that imports
TensorFlow (the longest part of a cold start) and runs ipyparallel's engine in the main
thread meanwhile: the import overlaps the engine's own start, its registration with the
controller and the kernel's checks, instead of following them. The launcher's environment
(``TF_USE_LEGACY_KERAS``, log levels) is already set, as TensorFlow needs before its import.
Whoever needs TensorFlow later (``compat.preflight``, ``worker.setup``, ``ps_server.serve``)
imports it as usual: Python makes that import wait for this one. If it fails, the module is
left unimported, so that later import fails again and is reported there.

Python's cyclic garbage collector runs during that import: TensorFlow creates ~500,000 objects
that live as long as the process, and five full collections scan them while they are created
(0.3-0.5 s of a 2 s import here), then every later full collection scans them again (in the
first cells). The engine collects nothing while TensorFlow imports and then hands what exists
to ``gc.freeze``: the collector leaves those objects alone, and collects as usual afterwards.
The price: the import's own garbage cycles (1,549 objects, 1.3 MB here) are frozen too and
never freed, as are any cycles the engine's start made meanwhile.

A local engine also ends itself once the kernel that started it is gone (``withkernel``).
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import sys
import threading
import time

from ..withkernel import exit_with_parent

#: The controller's connection file for engines. The engines start before the controller
#: has written it; ipyparallel's engine waits for the file to exist, but could read it
#: half-written: this entry point waits until it parses.
URL_FILE_ENV = "NBDIST_ENGINE_URL_FILE"
URL_FILE_WAIT_S = 120.0

_CLOCKS: dict[str, float | None] = {"python_up": None, "tf_import_started": None,
                                    "tf_imported": None}


def clocks() -> dict[str, float | None]:
    """When this engine's Python reached this module, and began and finished importing
    TensorFlow (``time.time()``; None: not preloaded, or the import failed)."""
    return dict(_CLOCKS)


def _import_tensorflow() -> None:
    _CLOCKS["tf_import_started"] = time.time()
    gc.disable()
    try:
        import tensorflow  # noqa: F401
    except BaseException:  # noqa: BLE001 - reported by the next import (preflight)
        return
    finally:
        gc.freeze()   # what the import created: out of the collector's sight for good
        gc.enable()
    _CLOCKS["tf_imported"] = time.time()


def _wait_for_connection_file(path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                json.load(f)
            return
        except (OSError, ValueError):   # not there yet, or half-written
            time.sleep(0.05)
    # give up waiting: the engine reports the missing file itself


def main() -> None:
    _CLOCKS["python_up"] = time.time()
    exit_with_parent()
    threading.Thread(target=_import_tensorflow, name="nbdist-preload-tensorflow",
                     daemon=True).start()
    url_file = os.environ.pop(URL_FILE_ENV, None)
    if url_file:
        _wait_for_connection_file(url_file, URL_FILE_WAIT_S)
    sys.argv[0] = "ipengine"
    runpy.run_module("ipyparallel.engine", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    # run as a script this file is ``__main__``: use the importable module, whose clocks
    # the kernel can ask for
    from nbdist.cluster.inengine import preload

    preload.main()
