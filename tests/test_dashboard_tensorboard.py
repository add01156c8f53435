"""`nbdist.to_tensorboard`: one TensorBoard series per replica, read back with TensorFlow."""

from __future__ import annotations

from pathlib import Path

import pytest
from dashboard_helpers import make_run

from nbdist.telemetry.run import RunWriter


def test_to_tensorboard_writes_one_series_per_replica(tmp_path: Path) -> None:
    import tensorflow as tf
    run = make_run(40, replicas=2, every=10)
    RunWriter(run).finish("done")
    root = run.to_tensorboard(str(tmp_path))
    assert root.parent == tmp_path and root.name.startswith("run1-")
    found: dict[str, dict[str, list]] = {}
    for event_file in root.rglob("events.out.tfevents.*"):
        series = found.setdefault(event_file.parent.relative_to(root).as_posix(), {})
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name in ("", "scalars")
                series.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    assert sorted(found) == ["global", "replica_0", "replica_1"]
    for r in (0, 1):
        loss = dict(found[f"replica_{r}"]["loss"])
        assert len(loss) == 40 and loss[9] == pytest.approx(0.1 + 0.1 * r)
        assert [s for s, _ in found[f"replica_{r}"]["allreduce_ms"]] == [0, 10, 20, 30]
    assert len(found["global"]["step_ms"]) == 40
    assert dict(found["global"]["loss"])[0] == pytest.approx(1.05)
