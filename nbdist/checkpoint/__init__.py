"""``--checkpoint DIR``: save the training state after every epoch and resume from it.

Layout of ``DIR`` (one directory per training, so several never overwrite each other)::

    DIR/step/     step mode: ``tf.train.CheckpointManager`` files (``ckpt-<steps done>``)
    DIR/fit1/     scope mode: the first ``model.fit`` of the cell, Keras ``BackupAndRestore``
    DIR/fit2/     ... the second, and so on

Step mode (``step``) saves the *trackable objects the cell names* (``model``, ``optimizer``, any
``tf.Module``, Keras layer/model/optimizer or ``tf.Variable`` in the namespace), also through
the notebook functions the cell calls (their global names, two levels deep), plus two counters:
epochs and steps done. Saving objects rather than a list of variables is what
``tf.train.Checkpoint`` is built for: values are matched by the object graph (``model`` ->
layers -> kernel), so a checkpoint from another model is detected, and variables created
later (an optimizer's slots, built on the first step) are restored when they appear
(TensorFlow's deferred restoration). After the first trace, the variables the compiled step
really captures are compared with the saved ones and any trainable one left out is named in a
note (the cell reaches it through something that is not a name, e.g. ``things["net"]``).

``--checkpoint-every K`` (step mode) also saves every K steps, inside an epoch: before the
step whose number is a multiple of K, once its batch is fetched (so never where the epoch's end
is saved), with the steps done of the epoch as a third counter. A distributed iterator is not
trackable by ``tf.train.Checkpoint`` (TensorFlow 2.21), so a resumed run positions the data as
TensorFlow's ``PreemptionCheckpointHandler`` does with its saved ``total_run_calls``: it skips,
on the epoch's new iterator, the batches already trained on (``data.iterate.skip_batches``).
That is exact when the dataset gives its batches in the same order each time (no unseeded
shuffle). Saves are synchronous, on the loop's thread: TensorFlow's asynchronous checkpoint
(``CheckpointOptions(experimental_enable_async_checkpoint=True)``) copies each variable through
its ``_copy_trackable_to_cpu``, and Keras 3's creates a new ``tf.Variable`` on every copy, which
its copy function (a ``tf.function``) refuses at the second save; and workers must save at the
same step anyway (see below), which a save on the loop's thread gives for free.

Multi-worker: every worker saves (saving may need the workers' collectives), but only the chief
(``strategy.extended.should_checkpoint``, worker 0) writes into ``DIR``; the others write to a
temporary directory that is deleted at once, as TensorFlow's multi-worker guide does
(``write_filepath`` / ``_get_temp_dir`` in tutorials/distribute/multi_worker_with_ctl, and
``distributed_file_utils`` in tf_keras). Every worker restores from ``DIR``, so ``DIR`` must be
on a file system all workers see (always true for local workers). Under ``parameter_server``
the kernel (the coordinator) saves and restores alone: it reads and writes the variables on
the parameter servers, between epochs, once every scheduled step is done (``ps_steps``); a
tf_keras ``fit`` there gets tf_keras' ``BackupAndRestore``, which supports the strategy.

``model.fit`` (``fit``) gets Keras' own ``BackupAndRestore``: tf_keras' has the multi-worker
logic above (it is what runs on workers); Keras 3's (the kernel's ``keras``) has none, and is
used only in the kernel, where there is a single process. Keras 3 keeps the restored epoch on
the model forever (a private attribute), so a later plain ``fit`` would skip epochs: it is
cleared (``hooks.keras.clear_initial_epoch``) as soon as the resumed ``fit`` has read it.

Lifetime: fit follows Keras (the backup is deleted when ``fit`` returns, kept when it raises);
step mode deletes it when every epoch is done and keeps it when the run is interrupted,
stopped or fails, so that re-running the cell resumes.
"""

from __future__ import annotations

import os
import tempfile

from ..errors import CheckpointError
from .fit import FitCheckpoint
from .messages import NOTHING_TRAINED, resume_line
from .step import StepCheckpoint, named_trackables, refuse_checkpoint_every

__all__ = ["NOTHING_TRAINED", "FitCheckpoint", "StepCheckpoint", "check_dir",
           "named_trackables", "prepare_dir", "refuse_checkpoint_every", "resume_line"]


def check_dir(path: str) -> str:
    """``path`` made absolute (workers may run elsewhere); raise if it could not be created
    or written. Creates nothing: ``prepare_dir`` does, once the rest of the cell is checked."""
    full = os.path.abspath(os.path.expanduser(path))
    existing = full
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        _unwritable(path, f"{existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        _unwritable(path, f"{existing} is not writable")
    return full


def prepare_dir(path: str) -> str:
    """``path`` made absolute (workers may run elsewhere) and created; raise if unwritable."""
    full = os.path.abspath(os.path.expanduser(path))
    try:
        os.makedirs(full, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=full, prefix=".nbdist-write-test-"):
            pass
    except OSError as err:
        _unwritable(path, str(err.strerror or err))
    return full


def _unwritable(path: str, why: str) -> None:
    raise CheckpointError(
        f"--checkpoint {path}: nbdist cannot write there ({why}). The training state is saved "
        "into that directory after every epoch: give a directory you can write to (it is "
        "created if missing), e.g. `--checkpoint ckpt/my-run`."
    ) from None
