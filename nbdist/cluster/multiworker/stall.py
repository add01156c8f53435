"""A worker alive but stuck: found from the step times, diagnosed from every worker's stacks.

The rule: a run has stalled when no worker has finished a step for longer than
``max(STALL_FACTOR x the median step time of the last STALL_WINDOW steps, STALL_FLOOR_S)``;
until a step after the first (which traces and compiles) has finished, the bound is
``FIRST_STEP_S``. Heartbeats cannot see this: a worker blocked in its input pipeline or in a
deadlock still sends them, while the others wait for it in their collective.

On a stall the kernel asks every running worker for its stacks (``protocol.DUMP_STACKS``,
answered from the worker's channel thread) and waits up to ``ANSWER_S``. The culprits are the
workers that did not answer (stopped, or not running Python at all) and those with a thread
blocked in the user's own cell code; the others wait for them in TensorFlow. With no culprit
(every worker is inside TensorFlow: a long validation, a slow checkpoint) nothing is done and
the bound doubles, so a slow but healthy run is never aborted by this rule.
"""

from __future__ import annotations

from typing import Any

from ..progress import (  # noqa: F401 - the rule's numbers, read here by tests and docs
    FIRST_STEP_S,
    STALL_FACTOR,
    STALL_FLOOR_S,
    STALL_WINDOW,
    StallWatch,
    rule_text,
)

#: How long the kernel waits for the workers' stacks.
ANSWER_S = 2.0

_PHASE = {"input": "reading its input (--data)", "step": "in its training step",
          "fit": "in model.fit", "cell": "running the cell"}


def diagnose(stacks: dict[int, dict[str, Any] | None]) -> tuple[list[int], list[int]]:
    """(culprits, waiting) among the running workers: ``stacks[w]`` is worker w's
    ``protocol.STACKS`` answer, None if it gave none."""
    culprits = sorted(w for w, s in stacks.items()
                      if s is None or any(t.get("blocked_in_cell") for t in s["threads"]))
    return culprits, sorted(set(stacks) - set(culprits))


def stuck_message(stalled_s: float, bound: float, median: float | None,
                  stacks: dict[int, dict[str, Any] | None], steps: dict[int, int | None],
                  culprits: list[int], waiting: list[int], process_state: Any,
                  stopped: bool = False) -> str:
    """The error text: who is stuck, where (the user's cell line), who waits for it.
    ``stopped``: found because a worker's process is stopped, before the stall limit."""
    rule = rule_text(bound, median)
    parts = [f"A worker's process has been stopped for {stalled_s:.1f} s (SIGSTOP, or a "
             "debugger): the others cannot go on without it." if stopped else
             f"The run stalled: no worker finished a step for {stalled_s:.1f} s ({rule})."]
    for w in culprits:
        at = f"at step {steps.get(w)}" if steps.get(w) is not None else "before its first step"
        info = stacks.get(w)
        if info is None:
            parts.append(f"worker {w} is stuck {at}: it did not answer within {ANSWER_S:g} s "
                         f"(process {process_state(w)}).")
            continue
        where = cell_frame(info)
        parts.append(f"worker {w} is stuck {at}, {_PHASE.get(info['phase'], info['phase'])}, "
                     f"blocked in your code at {where}." if where else
                     f"worker {w} is stuck {at}.")
    if waiting:
        each = ", ".join(f"{w} (step {steps.get(w)})" for w in waiting)
        parts.append(f"Waiting for it in TensorFlow (in the collective): "
                     f"worker{'s' * (len(waiting) > 1)} {each}.")
    parts.append("The workers were ended: a collective cannot be cancelled and TensorFlow "
                 "cannot continue after one is aborted. Fix the cause, run `%distribute "
                 "restart`, build the model again and re-run the cell (with --checkpoint it "
                 "resumes).")
    return " ".join(parts)


def cell_frame(info: dict[str, Any]) -> str | None:
    """'cell line 9 (in gen): time.sleep(3600)' for the innermost cell frame of the first
    thread blocked in the user's code."""
    for thread in info["threads"]:
        if thread.get("blocked_in_cell"):
            cells = [f for f in thread["frames"] if f["file"].startswith("<nbdist-")]
            if cells:
                f = cells[-1]
                return f"cell line {f['line']} (in {f['name']}, {f['file']}): {f['text']}"
    return None


def stacks_text(stacks: dict[int, dict[str, Any] | None]) -> str:
    """Every worker's stacks, innermost last, as the cell's traceback shows them."""
    lines = []
    for w, info in sorted(stacks.items()):
        if info is None:
            lines.append(f"[worker {w}] (no answer)")
            continue
        for thread in info["threads"]:
            lines.append(f"[worker {w}] thread {thread['name']} (step {info['step']}, "
                         f"{_PHASE.get(info['phase'], info['phase'])}), most recent call last:")
            for f in thread["frames"]:
                where = (f"cell line {f['line']}" if f["file"].startswith("<nbdist-")
                         else f'File "{f["file"]}", line {f["line"]}')
                lines.append(f"[worker {w}]   {where}, in {f['name']}")
                if f["text"]:
                    lines.append(f"[worker {w}]     {f['text']}")
    return "\n".join(lines)
