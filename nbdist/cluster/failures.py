"""What goes wrong on workers, as one error the user can act on.

Workers never send exception objects: ``describe_exception`` turns an exception into a plain
dict (type, message, the traceback from the user's cell down, the cell line). In the kernel,
``raise_for`` picks the failure that explains the others (a worker whose collective lost its
peer fails with ``UnavailableError`` *because* another failed) and raises it once, naming the
worker(s), instead of N copies of the same traceback.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

from .. import errors as _errors
from ..errors import NbdistError
from ..step.errormap import without_nbdist_frames
from ..words import count

#: TensorFlow errors a worker gets because a peer failed or stopped, not a cause of their own.
COLLATERAL = frozenset({
    "UnavailableError", "CancelledError", "AbortedError", "DeadlineExceededError",
})
_MAX_MESSAGE = 4000


class ClusterError(NbdistError):
    """The worker processes are unusable (dead, hung or broken): restart them."""


class ClusterStartError(NbdistError):
    """The worker processes could not be started."""


class WorkerDied(ClusterError):
    """A worker process ended while the cluster was in use: ``workers`` (their indexes and
    pids) after ``step`` steps of the run (None: before the cell, or before any step)."""

    def __init__(self, message: str, workers: dict[int, int | None] | None = None,
                 step: int | None = None):
        super().__init__(message)
        self.workers = dict(workers or {})
        self.step = step


class ControllerDied(ClusterError):
    """The ipyparallel controller between the kernel and its engines is gone."""


def controller_died_message(pid: int, during: str, lost: str) -> str:
    """What the user is told when the ipyparallel controller (``pid``) died: ``during``,
    where it was found (" during step 16 of the run", " since the last cell, so this cell
    was not run"); ``lost``, what was lost with the workers."""
    return (f"The ipyparallel controller (pid {pid}) died{during}: its process is gone "
            "(killed, or out of memory). It carries every cell to the workers and their "
            "results back, so the workers cannot be reached any more and are ended (an "
            "engine also exits by itself within a minute of losing its controller); no "
            f"worker failed. Lost with them: {lost}. Run `%distribute restart` for a "
            "fresh controller and workers, then re-run the `%%distribute` cells that built "
            "that state (model, optimizer, datasets) before training again (with "
            "--checkpoint DIR a step cell resumes after its last saved epoch).")


class WorkerHung(ClusterError):
    """A worker stopped answering (no heartbeat): stopped by a signal, or swapping."""


class WorkerUnreachable(ClusterError):
    """A worker's host stopped answering on the network (a partition, or the host is down)."""


class WorkerStuck(ClusterError):
    """A worker is alive but makes no progress (blocked in its input, a deadlock, SIGSTOP);
    shows every worker's step and stack (``multiworker.stall``)."""

    def __init__(self, message: str, stacks_text: str = ""):
        super().__init__(message)
        self.stacks_text = stacks_text

    def _render_traceback_(self) -> list[str]:
        return [*self.stacks_text.rstrip().splitlines(), f"{type(self).__name__}: {self}"]


class KerasUnsupported(NbdistError):
    """Keras 3 ``model.fit`` under a multi-worker strategy (keras-team/keras#20585)."""


class WorkerError(NbdistError):
    """User code failed on a worker; shows that worker's traceback, once."""

    def __init__(self, message: str, traceback_text: str = "", cell_line: int | None = None):
        super().__init__(message)
        self.traceback_text = traceback_text
        self.cell_line = cell_line

    def _render_traceback_(self) -> list[str]:
        return [*self.traceback_text.rstrip().splitlines(), str(self)]


def describe_exception(err: BaseException, *, filename: str | None = None,
                       line_offset: int = 0) -> dict[str, Any]:
    """A JSON-able description of ``err``; frames from ``filename`` (the cell) down only.

    Lines of ``filename`` are shown as cell lines, ``line - line_offset`` (the cell's source
    starts with the ``%%distribute`` line, as in the notebook, so the offset is 0).
    """
    frames = traceback.extract_tb(without_nbdist_frames(err.__traceback__))
    cell_line = None
    if filename is not None:
        starts = [i for i, f in enumerate(frames) if f.filename == filename]
        if starts:
            frames = frames[starts[0]:]
            cell_line = max(frames[starts[-1] - starts[0]].lineno - line_offset, 1)
    lines = ["Traceback (most recent call last):\n"] if frames else []
    for frame in frames:
        where = (f"  cell line {max(frame.lineno - line_offset, 1)}"
                 if frame.filename == filename else f'  File "{frame.filename}", line '
                 f"{frame.lineno}")
        lines.append(f"{where}, in {frame.name}\n")
        if frame.line:
            lines.append(f"    {frame.line.strip()}\n")
    message = str(err)
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + " [...]"
    described = {
        "type": type(err).__name__,
        "message": message,
        "traceback": "".join(lines),
        "cell_line": getattr(err, "cell_line", None) or cell_line,
        "nbdist": isinstance(err, NbdistError),
    }
    if type(err).__module__.startswith("tensorflow"):
        return _python_error_inside(str(err), type(err).__name__) or described
    return described


_PY_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?P<body>.*?)\n\s*"
                           r"(?P<type>[A-Za-z_][\w.]*): (?P<message>[^\n]*)", re.S)
_PY_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)\n'
                       r"(?P<text>[^\n]*)")


def _python_error_inside(message: str, tf_type: str) -> dict[str, Any] | None:
    """The user's own exception inside a TensorFlow error: Python code that TensorFlow ran
    for the cell (a ``from_generator`` or ``py_function`` of the input pipeline) raised, and
    TensorFlow reports it as its own error with the Python traceback in its message. The
    frames of the user's cells are kept, shown as cell lines; TensorFlow's are dropped."""
    found = list(_PY_TRACEBACK.finditer(message))
    if not found:
        return None
    inner = found[-1]
    frames = [f for f in _PY_FRAME.finditer(inner["body"])
              if f["file"].startswith("<") or "-packages" not in f["file"]]
    lines = ["Traceback (most recent call last, in the input pipeline):\n"] if frames else []
    for f in frames:
        where = (f"cell line {f['line']} (in {f['file']})" if f["file"].startswith("<nbdist-")
                 else f'File "{f["file"]}", line {f["line"]}')
        lines.append(f"  {where}, in {f['name']}\n    {f['text'].strip()}\n")
    cells = [f for f in frames if f["file"].startswith("<nbdist-")]
    return {
        "type": inner["type"].rsplit(".", 1)[-1],
        "message": (f"{inner['message'][:_MAX_MESSAGE]} (raised by Python code that "
                    f"TensorFlow ran for the cell, e.g. a Dataset.from_generator source; "
                    f"TensorFlow reported it as {tf_type})"),
        "traceback": "".join(lines),
        "cell_line": int(cells[-1]["line"]) if cells else None,
        "nbdist": False,
    }


def _workers(indices: list[int]) -> str:
    return ("worker " if len(indices) == 1 else "workers ") + ", ".join(map(str, indices))


def _root(failures: dict[int, dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    own = {w: f for w, f in failures.items() if f["type"] not in COLLATERAL}
    pool = own or failures
    index = min(pool)
    return index, pool[index]


def _error_class(name: str) -> type[NbdistError] | None:
    cls = getattr(_errors, name, None) or globals().get(name)
    return cls if isinstance(cls, type) and issubclass(cls, NbdistError) else None


def build_error(failures: dict[int, dict[str, Any]], total: int,
                waiting: list[int] = (), ended: bool = False) -> NbdistError:
    """The one error to show for the failures of some of ``total`` workers.

    ``waiting``: workers that were still blocked (waiting for the failed ones) when the kernel
    stopped waiting for them; ``ended``: they were ended, so the workers must be restarted.
    """
    index, root = _root(failures)
    same = sorted(w for w, f in failures.items()
                  if f["type"] == root["type"] and f["message"] == root["message"])
    others = sorted(set(failures) - set(same))
    where = f"[{_workers(same)}]" if len(same) < total else f"[all {total} workers]"
    notes = []
    if root.get("step") is not None:   # a step cell: where in the run it failed
        notes.append(f"raised after step {root['step']}")
    if others:
        kinds = sorted({failures[w]["type"] for w in others})
        notes.append(f"{_workers(others)} then failed with {', '.join(kinds)}"
                     + (" (a consequence: a collective lost its peer)"
                        if set(kinds) <= COLLATERAL else ""))
    if waiting:
        were = "was" if len(waiting) == 1 else "were"
        notes.append(f"{_workers(list(waiting))} waited for it"
                     + (f" in a collective and {were} ended: run `%distribute restart` to start "
                        "fresh workers" if ended else f" and {were} stopped"))
    ok = total - len(failures) - len(waiting)
    if ok:
        notes.append(f"{count(ok, 'other worker')} finished")
    suffix = f" ({'; '.join(notes)})" if notes else ""
    if root["nbdist"]:
        cls = _error_class(root["type"])
        if cls is not None:
            err = cls.__new__(cls)
            Exception.__init__(err, f"{where} {root['message']}{suffix}")
            err.cell_line = root.get("cell_line")
            return err
    return WorkerError(f"{where} {root['type']}: {root['message']}{suffix}",
                       _prefix(root["traceback"], same[0]), root.get("cell_line"))


def _prefix(text: str, worker: int) -> str:
    return "".join(f"[worker {worker}] {line}\n" for line in text.splitlines())


def clean_tf_message(message: str) -> str:
    """TensorFlow's first meaningful line (drop graph tracebacks); the whole text if none."""
    match = re.search(r"\(0\) [A-Z_]+:\s+(.*)", message)
    if match:
        return match.group(1).strip()
    first = message.strip().splitlines()
    return first[0] if first else message


def died_starting(died: WorkerDied, advice: str) -> NbdistError:
    """A worker's process died while the workers were starting (``advice``: how to retry)."""
    who = str(died).split(": ")[0]   # "worker 1 (pid 123) died"
    return ClusterStartError(f"The workers could not start: {who} while starting: its process "
                             f"is gone (killed, or out of memory). Nothing is left running; "
                             f"{advice}.")
