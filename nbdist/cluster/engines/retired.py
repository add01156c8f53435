"""Engine ids nbdist restarted away, remembered in the profile for every kernel using it.

The controller lists an engine that was killed until its heartbeats are missed (seconds
later, 30 s with ipyparallel's defaults), and ``%distribute stop`` does not wait for that:
those ids are written to ``security/nbdist-retired-engines.json`` of the profile and never
chosen again, by this kernel or another. A controller numbers engines from 0 again when it
restarts, so the ids are kept per controller (a digest of its session key).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

FILE = "nbdist-retired-engines.json"


def _controller(client: Any) -> str:
    return hashlib.sha256(bytes(client.session.key)).hexdigest()[:16]


def _path(profile_dir: str) -> str:
    return os.path.join(profile_dir, "security", FILE)


def retired(client: Any, profile_dir: str) -> set[int]:
    """Ids of this controller's engines that nbdist restarted away."""
    try:
        with open(_path(profile_dir)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return set()
    return set(saved.get("ids", [])) if saved.get("controller") == _controller(client) else set()


def retire(client: Any, profile_dir: str, ids: list[int]) -> None:
    """Remember ``ids`` as restarted away (best effort: an unwritable profile is skipped)."""
    saved = {"controller": _controller(client),
             "ids": sorted(retired(client, profile_dir) | set(ids))}
    try:
        with open(_path(profile_dir), "w") as f:
            json.dump(saved, f)
    except OSError:
        pass
