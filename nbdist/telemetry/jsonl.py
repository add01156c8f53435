"""A Run's rows as JSON lines: what an exported script writes (``--metrics PATH``) and
``Run.load`` reads back. Worker 0 writes PATH, worker i ``PATH`` with ``.worker-i`` before its
suffix (one file per process: no two processes append to one file). Each file holds a header
record, one record per row (the columns of ``telemetry.rows``, null where not measured), then
an end record with the run's status."""

from __future__ import annotations

import glob
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from .rows import COLUMNS, Row, as_row

FORMAT = "nbdist-run/1"


def worker_path(path: str, worker: int) -> str:
    stem, suffix = os.path.splitext(path)
    return path if worker == 0 else f"{stem}.worker-{worker}{suffix}"


class StepWriter:
    """Writes one worker's per-replica rows of a training loop to ``PATH`` (JSON lines)."""

    def __init__(self, path: str, *, worker: int = 0, workers: int = 1, replicas: int = 1,
                 strategy: str = "", loss_scale: int = 1):
        self.path = worker_path(path, worker)
        self.worker = worker
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")   # noqa: SIM115 - closed by close()
        self._line({"format": FORMAT, "worker": worker, "workers": workers,
                    "replicas": replicas, "strategy": strategy, "loss_scale": loss_scale,
                    "started": time.time()})

    def write(self, step: int, epoch: int, losses: Sequence[float],
              grad_norms: Sequence[float] | None = None, step_ms: float = math.nan,
              data_ms: float = math.nan, worker: int | None = None) -> None:
        """One step: a row per replica (``losses[r]``: replica r's loss) of this worker, or
        of ``worker`` (a parameter-server coordinator writes the rows of every worker)."""
        now = time.time()
        for replica, loss in enumerate(losses):
            norm = grad_norms[replica] if grad_norms is not None else math.nan
            row = Row(step=step, epoch=epoch, replica=replica,
                      worker=self.worker if worker is None else worker, loss=loss,
                      grad_norm=norm, allreduce_ms=math.nan, wait_ms=math.nan,
                      compute_ms=math.nan, other_collective_ms=math.nan, step_ms=step_ms,
                      data_ms=data_ms, wall_time=now)
            self._line({k: _json_value(v) for k, v in row._asdict().items()})
        self._file.flush()

    def close(self, status: str = "done") -> None:
        if not self._file.closed:
            self._line({"end": status, "ended": time.time()})
            self._file.close()

    def _line(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")


def _json_value(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def read_files(path: str) -> list[tuple[dict[str, Any], list[Row], dict[str, Any] | None]]:
    """(header, rows, end record or None) of PATH and its workers' files."""
    stem, suffix = os.path.splitext(path)
    paths = [path, *sorted(glob.glob(f"{glob.escape(stem)}.worker-*{suffix}"))]
    out = []
    for name in paths:
        with open(name, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        if not records or records[0].get("format") != FORMAT:
            raise ValueError(f"{name} is not a metrics file an exported script wrote "
                             f"(its first line must have format {FORMAT!r})")
        end = records[-1] if "end" in records[-1] else None
        rows = [as_row([math.nan if r[c] is None else float(r[c]) for c in COLUMNS])
                for r in records[1:] if "step" in r]
        out.append((records[0], rows, end))
    return out
