"""Errors nbdist raises at users.

Every error is one paragraph: what is wrong, then what to do. They render in IPython without
nbdist's own traceback (``_render_traceback_``, the hook IPython and ipyparallel use), so the
user sees the message and, for step code, the line of their cell.
"""

from __future__ import annotations


class NbdistError(Exception):
    """Base class: a problem the user can fix; shown as a short message, not a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class ConfigError(NbdistError):
    """A bad strategy name, flag or flag combination."""


class DeviceError(NbdistError):
    """The requested devices do not exist, or can no longer be created in this process."""


class StepCodeError(NbdistError):
    """A problem in the code of a ``%%distribute --step`` cell, pointing at the cell line."""

    def __init__(self, message: str, *, cell_line: int | None = None, line_text: str = ""):
        self.cell_line = cell_line
        self.line_text = line_text
        self.bare_message = message
        if cell_line is not None:
            where = f"cell line {cell_line}"
            if line_text.strip():
                where += f" `{line_text.strip()}`"
            message = f"{where}: {message}"
        super().__init__(message)


class LossError(StepCodeError):
    """The step's loss cannot be recorded (not a number, or several values where they are
    differentiated); ``step.errormap`` places it at the line assigning it."""


class LossNotScalar(LossError):
    """The step's loss has several values and is differentiated."""


class NonFiniteLoss(StepCodeError):
    """A step's loss was NaN or infinite: the run ends at that step, as Keras' TerminateOnNaN
    ends a fit (the weights may hold NaN already; training on would only spread it)."""


class NoGradients(StepCodeError):
    """The step differentiates variables its loss does not depend on; ``step.errormap`` places it
    at the cell's ``.gradient(...)`` line."""


class DataError(NbdistError):
    """The ``--data`` value is missing, not a dataset, or cannot be split across replicas."""


class CheckpointError(NbdistError):
    """``--checkpoint DIR`` cannot be used: not writable, nothing to save, or a checkpoint
    there that belongs to another training."""


class CompareError(NbdistError):
    """``nbdist.compare`` was given something it cannot draw: no runs, a run without steps, an
    unknown metric or x axis."""


class RunInterrupted(NbdistError):
    """A run stopped early (kernel interrupt or Stop button); its partial Run is kept."""


class ExportError(NbdistError):
    """``%distribute export`` cannot write the script: a cell it needs cannot be placed in it,
    or the file exists."""


class KnownTensorFlowError(NbdistError):
    """TensorFlow's own error for a mistake nbdist knows the change for (``step.errormap``): the
    change first, then TensorFlow's text unchanged; the error itself is its ``__cause__``."""

    def __init__(self, advice: str, error: BaseException):
        self.advice = advice
        super().__init__(f"{advice}\n\nTensorFlow's error, {type(error).__name__}: "
                         f"{str(error).strip()}")


class NbdistWarning(UserWarning):
    """Code that runs but not as its author likely meant (a Python side effect in a compiled
    step runs once, while TensorFlow traces it). Shown once, as Python shows warnings."""
