"""The Run store's columnar table: rows across chunk boundaries, extras appearing late,
interrupted appends, and the Run API read back from it."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

import nbdist
from nbdist.telemetry import table
from nbdist.telemetry.rows import COLUMNS, POSITION, Row, pack, unpack
from nbdist.telemetry.run import Run, RunWriter


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(table, "CHUNK", 4)


def test_rows_cross_chunk_boundaries_and_read_back_exactly(small_chunks):
    t = table.ColumnTable(2)
    t.append(np.arange(6.0).reshape(3, 2))
    t.append(np.arange(6.0, 20.0).reshape(7, 2), {"acc": np.arange(7.0)})
    assert t.n == 10 and len(t._chunks) == 3
    assert t.block().tolist() == np.arange(20.0).reshape(10, 2).tolist()
    assert t.block(3, 9)[:, 0].tolist() == [6.0, 8.0, 10.0, 12.0, 14.0, 16.0]
    extra = t.extra("acc")
    assert np.isnan(extra[:3]).all() and extra[3:].tolist() == list(np.arange(7.0))
    assert t.last().tolist() == [18.0, 19.0] and t.block(10).shape == (0, 2)


def test_chunks_grow_from_small_and_a_finished_run_keeps_only_its_rows(monkeypatch):
    """Hundreds of short runs in a session must not keep a 6.8 MB chunk each."""
    monkeypatch.setattr(table, "FIRST", 2)
    monkeypatch.setattr(table, "CHUNK", 8)
    t = table.ColumnTable(2)
    rows = np.arange(46.0).reshape(23, 2)
    t.append(rows[:1])
    t.append(rows[1:20], {"acc": np.arange(19.0)})
    assert [len(c) for c in t._chunks] == [2, 2, 4, 8, 8]      # doubling up to CHUNK
    t.trim()
    assert [len(c) for c in t._chunks] == [2, 2, 4, 8, 4] and t.capacity == t.n == 20
    assert [len(c) for c in t._extras["acc"]] == [2, 2, 4, 8, 4]
    t.append(rows[20:])                   # rows after the trim (late telemetry): a new chunk
    assert t.block().tolist() == rows.tolist() and t.last().tolist() == [44.0, 45.0]
    assert t.block(7, 21)[:, 0].tolist() == rows[7:21, 0].tolist()
    assert np.isnan(t.extra("acc")[[0, 20, 22]]).all() and t.extra("acc")[1:20].tolist() == \
        list(np.arange(19.0))
    run = Run(id=1, mode="step", strategy="mirrored", replicas=2)
    RunWriter(run).record_step(0, 0, loss=[1.0, 2.0], step_ms=5.0)
    RunWriter(run).finish("done")
    assert run._table.capacity == 2 and run.last_losses() == [1.0, 2.0]


def test_an_interrupted_append_leaves_no_partial_rows(small_chunks, monkeypatch):
    t = table.ColumnTable(1)
    t.append(np.ones((3, 1)))

    class Boom(np.ndarray):
        def __getitem__(self, item):     # fails on the second copy, as a KeyboardInterrupt
            if isinstance(item, slice) and item.start:
                raise KeyboardInterrupt
            return super().__getitem__(item)

    with pytest.raises(KeyboardInterrupt):
        t.append(np.full((6, 1), 2.0).view(Boom))
    assert t.n == 3 and t.block().tolist() == [[1.0]] * 3
    t.append(np.full((2, 1), 3.0))
    assert t.block()[:, 0].tolist() == [1.0, 1.0, 1.0, 3.0, 3.0]


def test_run_reads_back_what_was_recorded(small_chunks):
    run = Run(id=1, mode="step", strategy="mirrored", replicas=2)
    for step in range(5):
        RunWriter(run).record_step(
            step, step // 3, loss=[1.0 + step, 2.0 + step], step_ms=5.0, grad_norm=[0.5, 0.25],
            extra={"accuracy": 0.5} if step == 4 else None)
    assert run.n_rows == 10 and run.steps_done == 5
    rows = run.rows_since(8)
    assert [r.replica for r in rows] == [0, 1] and [r.loss for r in rows] == [5.0, 6.0]
    assert all(isinstance(r, Row) and isinstance(r.step, int) and r.step == 4 for r in rows)
    assert rows[0].epoch == 1 and rows[0].grad_norm == 0.5 and math.isnan(rows[0].wait_ms)
    frame = run.metrics
    assert list(frame.columns[:len(COLUMNS)]) == list(COLUMNS)
    assert frame["step"].dtype == np.int64 and frame["accuracy"].isna().sum() == 8
    assert run.last["loss"] == 5.5 and run.last["epoch"] == 1
    assert run.last_losses() == [5.0, 6.0]


def test_rows_cross_the_wire_packed_and_back():
    run = Run(id=1, mode="step", strategy="multiworker", replicas=2)
    RunWriter(run).record_step(0, 0, loss=[0.5, float("nan")], step_ms=3.0)
    RunWriter(run).record_step(1, 0, loss=[0.25, 0.5], step_ms=3.0, extra={"update_ms": 1.5})
    names, values = run.table_since(1)
    assert names == [*COLUMNS, "update_ms"] and values.shape == (3, len(COLUMNS) + 1)
    block, extras = unpack(json.loads(json.dumps(pack(names, values))), worker=3)
    assert block[:, POSITION.worker].tolist() == [3.0] * 3
    assert math.isnan(block[0, POSITION.loss]) and block[2, POSITION.loss] == 0.5
    assert math.isnan(extras["update_ms"][0]) and extras["update_ms"][1:].tolist() == [1.5] * 2
    values[0, POSITION.replica] = float("nan")
    with pytest.raises(ValueError, match="missing step, epoch, replica"):
        unpack(pack(names, values))


# -- every write through RunWriter ------------------------------------------------------------
_PACKAGE = pathlib.Path(nbdist.__file__).parent
_FIELDS = {f.name for f in dataclasses.fields(Run)}


def _names_a_run(node: ast.expr) -> bool:
    """``run``, ``self.run``, ``entry.run``...: what nbdist calls a Run it holds."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return name == "run" or name.endswith("_run")


def _run_field_writes(source: str, filename: str) -> list[str]:
    """Assignments (plain, augmented, into a slice, ``setattr``) to an attribute named like a
    Run field on an object named like a Run (``_names_a_run``), outside class RunWriter."""
    tree = ast.parse(source, filename)
    writer = next((n for n in tree.body if isinstance(n, ast.ClassDef)
                   and n.name == "RunWriter"), None)
    allowed = {id(n) for n in ast.walk(writer)} if writer is not None else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "setattr" and node.args and _names_a_run(node.args[0])):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
            continue
        else:
            continue
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets += target.elts
                continue
            if isinstance(target, (ast.Subscript, ast.Starred)):
                target = target.value
            if (isinstance(target, ast.Attribute) and target.attr in _FIELDS
                    and _names_a_run(target.value)):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(target)}")
    return found


def test_every_write_to_a_run_field_goes_through_run_writer():
    """Users only read a Run; nbdist writes it through RunWriter (under its lock, checked)."""
    found = [hit for path in sorted(_PACKAGE.rglob("*.py"))
             for hit in _run_field_writes(path.read_text("utf-8"),
                                          str(path.relative_to(_PACKAGE.parent)))]
    assert not found, "Run fields written outside RunWriter:\n" + "\n".join(found)


def test_the_run_writer_rule_finds_planted_writes():
    planted = ("def f(run, self, entry):\n"
               "    run.epochs = 3\n"
               "    self.run.total_steps += 1\n"
               "    entry.run.notes[:] = []\n"
               "    a, self._run.status = 1, 'done'\n"
               "    setattr(entry.run, 'epochs', 2)\n"
               "    run.unrelated = 1\n"
               "    other.epochs = 1\n"
               "class RunWriter:\n"
               "    def finish(self):\n"
               "        self.run.status = 'done'\n")
    assert [hit.split(": ", 1)[1] for hit in _run_field_writes(planted, "planted.py")] == [
        "run.epochs", "self.run.total_steps", "entry.run.notes", "self._run.status",
        "setattr(entry.run, 'epochs', 2)"]
