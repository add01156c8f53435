"""``model.fit`` checkpoints: Keras' own ``BackupAndRestore`` in ``DIR/fit<k>`` for the k-th
fit of a cell, plus a callback that reports a resume (see the package docstring)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import CheckpointError
from ..hooks.keras import clear_initial_epoch
from ..telemetry.run import RunWriter
from .messages import MISMATCH, resume_line


class FitCheckpoint:
    """Adds Keras ``BackupAndRestore(DIR/fit<k>)`` to the k-th ``model.fit`` of a cell."""

    def __init__(self, directory: str, say: Callable[[str], None] | None = None):
        self.directory, self.say, self.fits = directory, say, 0

    def callbacks(self, model: Any, run: Any, fit_kwargs: dict[str, Any]) -> list[Any]:
        """The callbacks for one fit call: restore/backup, then report a resume."""
        self.fits += 1
        where = os.path.join(self.directory, f"fit{self.fits}")
        module = _callbacks_module(model)
        initial = int(fit_kwargs.get("initial_epoch") or 0)
        # the fit's recorder links a resumed Run to the earlier one
        RunWriter(run).update(checkpoint=where)

        def resumed(done: int, total: int | None, steps: int | None) -> None:
            line = resume_line(done, total, where, steps)
            run.note(line.removeprefix("nbdist: "))
            if self.say is not None:
                self.say(line)

        return [_backup(module, where), _reporter(module, initial, resumed)]


def _callbacks_module(model: Any) -> Any:
    """``tf_keras.callbacks`` or ``keras.callbacks``: the Keras ``model`` belongs to."""
    import importlib

    root = type(model).__module__.split(".")[0]
    if root not in ("tf_keras", "keras"):
        roots = [c.__module__.split(".")[0] for c in type(model).__mro__]
        root = "tf_keras" if "tf_keras" in roots else "keras"
    return importlib.import_module(f"{root}.callbacks")


def _backup(module: Any, where: str) -> Any:
    """Keras' BackupAndRestore whose restore errors say what to do."""

    class Backup(module.BackupAndRestore):
        def on_train_begin(self, logs: Any = None) -> None:
            clear_initial_epoch(self.model)   # Keras 3: never a stale value from before
            try:
                super().on_train_begin(logs)
            except Exception as err:
                text = " ".join(str(err).split())
                if "must be built" in text:
                    raise CheckpointError(
                        f"--checkpoint {where}: Keras restores a backup only into a built model, "
                        "and this one has no weights yet. Give it an input shape "
                        "(`keras.Input(shape)` as its first layer) or call it on a batch before "
                        "model.fit."
                    ) from None
                raise CheckpointError(MISMATCH.format(dir=where, why=text[:300])) from None

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            clear_initial_epoch(self.model)   # fit has read it; a later fit must not
            super().on_epoch_begin(epoch, logs)

    return Backup(where)


def _reporter(module: Any, initial: int, resumed: Callable[[int, Any, Any], None]) -> Any:
    """A callback that notices fit starting after ``initial``: Keras restored a backup."""

    class Resumed(module.Callback):
        started = False

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            if not self.started:
                self.started = True
                if epoch > initial:
                    steps = self.params.get("steps")
                    resumed(epoch, self.params.get("epochs"), steps * epoch if steps else None)

        def on_train_end(self, logs: Any = None) -> None:
            epochs = self.params.get("epochs")
            if not self.started and epochs and epochs > initial:   # every epoch was restored
                resumed(epochs, epochs, None)

    return Resumed()
