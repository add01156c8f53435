"""The finished dashboard without a kernel (static figure), and quiet cells (nbdist.tflogs).

Unit tests draw a Run as SVG and check the log filter; the kernel tests execute a notebook
with nbclient, render it with nbconvert, and run the headless quickstart.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nbdist import tflogs
from nbdist.telemetry.run import Run
from nbdist.widgets import warm
from nbdist.widgets.static import PLOTLY_MIME, static_bundle

ROOT = Path(__file__).resolve().parents[1]


def _run(steps: int, replicas: int = 2) -> Run:
    run = Run(id=7, mode="step", strategy="mirrored", replicas=replicas, total_steps=steps)
    for s in range(steps):
        run.record_step(s, 0, loss=[1.0 / (s + 1) + r for r in range(replicas)], step_ms=4.0,
                        grad_norm=[1.0] * replicas, allreduce_ms=[2.0] * replicas,
                        compute_ms=[1.0] * replicas)
    run.finish("done")
    return run


def test_the_warm_up_draws_a_whole_dashboard_once_per_kernel(monkeypatch) -> None:
    """`%distribute` draws a throwaway figure while workers start (plotly's first figure is
    slow); it must be the real drawing code, run once."""
    bundle = warm.sample_bundle()
    assert {PLOTLY_MIME, "image/svg+xml", "text/plain"} <= set(bundle)
    assert len(bundle[PLOTLY_MIME]["data"]) >= 2        # one loss line per worker at least
    monkeypatch.setattr(warm, "_started", type(warm._started)())
    thread = warm.warm_in_background()
    assert thread is not None and warm.warm_in_background() is None
    thread.join(60)
    assert not thread.is_alive()


def test_static_bundle_is_svg_plotly_json_and_text_and_stays_small() -> None:
    bundle = static_bundle(_run(20_000, replicas=8))
    svg = bundle["image/svg+xml"]
    assert svg.startswith("<svg") and svg.count("<polyline") >= 8 * 4
    assert "Run 7 · mirrored · 8 replica(s) · 20000 step(s) · done" in svg
    assert "Run 7" in bundle["text/plain"]
    names = [t["name"] for t in bundle[PLOTLY_MIME]["data"] if t.get("xaxis") == "x"]
    assert names[:2] == ["replica 0", "replica 1"]
    # Ten of these in one notebook stay under 2 MB (the points are capped, float32).
    assert len(json.dumps(bundle)) < 150_000


def test_quiet_tensorflow_hides_info_even_if_tensorflow_resets_its_level(caplog) -> None:
    logger = logging.getLogger("tensorflow")
    with tflogs.quiet_tensorflow():
        logger.setLevel(logging.INFO)           # what TensorFlow does on import in a notebook
        with caplog.at_level(logging.INFO, logger="tensorflow"):
            logger.info("Reduce to /job:localhost then broadcast")
            logger.warning("a real warning")
        with warnings.catch_warnings(record=True) as caught:    # keeps the filters in force
            warnings.warn("`shuffle=True` was passed, but will be ignored", UserWarning,
                          stacklevel=1)
    assert [r.getMessage() for r in caplog.records] == ["a real warning"]
    assert caught == []
    assert logger.filters == []                 # as it was afterwards
    logger.setLevel(logging.NOTSET)


def test_verbose_shows_everything(monkeypatch) -> None:
    monkeypatch.setenv(tflogs.ENV, "0")
    tflogs.set_verbose()
    assert tflogs.verbose() and tflogs.worker_environment()[tflogs.ENV] == "1"
    with tflogs.quiet_tensorflow():
        assert logging.getLogger("tensorflow").filters == []
    tflogs.set_verbose(False)
    assert not tflogs.verbose()


def _kernel_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", tflogs.ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices 2",
    "import numpy as np, tensorflow as tf\n"
    "x = np.random.default_rng(0).normal(size=(256, 4)).astype('float32')\n"
    "ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True)",
    "%%distribute\nmodel = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])\n"
    "model.compile(optimizer='sgd', loss='mse')\nmodel.fit(ds, epochs=2, verbose=0, shuffle=True)",
]


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_saved_notebook_shows_the_final_dashboard_without_widgets_and_no_tf_info(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbclient
    import nbformat
    from nbconvert import HTMLExporter

    for key in ("TF_CPP_MIN_LOG_LEVEL", tflogs.ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PYTHONPATH", _kernel_env()["PYTHONPATH"])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=150,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "INFO:tensorflow" not in text and "Reduce to" not in text, text
    assert "shuffle=True" not in text and "oneDNN" not in text, text
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in outputs), "a reopened notebook would say: model not found"
    html, _ = HTMLExporter().from_notebook_node(nb)   # what nbviewer shows: no script runs
    images = re.findall(r'<img [^>]*src="data:image/svg\+xml;base64,([^"]+)"', html)
    svg = [base64.b64decode(i).decode() for i in images]
    assert svg and any("nbdist-static-figure" in s and "<polyline" in s
               and "Run 1 · mirrored · 2 replica(s) · 16 step(s) · done" in s for s in svg)
    assert len(nbformat.writes(nb)) < 200_000


@pytest.mark.kernel
@pytest.mark.timeout(180)
def test_headless_quickstart_prints_no_widget_repr() -> None:
    done = subprocess.run([sys.executable, "-m", "nbdist.quickstart", "--devices", "2"],
                          capture_output=True, text=True, timeout=170, env=_kernel_env(),
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Box(" not in done.stdout and "FigureWidget" not in done.stdout, done.stdout
    assert "INFO:tensorflow" not in done.stdout
    assert "Run 1 · mirrored · 2 replica(s)" in done.stdout
