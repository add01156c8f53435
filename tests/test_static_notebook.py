"""The static dashboard in a saved notebook and in the headless quickstart: the final
figure without widgets, and no TensorFlow INFO lines."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nbdist import tflogs

ROOT = Path(__file__).resolve().parents[1]


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
    # the learning rate of the optimizer the cell compiled its model with, in the title
    assert svg and any("nbdist-static-figure" in s and "<polyline" in s
               and "Run 1 · mirrored · 2 replicas · lr 0.01 · 16 steps · done" in s
               for s in svg)
    assert len(nbformat.writes(nb)) < 200_000


@pytest.mark.timeout(180)
def test_headless_quickstart_prints_no_widget_repr() -> None:
    done = subprocess.run([sys.executable, "-m", "nbdist.quickstart", "--devices", "2"],
                          capture_output=True, text=True, timeout=170, env=_kernel_env(),
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Box(" not in done.stdout and "FigureWidget" not in done.stdout, done.stdout
    assert "INFO:tensorflow" not in done.stdout
    assert "Run 1 · mirrored · 2 replicas" in done.stdout
