"""An error in a worker's input pipeline under parameter_server, as the user's line.

TensorFlow reports it as the step's own error, with gRPC's details ("Graph execution error:
... StringToNumberOp could not correctly convert string ... [[{{node StringToNumber}}]]
[[MultiDeviceIteratorGetNextFromShard]] ... Additional GRPC error information from remote
target /job:worker/replica:0/task:1 ... [Op:__inference_train_step_669]") and without a Python
stack for the dataset's operations ("<stack traces unavailable>": they were traced in this
kernel, by the dataset function, and ran on the worker). ``input_error`` turns it into one
paragraph: the worker (from the remote target), its steps, the cause, and the line of the
dataset function that made the failing operation (the operation's name matched against the
function's source, else the function's ``def`` line).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

from ..failures import WorkerError

#: What the step's error says when the failing operation is part of the input pipeline.
_INPUT_MARKS = ("MultiDeviceIteratorGetNextFromShard", "IteratorGetNext")
_TASK = re.compile(r"remote target /job:worker/replica:\d+/task:(\d+)")
_NODE = re.compile(r"\[\[\{\{node ([^}]+)\}\}\]\]")
_ROOT_ERRORS = re.compile(r"\d+ root error\(s\) found\.?$")
_ROOT_ERROR = re.compile(r"^\(\d+\) [A-Z_]+:\s*")
_NOISE = ("Graph execution error", "Detected at node", "<stack traces unavailable>", "[[",
          "Additional GRPC error", ":UNKNOWN:")


def input_error(err: BaseException, data: str | None, value: Any,
                describe: Callable[[int], str], steps_of: Callable[[int], int],
                steps_done: int) -> WorkerError | None:
    """The error to show for ``err``, a step's error raised by a worker's input pipeline
    (``data``: the --data name, ``value``: what it names), or None if it is not one."""
    message = str(err)
    if not any(mark in message for mark in _INPUT_MARKS):
        return None
    task = _TASK.search(message)
    worker = int(task.group(1)) if task else None
    nodes = _NODE.findall(message)
    node = nodes[0].rsplit("/", 1)[-1] if nodes else None
    cause = _cause(message)
    found = _line_of(value, node)
    who = describe(worker) if worker is not None else "a worker"
    at = (f"after its step {steps_of(worker)} (the run's step {steps_done})"
          if worker is not None else f"after the run's step {steps_done}")
    text = (f"{who}: its input (--data {data}) failed {at}: {type(err).__name__}: {cause}"
            + (f" (TensorFlow operation {node})" if node else ""))
    traceback_text, line = "", None
    if found is not None:
        line, name, code = found
        text += f", made at cell line {line} of the cell that defines {name}: {code}"
        prefix = f"[worker {worker}] " if worker is not None else ""
        traceback_text = f"{prefix}cell line {line}, in {name}\n{prefix}    {code}\n"
    text += (". The steps before it are kept in nbdist.runs[-1] and the cluster is still "
             "usable: fix the data or the dataset function, then run the cell again.")
    return WorkerError(text, traceback_text, line)


def _cause(message: str) -> str:
    """The line that states the problem, without TensorFlow's and gRPC's framing (also when
    several steps failed at once: "2 root error(s) found.", then "(0) INVALID_ARGUMENT: ...")."""
    for raw in message.splitlines():
        line = _ROOT_ERROR.sub("", raw.strip())
        if line and not line.startswith(_NOISE) and not _ROOT_ERRORS.match(line):
            return line
    return message.strip().splitlines()[0] if message.strip() else ""


def _line_of(value: Any, node: str | None) -> tuple[int, str, str] | None:
    """(line, function name, code) in the dataset function ``value`` of the operation named
    ``node`` ("StringToNumber" is found in ``tf.strings.to_number(...)``), or of its ``def``."""
    fn = getattr(value, "python_function", value)   # a tf.function: the Python inside
    if not inspect.isfunction(fn):
        return None
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    first = max(first, 1)
    words = re.findall(r"[A-Z][a-z0-9]*", node or "")
    # the longest tail of the operation's name found in a line: StringToNumber, ToNumber
    for size in range(len(words), 1, -1):
        wanted = "".join(words[-size:]).lower()
        for offset, code in enumerate(lines):
            if wanted in re.sub(r"[_.\s]", "", code.lower()):
                return first + offset, fn.__name__, code.strip()
    return first, fn.__name__, lines[0].strip()
