"""Turn TensorFlow errors raised by a compiled step into errors that name the user's cell line.

TensorFlow reports both graph-building errors ("in user code: File ..., line N") and runtime
errors ("Detected at node X defined at (most recent call last): File ..., line N") with the
Python frames that created the failing op. Frames in the generated step file are mapped back to
the cell through ``StepSource.cell_line``.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import os
import re
import types
from typing import Any

from ..errors import KnownTensorFlowError, LossError, NbdistError, NoGradients, StepCodeError
from .rewrite import StepSource, assigned_line

_VARIABLE_ON_EVERY_CALL = "tf.function only supports singleton tf.Variables"
# A variable created in a step that is traced without being called (get_concrete_function)
# fails later, when TensorFlow lifts its initializer out of the graph, naming no cell line.
_UNLIFTABLE_INITIALIZER = re.compile(
    r"Unable to lift tensor <tf\.Tensor '([^':]+/Initializer/[^':]*)")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep   # nbdist/


def is_nbdist_file(filename: str) -> bool:
    """Whether ``filename`` is one of nbdist's own modules."""
    return os.path.abspath(filename).startswith(_PACKAGE)


def without_nbdist_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without nbdist's own frames, so a cell's error shows the user's frames (and
    the libraries' they called), not the magic's machinery around them. Unchanged when the
    error was raised by nbdist itself (its innermost frame is nbdist's: a bug to report)."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    if not frames or is_nbdist_file(frames[-1].tb_frame.f_code.co_filename):
        return frames[0] if frames else None
    out = None
    for frame in reversed(frames):
        if not is_nbdist_file(frame.tb_frame.f_code.co_filename):
            out = types.TracebackType(out, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    return out


def cell_line_of(message: str, source: StepSource) -> int | None:
    """The cell line of the innermost frame of ``source`` in the first traceback of ``message``."""
    first_block = message.split("Detected at node", 2)
    text = first_block[1] if len(first_block) > 1 else message
    # AutoGraph names the file it first converted the step's code from: an earlier cell's,
    # when a cell of the same code ran before (with another --data or --steps-per-call)
    own = linecache.getlines(source.filename)
    lines = []
    for m in re.finditer(r'File "(<[^"]+>)", line (\d+)', text):
        line, other = int(m.group(2)), linecache.getlines(m.group(1))
        same = len(other) == len(own) and 0 < line <= len(own) and other[line - 1] == own[line - 1]
        if m.group(1) == source.filename or same:
            lines.append(line)
    for generated in reversed(lines):
        line = source.cell_line(generated)
        if line is not None:
            return line
    return None


def _root_message(message: str) -> str:
    """The first line that states the actual problem, without TensorFlow's graph noise."""
    match = re.search(r"\(0\) [A-Z_]+:\s+(.*)", message)
    if match:
        return match.group(1).strip()
    for line in reversed(message.strip().splitlines()):
        line = line.strip()
        if re.match(r"^[A-Za-z]*Error: ", line):
            return line.split(": ", 1)[1]
    return message.strip().splitlines()[-1] if message.strip() else ""


class VariableSites:
    """Where a step creates variables while it is traced: the cell line behind each (from the
    traceback TensorFlow keeps for the graph operations the creation made), however the cell
    made it: ``tf.Variable(...)``, a helper function it calls or a library object. TensorFlow's
    error for such a variable, when a step traced without a call lifts its initializer, names
    only those operations; ``line_of`` finds the line from them."""

    def __init__(self, source: StepSource):
        self.source = source
        self.sites: list[tuple[frozenset[str], int]] = []   # (operations made, cell line)

    def recording(self) -> contextlib.AbstractContextManager[Any]:
        import tensorflow as tf

        return tf.variable_creator_scope(self._creator)

    def _creator(self, next_creator: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()   # the step's graph while it is traced
        before = len(graph.get_operations())
        variable = next_creator(**kwargs)
        made = graph.get_operations()[before:]
        line = self._cell_line(made[-1].traceback) if made else None
        if line is not None:
            self.sites.append((frozenset(op.name for op in made), line))
        return variable

    def _cell_line(self, frames: Any) -> int | None:
        """The cell line of the innermost frame of the step's generated code. AutoGraph maps
        its frames back to the file it first converted that code from, which is another
        cell's when an identical cell ran before: a file with the same text counts."""
        own = linecache.getlines(self.source.filename)
        for frame in reversed(list(frames)):
            if frame.filename == self.source.filename or (
                    frame.filename.startswith("<") and linecache.getlines(frame.filename) == own):
                return self.source.cell_line(frame.lineno)
        return None

    def line_of(self, message: str) -> int | None:
        """The cell line that created the variable TensorFlow could not lift in ``message``."""
        match = _UNLIFTABLE_INITIALIZER.search(message)
        if match is None or not self.sites:
            return None
        return next((line for ops, line in self.sites if match.group(1) in ops),
                    self.sites[-1][1])


def to_cell_error(err: BaseException, source: StepSource,
                  sites: VariableSites | None = None,
                  batch_spec: Any = None) -> NbdistError | None:
    """A StepCodeError pointing at the cell line behind ``err``, or None if none is found
    (``sites``: where tracing the step created variables; ``batch_spec``: the ``--data``
    dataset's ``element_spec``, for errors that come from using ``batch`` as another
    structure than it has).

    An NbdistError raised by nbdist's own code while tracing comes back wrapped by AutoGraph
    (a StagingError whose context is ours); it is returned unwrapped.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, LossError) and seen.cell_line is None:
            line = assigned_line(source.cell, source.loss)
            return type(seen)(seen.bare_message, cell_line=line,
                              line_text=_cell_text(source, line) if line else "")
        if isinstance(seen, NoGradients) and seen.cell_line is None:
            line = _gradient_line(source.cell)
            return NoGradients(seen.bare_message, cell_line=line,
                               line_text=_cell_text(source, line) if line else "")
        if isinstance(seen, NbdistError):
            return seen
        seen = seen.__cause__ or seen.__context__
    message = str(err)
    line = cell_line_of(message, source)
    if line is None and sites is not None:   # a variable created in a step traced without a call
        line = sites.line_of(message)
        message = _VARIABLE_ON_EVERY_CALL if line else message
    if line is None:
        return None
    text = _cell_text(source, line)
    batch = batch_advice(message, source, line, batch_spec)
    if batch is not None:
        return batch
    if _VARIABLE_ON_EVERY_CALL in message:
        return StepCodeError(
            "the step creates a tf.Variable, and a compiled step may not create variables "
            "each time it runs. Create variables (models, metrics, counters) in a scope-mode "
            "`%%distribute` cell and use them in the step.",
            cell_line=line, line_text=text,
        )
    return StepCodeError(
        f"{type(err).__name__} while running the step: {_root_message(message)}",
        cell_line=line, line_text=text,
    )


def _cell_text(source: StepSource, line: int) -> str:
    lines = source.cell.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _gradient_line(cell: str) -> int | None:
    """The cell line of the first ``.gradient(...)`` call (where gradients are taken)."""
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return None
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "gradient"]
    return min(lines, default=None)


_ITERATING_TENSOR = "Iterating over a symbolic `tf.Tensor` is not allowed"


def describe_structure(spec: Any) -> str:
    """A dataset's ``element_spec`` as a sentence names it: a single tensor, a tuple of N, or
    a dict with its keys."""
    if isinstance(spec, dict):
        return f"a dict with keys {', '.join(repr(k) for k in spec)}"
    if isinstance(spec, tuple):
        return f"a tuple of {len(spec)}"
    return "a single tensor"


def batch_advice(message: str, source: StepSource, line: int,
                 batch_spec: Any) -> StepCodeError | None:
    """A clearer error when ``message`` comes from using ``batch`` as a structure it does not
    have (the dataset's ``batch_spec``): unpacking a single tensor or a dict, a missing key.
    None: nothing to add."""
    if batch_spec is None:
        return None
    where = f"(the --data dataset's element_spec: {batch_spec})"
    unpacked = _unpacks_batch(source.cell)
    if _ITERATING_TENSOR in message and not isinstance(batch_spec, (dict, tuple)):
        at = unpacked or line
        return StepCodeError(
            f"`batch` is a single tensor here, not a tuple to unpack {where}. Use it as one "
            "(`x = batch`), or make the dataset yield pairs: "
            "`tf.data.Dataset.from_tensor_slices((features, labels))`.",
            cell_line=at, line_text=_cell_text(source, at))
    if isinstance(batch_spec, dict):
        keys = ", ".join(repr(k) for k in batch_spec)
        picks = ", ".join(f"batch[{k!r}]" for k in list(batch_spec)[:2])
        if unpacked is not None:
            return StepCodeError(
                f"`batch` is a dict with keys {keys} {where}: unpacking it gives its keys, "
                f"not its tensors. Take them by key: `{picks}`.",
                cell_line=unpacked, line_text=_cell_text(source, unpacked))
        root = _root_message(message).strip()
        missing = re.search(r"""^['"]([^'"]+)['"]$""", root)
        text = _cell_text(source, line).replace(" ", "")
        if missing and missing.group(1) not in batch_spec and "batch[" in text:
            return StepCodeError(
                f"`batch` has no key {missing.group(1)!r}: its keys are {keys} {where}.",
                cell_line=line, line_text=_cell_text(source, line))
        if re.fullmatch(r"-?\d+", root) and f"batch[{root}]" in text:
            return StepCodeError(
                f"`batch` is a dict with keys {keys} {where}: it has no item {root}; take its "
                f"tensors by key, not by position: `{picks}`.",
                cell_line=line, line_text=_cell_text(source, line))
    if isinstance(batch_spec, tuple) and "indices must be integers" in message \
            and re.search(r"batch\[['\"]", _cell_text(source, line)):
        return StepCodeError(
            f"`batch` is a tuple of {len(batch_spec)} {where}, not a dict: take its parts by "
            f"position, `{', '.join(f'batch[{i}]' for i in range(min(len(batch_spec), 2)))}`, "
            "or unpack it: `x, y = batch`.",
            cell_line=line, line_text=_cell_text(source, line))
    return None


def _unpacks_batch(cell: str) -> int | None:
    """The cell line that unpacks ``batch`` into several names (``x, y = batch``), if any."""
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
                and node.value.id == "batch"
                and any(isinstance(t, (ast.Tuple, ast.List)) for t in node.targets)):
            return node.lineno
    return None


# -- TensorFlow's errors for mistakes of code pasted from its guides and Keras' -------------------
_OUTSIDE_REPLICA = re.compile(r"DistributedVariable\.handle is not available outside the "
                              r"replica context")
# a replica's empty slice of a batch smaller than the replicas: its results cannot be added up
# (Keras 3's fit/evaluate), or its first example read (tensorflow/tensorflow#58809)
_EMPTY_REPLICA = re.compile(r"Inputs to operation AddN of type AddN must have the same size and "
                            r"shape\.\s+Input \d+: \[[^\]]*\] != input \d+: \[0\b"
                            r"|slice index 0 of dimension 0 out of bounds")
# a layer updating its state (BatchNormalization's statistics) when the model is called in
# training mode outside strategy.run (tensorflow/tensorflow#29481, #39270)
_UPDATE_OUTSIDE_REPLICA = re.compile(r"`add_update` was called in a cross-replica context")


def tensorflow_advice(err: BaseException, replicas: int | None = None) -> str | None:
    """The one change for TensorFlow's own ``err`` when it comes from a mistake users make
    with a strategy's objects (None: nbdist knows none). ``replicas``: the session's."""
    message = str(err)
    if _OUTSIDE_REPLICA.search(message):
        return (
            "The cell updates a distributed model's variables outside `strategy.run` (an "
            "optimizer's `apply` or `apply_gradients` in a plain Python loop over the dataset, "
            "as keras.io's and TensorFlow's custom training loops do before they wrap the step "
            "in `strategy.run`): TensorFlow allows it only inside each replica's step. Make the "
            "loop's body a step cell, `%%distribute --step --data train_ds` on its first line "
            "and `x, y = batch` for the loop's unpacking: nbdist loops over the dataset and "
            "runs the body on every replica under `strategy.run`.")
    if _UPDATE_OUTSIDE_REPLICA.search(message):
        return (
            "The cell calls the model in training mode outside `strategy.run`, where a layer "
            "that updates its state (BatchNormalization's moving statistics) cannot: train in "
            "a step cell (`%%distribute --step --data train_ds`, which runs the call on every "
            "replica) or with `model.fit`, and call the model with `training=False` (or "
            "`model.predict`) to only compute its outputs.")
    if _EMPTY_REPLICA.search(message):
        have = f"the {replicas} replicas" if replicas else "the replicas"
        return (
            f"A batch had fewer examples than {have}, so a replica got an empty slice "
            "(`[0, ...]` below) and TensorFlow cannot add up the replicas' results: give "
            "`fit`, `evaluate` and `predict` batches of at least "
            f"{replicas or 'as many examples as replicas'}"
            + (" examples" if replicas else "")
            + " (`batch_size=`, or `dataset.batch(...)` with a multiple of the replicas), and "
            "drop a smaller last batch: `dataset.batch(BATCH, drop_remainder=True)`; to run "
            "one example, call the model in a plain cell instead: `model(x[:1])`.")
    return None


def with_tensorflow_advice(err: BaseException, replicas: int | None = None) -> BaseException:
    """``err``, or a KnownTensorFlowError that says the change before its text."""
    if isinstance(err, NbdistError):
        return err
    advice = tensorflow_advice(err, replicas)
    return err if advice is None else KnownTensorFlowError(advice, err)
