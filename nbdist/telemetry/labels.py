"""Runs named by what sets them apart: ``Run.label`` and ``nbdist.compare``'s legend.

A run's facts are its strategy, its size (replicas, workers) and what ``Run.params`` read from
the kernel (learning rate, global batch). Among several runs, each is labelled by its number
and the facts that are not the same for all of them (``"run 2 · lr 0.001"``), and the facts
they share go in a figure's title once (``shared_facts``); a run given ``--name`` is labelled
by that name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..words import count

Run = Any   # a telemetry.run.Run, which imports this module (Run.label)

__all__ = ["facts", "run_labels", "shared_facts"]


def facts(run: Run) -> dict[str, str]:
    """What ``run`` was set up with, each as it reads in a label, in a fixed order."""
    out = {"strategy": run.strategy, "replicas": count(run.replicas, "replica")}
    if run.workers > 1:
        out["workers"] = count(run.workers, "worker")
    rate = run.params.get("learning_rate")
    if rate is not None:
        out["learning_rate"] = f"lr {_number(rate)}"
    batch = run.params.get("global_batch")
    if batch is not None:
        out["global_batch"] = f"batch {batch}"
    return out


def _differing(runs: Sequence[Run]) -> list[str]:
    """The facts not the same for all ``runs`` (one missing counts as different)."""
    every = [facts(run) for run in runs]
    keys = list(dict.fromkeys(k for f in every for k in f))
    return [k for k in keys if len({f.get(k) for f in every}) > 1]


def run_labels(runs: Sequence[Run]) -> list[str]:
    """Each run's label among ``runs``: its ``--name`` (``Run.title``), else ``run <id>`` and
    the facts that differ between the runs; all of its facts when it is alone."""
    differ = _differing(runs) if len(runs) > 1 else None
    out = []
    for run in runs:
        if run.title:
            out.append(run.title)
            continue
        mine = facts(run)
        shown = [mine[k] for k in (mine if differ is None else differ) if k in mine]
        out.append(" · ".join([f"run {run.id}", *shown]))
    return out


def shared_facts(runs: Sequence[Run]) -> list[str]:
    """The facts every one of ``runs`` has alike (for a title: said once, not per line)."""
    if not runs:
        return []
    differ = set(_differing(runs))
    return [value for key, value in facts(runs[0]).items() if key not in differ]


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
