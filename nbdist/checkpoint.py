"""``--checkpoint DIR``: save the training state after every epoch and resume from it.

Layout of ``DIR`` (one directory per training, so several never overwrite each other)::

    DIR/step/     step mode: ``tf.train.CheckpointManager`` files (``ckpt-<epochs done>``)
    DIR/fit1/     scope mode: the first ``model.fit`` of the cell, Keras ``BackupAndRestore``
    DIR/fit2/     ... the second, and so on

Step mode saves the *trackable objects the cell names* (``model``, ``optimizer``, any
``tf.Module``, Keras layer/model/optimizer or ``tf.Variable`` in the namespace), also through
the notebook functions the cell calls (their global names, two levels deep), plus two counters:
epochs and steps done. Saving objects rather than a list of variables is what
``tf.train.Checkpoint`` is built for: values are matched by the object graph (``model`` ->
layers -> kernel), so a checkpoint from another model is detected, and variables created
later (an optimizer's slots, built on the first step) are restored when they appear
(TensorFlow's deferred restoration). After the first trace, the variables the compiled step
really captures are compared with the saved ones and any trainable one left out is named in a
note (the cell reaches it through something that is not a name, e.g. ``things["net"]``).

Multi-worker: every worker saves (saving may need the workers' collectives), but only the chief
(``strategy.extended.should_checkpoint``, worker 0) writes into ``DIR``; the others write to a
temporary directory that is deleted at once, as TensorFlow's multi-worker guide does
(``write_filepath`` / ``_get_temp_dir`` in tutorials/distribute/multi_worker_with_ctl, and
``distributed_file_utils`` in tf_keras). Every worker restores from ``DIR``, so ``DIR`` must be
on a file system all workers see (always true for local workers). Under ``parameter_server``
the kernel (the coordinator) saves and restores alone: it reads and writes the variables on
the parameter servers, between epochs, once every scheduled step is done (``ps_steps``); a
tf_keras ``fit`` there gets tf_keras' ``BackupAndRestore``, which supports the strategy.

``model.fit`` gets Keras' own ``BackupAndRestore``: tf_keras' has the multi-worker logic above
(it is what runs on workers); Keras 3's (the kernel's ``keras``) has none, and is used only in
the kernel, where there is a single process. Keras 3 keeps the restored epoch on the model
forever (a private attribute), so a later plain ``fit`` would skip epochs: it is cleared
(``hooks.keras.clear_initial_epoch``) as soon as the resumed ``fit`` has read it.

Lifetime: fit follows Keras (the backup is deleted when ``fit`` returns, kept when it raises);
step mode deletes it when every epoch is done and keeps it when the run is interrupted,
stopped or fails, so that re-running the cell resumes.
"""

from __future__ import annotations

import ast
import os
import shutil
import tempfile
import types
from collections.abc import Callable
from typing import Any

from .errors import CheckpointError
from .hooks.keras import clear_initial_epoch, wrapped_variable
from .hooks.tensorflow import trackable_class

NOTHING_TRAINED = (
    "nbdist: --checkpoint {dir}: this cell called no model.fit, so nothing was saved. "
    "--checkpoint saves model.fit training in scope mode and the model/optimizer of a step "
    "cell (`%%distribute --step`)."
)
_MISMATCH = (
    "--checkpoint {dir}: the checkpoint there does not fit this training ({why}). It was "
    "saved by a different model, optimizer or cell. Use another --checkpoint directory for "
    "this training, or delete {dir} to start from scratch."
)


def prepare_dir(path: str) -> str:
    """``path`` made absolute (workers may run elsewhere) and created; raise if unwritable."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(full, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=full, prefix=".nbdist-write-test-"):
            pass
    except OSError as err:
        raise CheckpointError(
            f"--checkpoint {path}: nbdist cannot write there ({err.strerror or err}). The "
            "training state is saved into that directory after every epoch: give a directory "
            "you can write to (it is created if missing), e.g. `--checkpoint ckpt/my-run`."
        ) from None
    return full


def resume_line(done: int, total: int | None, where: str, steps: int | None) -> str:
    """The one line telling the user a run resumed."""
    of = f" of {total}" if total else ""
    if total is not None and done >= total:
        return (f"nbdist: resumed from epoch {done}{of} in {where}: every epoch was already "
                "done, nothing left to train.")
    ran = f", {steps} steps" if steps else ""
    return (f"nbdist: resumed from epoch {done}{of} in {where} ({done} epoch(s){ran} restored; "
            f"training goes on with epoch {done + 1}).")


def _is_chief(strategy: Any) -> bool:
    return bool(getattr(strategy.extended, "should_checkpoint", True))


# -- step mode --------------------------------------------------------------------------------
def _names_used(code: str) -> tuple[list[str], set[str]]:
    """Names the code reads (in order) and names it assigns (the step's locals)."""
    read: list[str] = []
    stored: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                read.append(node.id)
            else:
                stored.add(node.id)
    return list(dict.fromkeys(read)), stored


def _saveable(value: Any) -> bool:
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return True
    excluded = (tf.data.Dataset, tf.distribute.Strategy, tf.types.experimental.GenericFunction,
                types.ModuleType, type)
    return (isinstance(value, trackable_class())
            and not isinstance(value, excluded)
            and (hasattr(value, "variables") or hasattr(value, "assign")))   # or a Keras 3 Variable


def named_trackables(cell: str, user_ns: dict[str, Any], depth: int = 2) -> dict[str, Any]:
    """The saveable objects a step cell reaches by name, directly or through functions."""
    read, stored = _names_used(cell)
    found: dict[str, Any] = {}
    seen: set[int] = set()

    def visit(names: list[str], namespace: dict[str, Any], level: int) -> None:
        for name in names:
            value = namespace.get(name)
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            if _saveable(value):
                found.setdefault(name, value)
            elif isinstance(value, types.FunctionType) and level > 0:
                visit(list(value.__code__.co_names), value.__globals__, level - 1)

    visit([n for n in read if n not in stored and n != "batch"], user_ns, depth)
    return found


def _variable_ids(variables: Any) -> set[int]:
    """ids of variables and of what they wrap (Keras 3 variables, per-replica components)."""
    out: set[int] = set()
    todo = list(variables)
    while todo:
        v = todo.pop()
        if id(v) in out:
            continue
        out.add(id(v))
        inner = wrapped_variable(v)   # a Keras 3 Variable wraps a tf.Variable
        todo += [inner] if inner is not None else []
        todo += list(getattr(v, "values", None) or ())   # Mirrored/DistributedVariable
    return out


class StepCheckpoint:
    """Epoch checkpoints of a step-mode run (used by ``runner.StepRunner``)."""

    def __init__(self, directory: str, strategy: Any, objects: dict[str, Any],
                 say: Callable[[str], None] | None = None):
        if not objects:
            raise CheckpointError(
                f"--checkpoint {directory}: the cell names nothing to save: no Keras model or "
                "optimizer, tf.Module or tf.Variable in the notebook is used by it (or by a "
                "function it calls). --checkpoint saves the objects the step trains, e.g. "
                "`model` and `optimizer`: refer to them by their names in the cell, or drop "
                "--checkpoint."
            )
        import tensorflow as tf

        self.directory = os.path.join(directory, "step")
        self.strategy, self.objects, self.say = strategy, objects, say
        self.chief = _is_chief(strategy)
        self._pending_note: str | None = None
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="nbdist_epochs_done")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="nbdist_steps_done")
        self.checkpoint = tf.train.Checkpoint(**objects, nbdist_epochs_done=self.epoch,
                                              nbdist_steps_done=self.step)

    @classmethod
    def for_cell(cls, directory: str, strategy: Any, cell: str, user_ns: dict[str, Any],
                 say: Callable[[str], None] | None = None) -> StepCheckpoint:
        return cls(directory, strategy, named_trackables(cell, user_ns), say)

    def restore(self, epochs: int, run: Any) -> tuple[int, int]:
        """Load the latest checkpoint, if any: (epochs done, steps done)."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            run.note(f"checkpointed each epoch into {self.directory} "
                     f"({', '.join(sorted(self.objects))})")
            return 0, 0
        try:
            status = self.checkpoint.restore(latest)
            status.expect_partial()   # optimizer slots are restored when they are built
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            why = " ".join(str(err).split())[:300]
            raise CheckpointError(_MISMATCH.format(dir=self.directory, why=why)) from None
        done, steps = int(self.epoch.numpy()), int(self.step.numpy())
        line = resume_line(done, epochs, self.directory, steps)
        saved = ", ".join(sorted(self.objects))
        run.note(f"{line.removeprefix('nbdist: ')} Checkpointed objects: {saved}.")
        if self.say is not None:
            self.say(line)
        return done, steps

    def save(self, epochs_done: int, steps_done: int) -> None:
        """After an epoch: every worker saves; only the chief's copy is kept."""
        self.epoch.assign(epochs_done)
        self.step.assign(steps_done)
        import tensorflow as tf

        if self.chief:
            manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=1)
            manager.save(checkpoint_number=epochs_done)
            return
        scratch = tempfile.mkdtemp(prefix="nbdist-ckpt-worker-")
        try:
            tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def complete(self) -> None:
        """Every epoch is done: the backup is no longer needed (the chief deletes it)."""
        if self.chief:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- RunObserver: check what the compiled step captures ---------------------------------
    def on_traced(self, tf_function: Any, batch: Any, timed: bool) -> None:
        if timed:
            return
        captured = tf_function.get_concrete_function(batch).trainable_variables
        saved = _variable_ids(v for obj in self.objects.values() for v in _variables(obj))
        missing = sorted({v.name for v in captured if id(v) not in saved})
        if missing:
            text = (f"--checkpoint does not save {len(missing)} trainable variable(s) the step "
                    f"uses ({', '.join(missing[:5])}{'...' if len(missing) > 5 else ''}): the "
                    "cell reaches them through something that is not a plain name. Name their "
                    "model or layer in the cell so that they are saved.")
            self._pending_note = text
            if self.say is not None:
                self.say(f"nbdist: warning: {text}")

    def on_step(self, run: Any) -> None:
        if self._pending_note:
            run.note(self._pending_note)
            self._pending_note = None

    def should_stop(self) -> bool:
        return False


def _variables(obj: Any) -> list[Any]:
    variables = getattr(obj, "variables", None)
    if callable(variables):   # legacy optimizers: a method
        variables = variables()
    return list(variables or ()) if not hasattr(obj, "numpy") else [obj]


# -- model.fit --------------------------------------------------------------------------------
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
                raise CheckpointError(_MISMATCH.format(dir=where, why=text[:300])) from None

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
