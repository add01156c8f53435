"""What a worker is doing right now, for the kernel's stall diagnosis: its step, where its main
thread is (reading its input, or in the step and its collectives) and the Python stacks of
the threads that matter.

Called from the channel's reader thread (``protocol.DUMP_STACKS``), so it answers while the
main thread is blocked: in a collective, in an input pipeline, in a deadlock.
``sys._current_frames`` is public (documented in the ``sys`` module) and holds every thread's
innermost frame, including TensorFlow's threads that run Python (a ``from_generator`` or
``py_function`` of the input pipeline).
"""

from __future__ import annotations

import linecache
import sys
import sysconfig
import threading
import traceback
from typing import Any

#: Innermost frames kept per thread (the message stays small).
MAX_FRAMES = 12
#: Where the main thread is in a Keras fit: any nbdist function of this name.
_FIT = "fit"


def is_cell_file(filename: str) -> bool:
    """A ``%%distribute`` cell's code (``<nbdist-cell-N>``, ``<nbdist-step-N>``)."""
    return filename.startswith("<nbdist-")


def snapshot(step: int) -> dict[str, Any]:
    """``protocol.STACKS``: the step, the main thread's phase, and the main thread's stack
    plus those of the threads running the user's cell code. A thread is ``blocked_in_cell``
    when its innermost cell frame calls nothing but the standard library (``time.sleep``, a
    lock, a queue): it waits in the user's own code, not in TensorFlow. It is ``in_library``
    when its innermost frame outside the standard library is TensorFlow's, Keras' or
    nbdist's (a collective or an input pipeline waits there)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    threads, phase = [], "cell"
    for ident, frame in sys._current_frames().items():
        frames = traceback.extract_stack(frame)
        in_cells = any(is_cell_file(f.filename) for f in frames)
        if ident == main:
            phase = _phase(frames)
        elif not in_cells:
            continue
        threads.append({"name": "main" if ident == main else names.get(ident, str(ident)),
                        "main": ident == main, "blocked_in_cell": _blocked_in_cell(frames),
                        "in_library": _in_library(frames),
                        "frames": [_frame(f) for f in frames[-MAX_FRAMES:]]})
    return {"step": step, "phase": phase, "threads": threads}


def _blocked_in_cell(frames: list[traceback.FrameSummary]) -> bool:
    cell = [i for i, f in enumerate(frames) if is_cell_file(f.filename)]
    return bool(cell) and all(_stdlib(f.filename) for f in frames[cell[-1] + 1:])


def _in_library(frames: list[traceback.FrameSummary]) -> bool:
    for frame in reversed(frames):
        if not _stdlib(frame.filename):
            path = frame.filename.replace("\\", "/")
            return any(f"/{name}/" in path for name in _LIBRARIES)
    return False


_LIBRARIES = ("tensorflow", "tf_keras", "keras", "nbdist")


def _stdlib(filename: str) -> bool:
    if filename.startswith("<frozen "):
        return True
    return (filename.startswith(_STDLIB) and "site-packages" not in filename
            and "dist-packages" not in filename)


_STDLIB = sysconfig.get_paths()["stdlib"]


def _phase_functions() -> dict[tuple[str, str], str]:
    """(file, function) of the step loop's parts -> phase. Taken from the functions themselves
    (imported here, when asked: a step is running, so TensorFlow is loaded), so that renaming
    one cannot silently turn every stuck worker's phase into "cell"."""
    from ...data.iterate import timed_batches
    from ...step.runner import StepRunner

    return {(code.co_filename, code.co_name): phase
            for code, phase in ((timed_batches.__code__, "input"),
                                (StepRunner._one_step.__code__, "step"))}


def _phase(frames: list[traceback.FrameSummary]) -> str:
    functions = _phase_functions()
    for frame in reversed(frames):
        phase = functions.get((frame.filename, frame.name))
        if phase is None and frame.name == _FIT and "nbdist" in frame.filename.replace("\\", "/"):
            phase = "fit"
        if phase is not None:
            return phase
    return "cell"


def _frame(frame: traceback.FrameSummary) -> dict[str, Any]:
    text = frame.line or linecache.getline(frame.filename, frame.lineno or 0)
    return {"file": frame.filename, "line": frame.lineno, "name": frame.name,
            "text": (text or "").strip()[:200]}
