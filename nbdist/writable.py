"""Whether nbdist can write into a directory the user names, checked before anything runs.

``os.access`` answers yes to root everywhere (``/proc`` included), so the check writes: a
temporary file is made and removed in the directory, or in its nearest existing parent when
the directory would be created. Nothing is left behind.
"""

from __future__ import annotations

import os
import tempfile


def unwritable_reason(directory: str, *, created: bool = True) -> str | None:
    """Why files cannot be written into ``directory`` (None: they can). ``created``: a missing
    ``directory`` would be made, so its nearest existing parent is tried instead; otherwise a
    missing directory is the reason."""
    full = os.path.abspath(os.path.expanduser(directory))
    existing = full
    while created and not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.exists(existing):
        return f"{existing} does not exist"
    if not os.path.isdir(existing):
        return f"{existing} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".nbdist-write-test-"):
            pass
    except OSError as err:
        return f"{existing} takes no new files: {err.strerror or err}"
    return None
