"""What ``--checkpoint`` tells the user: the resume line and the errors both modes share."""

from __future__ import annotations

from ..words import count

NOTHING_TRAINED = (
    "nbdist: --checkpoint {dir}: this cell called no model.fit, so nothing was saved. "
    "--checkpoint saves model.fit training in scope mode and the model/optimizer of a step "
    "cell (`%%distribute --step`)."
)
MISMATCH = (
    "--checkpoint {dir}: the checkpoint there does not fit this training ({why}). It was "
    "saved by a different model, optimizer or cell. Use another --checkpoint directory for "
    "this training, or delete {dir} to start from scratch."
)


def resume_line(done: int, total: int | None, where: str, steps: int | None,
                skipped: int = 0) -> str:
    """The one line telling the user a run resumed; ``skipped``: the batches of the epoch under
    way already trained on (a checkpoint taken inside it, --checkpoint-every)."""
    of = f" of {total}" if total else ""
    if skipped:
        return (f"nbdist: resumed at epoch {done + 1}{of}, step {skipped + 1} of the epoch, in "
                f"{where} ({count(steps or 0, 'step')} restored; the first "
                f"{count(skipped, 'batch', 'batches')} of epoch {done + 1} are skipped: they "
                "were trained on).")
    if total is not None and done >= total:
        return (f"nbdist: resumed from epoch {done}{of} in {where}: every epoch was already "
                "done, nothing left to train.")
    if done == 0 and not steps:   # --elastic saves the weights the run started from
        return (f"nbdist: restored the weights the run started from, saved in {where}; "
                "training starts again with epoch 1.")
    ran = f", {steps} steps" if steps else ""
    return (f"nbdist: resumed from epoch {done}{of} in {where} ({count(done, 'epoch')}{ran} "
            f"restored; training goes on with epoch {done + 1}).")
