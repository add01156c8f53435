"""A multiworker worker slowed by `%distribute inject slow` is named the straggler by
`Run.explain()`."""

from __future__ import annotations

from helpers import run_ok

import nbdist


def test_a_worker_slowed_by_inject_slow_is_named_the_straggler(ip):
    from cluster_cells import SETUP, STEP

    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "multiworker --workers 2")
    try:
        run_ok(ip, SETUP)
        ip.run_line_magic("distribute", "inject slow 1 --delay 0.05")
        try:
            run_ok(ip, STEP.format(data="long_ds", flags="--steps 30"))
        finally:
            ip.run_line_magic("distribute", "inject slow 1 --delay 0")
        explained = nbdist.runs[-1].explain()
    finally:
        ip.run_line_magic("distribute", "stop")
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert explained.bottleneck == "straggler", explained.text
    first = explained.advice[0]
    assert first.text.startswith("worker 1 is the straggler"), explained.text
    assert "time outside its steps" in first.text
    # the 50 ms injected after each of worker 1's steps, measured as its time between steps
    # (no upper bound: load lengthens it; benchmarks/explain.py's straggler run prints it)
    longer = float(first.evidence.split("its time between its steps took ")[1].split(" ms")[0])
    assert longer > 35, first.evidence
    # local workers share this machine's cores: the gain adds up their own work
    assert "workers 0, 1 share one machine's cores" in first.evidence
