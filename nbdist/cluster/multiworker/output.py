"""The workers' output, streamed into the running cell with a ``[worker i]`` prefix."""

from __future__ import annotations

import sys
from typing import Any


class WorkerOutput:
    """Prints what each worker wrote since the last call, line by line, prefixed.

    ``quiet``: print nothing until ``pump(final=True, show=True)``.
    """

    def __init__(self, results: dict[int, Any], quiet: bool = False):
        self.results = results
        self.quiet = quiet
        self.pos: dict[tuple[int, str], int] = {}
        self.partial: dict[tuple[int, str], str] = {}

    def pump(self, final: bool = False, show: bool = False) -> None:
        if self.quiet and not show:
            return
        for worker, ar in self.results.items():
            try:
                metadata = ar.metadata
            except Exception:  # a result whose engine vanished
                continue
            for name in ("stdout", "stderr"):
                key = (worker, name)
                text = metadata.get(name) or ""
                start = self.pos.get(key, 0)
                self.pos[key] = len(text)
                lines = (self.partial.get(key, "") + text[start:]).split("\n")
                rest = lines.pop()
                if final and rest:
                    lines.append(rest)
                    rest = ""
                self.partial[key] = rest
                stream = sys.stdout if name == "stdout" else sys.stderr
                for line in lines:
                    print(f"[worker {worker}] {line}", file=stream)
