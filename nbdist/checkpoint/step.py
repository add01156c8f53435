"""Step mode's epoch checkpoints: the objects the cell names, saved with
``tf.train.CheckpointManager`` in ``DIR/step`` (see the package docstring)."""

from __future__ import annotations

import os
import shutil
import tempfile
import types
from collections.abc import Callable
from typing import Any

from ..cellnames import code_names, loads_and_stores
from ..errors import CheckpointError, ConfigError
from ..hooks.keras import wrapped_variable
from ..hooks.tensorflow import trackable_class
from ..telemetry.run import RunObserver, RunWriter
from ..words import count
from .messages import MISMATCH, resume_line


def _is_chief(strategy: Any) -> bool:
    return bool(getattr(strategy.extended, "should_checkpoint", True))


def _saveable(value: Any) -> bool:
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return True
    excluded = (tf.data.Dataset, tf.distribute.Strategy, tf.types.experimental.GenericFunction,
                types.ModuleType, type)
    return (isinstance(value, trackable_class())
            and not isinstance(value, excluded)
            and (_has(value, "variables") or _has(value, "assign")))   # or a Keras 3 Variable


def _has(value: Any, name: str) -> bool:
    try:
        return hasattr(value, name)
    except ValueError:   # a tf_keras model not built yet: its `variables` property raises
        return hasattr(type(value), name)


def named_trackables(cell: str, user_ns: dict[str, Any], depth: int = 2) -> dict[str, Any]:
    """The saveable objects a step cell reaches by name, directly or through functions."""
    read, stored = loads_and_stores(cell)
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
                visit(code_names(value.__code__, nested=False), value.__globals__,
                      level - 1)

    visit([n for n in read if n not in stored and n != "batch"], user_ns, depth)
    return found


def _handle_id(variable: Any) -> int | None:
    """id of a variable's resource handle (``tf.Variable.handle``): one per variable, shared
    by the wrappers ParameterServerStrategy puts around it, whose own ids differ from the
    variable a compiled step captures. None when it has none here (a mirrored variable
    outside a replica context)."""
    try:
        handle = variable.handle
    except (AttributeError, ValueError, TypeError):
        return None
    return id(handle) if handle is not None else None


def _variable_ids(variables: Any) -> set[int]:
    """ids of variables, of what they wrap (Keras 3 variables, per-replica components, the
    shards of a ShardedVariable) and of their resource handles."""
    out: set[int] = set()
    todo = list(variables)
    seen: set[int] = set()
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        out |= {id(v), _handle_id(v)} - {None}
        inner = wrapped_variable(v)   # a Keras 3 Variable wraps a tf.Variable
        todo += [inner] if inner is not None else []
        todo += list(getattr(v, "values", None) or ())   # Mirrored/DistributedVariable
        shards = getattr(v, "variables", None)            # ShardedVariable
        todo += list(shards) if isinstance(shards, (list, tuple)) else []
    return out


def refuse_checkpoint_every(spec: Any, family: str) -> None:
    """For a family that cannot put each worker's data back where a step inside an epoch
    left it (parameter_server): refuse ``--checkpoint-every`` before anything runs rather
    than resume with batches skipped or repeated."""
    if spec.checkpoint_every is not None:
        raise ConfigError(
            f"--checkpoint-every {spec.checkpoint_every} saves inside an epoch and resumes "
            f"there by skipping the batches already trained on, but under {family} each "
            "worker reads its own dataset and which worker ran a step is not known, so that "
            "position cannot be restored. Drop --checkpoint-every here (--checkpoint saves "
            "after every epoch); it applies to the strategies whose replicas take their "
            "batches in step: one_device, mirrored, central_storage, multiworker.")


class StepCheckpoint(RunObserver):
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
        # steps done of the epoch under way (--checkpoint-every): a distributed iterator is not
        # trackable, so a resumed run skips that many batches of the epoch, as TensorFlow's
        # PreemptionCheckpointHandler skips its saved total_run_calls
        self.into_epoch = tf.Variable(0, dtype=tf.int64, trainable=False,
                                      name="nbdist_epoch_steps_done")
        self.checkpoint = tf.train.Checkpoint(**objects, nbdist_epochs_done=self.epoch,
                                              nbdist_steps_done=self.step,
                                              nbdist_epoch_steps_done=self.into_epoch)
        self.skip = 0   # after ``restore``: the batches of the first epoch already trained on
        self._manager: Any = None

    @classmethod
    def for_cell(cls, directory: str, strategy: Any, cell: str, user_ns: dict[str, Any],
                 say: Callable[[str], None] | None = None) -> StepCheckpoint:
        return cls(directory, strategy, named_trackables(cell, user_ns), say)

    def restore(self, epochs: int, run: Any, every: int | None = None) -> tuple[int, int]:
        """Load the latest checkpoint, if any: (epochs done, steps done); ``skip`` then says
        how many batches of the next epoch were trained on. ``every``: --checkpoint-every."""
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            RunWriter(run).checkpointed(self.directory, 0)
            also = f" and every {count(every, 'step')}" if every else ""
            run.note(f"checkpointed each epoch{also} into {self.directory} "
                     f"({', '.join(sorted(self.objects))})")
            return 0, 0
        try:
            status = self.checkpoint.restore(latest)
            status.expect_partial()   # optimizer slots are restored when they are built
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            why = " ".join(str(err).split())[:300]
            raise CheckpointError(MISMATCH.format(dir=self.directory, why=why)) from None
        done, steps = int(self.epoch.numpy()), int(self.step.numpy())
        self.skip = int(self.into_epoch.numpy())
        RunWriter(run).checkpointed(self.directory, steps)   # its curves continue the last run's
        line = resume_line(done, epochs, self.directory, steps, self.skip)
        saved = ", ".join(sorted(self.objects))
        run.note(f"{line.removeprefix('nbdist: ')} Checkpointed objects: {saved}.")
        if self.say is not None:
            self.say(line)
        return done, steps

    def save(self, epochs_done: int, steps_done: int, into_epoch: int = 0) -> None:
        """After an epoch, or ``into_epoch`` steps into the next one (--checkpoint-every):
        every worker saves, on the loop's thread (see the package docstring); only the
        chief's copy is kept, as ``ckpt-<steps done>``."""
        self.epoch.assign(epochs_done)
        self.step.assign(steps_done)
        self.into_epoch.assign(into_epoch)
        import tensorflow as tf

        if self.chief:
            if self._manager is None:
                self._manager = tf.train.CheckpointManager(self.checkpoint, self.directory,
                                                           max_to_keep=1)
            self._manager.save(checkpoint_number=steps_done)
            return
        scratch = tempfile.mkdtemp(prefix="nbdist-ckpt-worker-")
        try:
            tf.train.CheckpointManager(self.checkpoint, scratch, max_to_keep=1).save()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def kept(self) -> str:
        """What the directory holds for a next run, as a sentence's end (for errors)."""
        done, steps, into = (int(v.numpy()) for v in (self.epoch, self.step, self.into_epoch))
        if into:
            return f"the weights after step {steps} (epoch {done + 1})"
        return f"the weights after epoch {done}" if done else ""

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
        missing = sorted({v.name for v in captured
                          if id(v) not in saved and _handle_id(v) not in saved})
        if missing:
            text = (f"--checkpoint does not save {count(len(missing), 'trainable variable')} "
                    f"the step uses ({', '.join(missing[:5])}"
                    f"{'...' if len(missing) > 5 else ''}): the cell reaches them through "
                    "something that is not a plain name. Name their "
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
