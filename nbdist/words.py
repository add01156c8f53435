"""Counted nouns in what users read: "1 replica", "4 replicas", never "replica(s)".

Imports nothing of nbdist, so every layer can use it.
"""

from __future__ import annotations

__all__ = ["count"]

_IRREGULAR = {"op": "ops", "process": "processes"}


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 replica"``, ``"4 replicas"``, ``"0 steps"``; ``plural`` where adding "s" is wrong
    ("parameter server" -> "parameter servers" works; "process" is known)."""
    if n == 1:
        return f"{n} {noun}"
    if plural is None:
        head, _, last = noun.rpartition(" ")   # "worker process" -> "worker processes"
        plural = (f"{head} " if head else "") + _IRREGULAR.get(last, last + "s")
    return f"{n} {plural}"
