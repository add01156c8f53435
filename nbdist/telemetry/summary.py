"""``Run.summary()``: a few lines of text saying how a run went (the text view of a Run, printed
where no dashboard is drawn and under each finished dashboard)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import Run


def summary(run: Run) -> str:
    """Status, steps, throughput, the latest per-replica numbers, notes."""
    last = run.last
    steps = run.steps_done
    rate = steps / run.duration if run.duration > 0 else math.nan
    head = (
        f"Run {run.id} ({run.mode}, {run.strategy}, {run.replicas} replica(s)"
        f"{f' x {run.workers} workers' if run.workers > 1 else ''}): {run.status}, "
        f"{steps} step(s) in {run.duration:.1f} s ({rate:.1f} steps/s)"
    )
    lines = [head]
    if last:
        name = "loss (sum of replicas)" if run.loss_scale > 1 else "loss"
        parts = [f"{n} {last[k]:.4g}" for n, k in ((name, "global_loss"),
                                                  ("grad_norm", "grad_norm"))
                 if _finite(last[k])]
        parts += [f"{k} {last[k]:.2f}"     # other_collective_ms: only when there are some
                  for k in ("allreduce_ms", "other_collective_ms", "step_ms")
                  if _finite(last[k]) and (last[k] or k != "other_collective_ms")]
        # steps and epochs counted from 1, as the dashboard's header and Keras' log show them
        total = f"/{run.total_steps}" if run.total_steps else ""
        epochs = f"/{run.epochs}" if run.epochs else ""
        where = f"  step {last['step'] + 1}{total} (epoch {last['epoch'] + 1}{epochs}): "
        lines.append(where + ", ".join(parts))
        per_replica = run.last_losses()
        if len(per_replica) > 1:
            lines.append("  loss per replica: " + ", ".join(f"{v:.4g}" for v in per_replica))
    if run.error:
        lines.append(f"  error: {run.error}")
    lines += [f"  note: {n}" for n in run.notes]
    return "\n".join(lines)


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)
