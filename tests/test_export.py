"""``%distribute export`` and ``python -m nbdist.launch``: the step-mode training of tutorials
02 and 04, exported from a notebook run (nbclient), trains the same way as a script.

The notebooks run the tutorials' own cells (setup, model, the first step cell) with a seed
added before the model is built, so that the script, which runs the same cells, starts from
the same weights; both read the same global batches (TensorFlow shards each one across the
replicas in both), so the global loss of every step must agree whatever the replicas are.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
from helpers import WITHOUT_NBDIST, run_cell

import nbdist

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
SEED = "tf.keras.utils.set_random_seed(7)   # the script runs this too: the same weights\n"


def _env() -> dict[str, str]:
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)),
                TF_CPP_MIN_LOG_LEVEL="2")


def _tutorial_cells(name: str, *snippets: str) -> list[str]:
    """The sources of the first code cell of notebooks/<name>*.ipynb holding each snippet."""
    nb = nbformat.read(next(NOTEBOOKS.glob(f"{name}-*.ipynb")), as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    return [next(s for s in code if all(part in s for part in snippet.split("|")))
            for snippet in snippets]


def _run_notebook(cells: list[str], workdir: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    os.environ.update({k: v for k, v in _env().items() if k in ("PYTHONPATH",)})
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(workdir)}}).execute()
    return nb


def _global_losses(frame: pd.DataFrame) -> np.ndarray:
    """Each step's global loss: the sum of the replicas' losses (each / the global batch)."""
    return frame.groupby("step")["loss"].sum().to_numpy()


def _script(args: list[str], workdir: Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=workdir, env=_env(), text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _export_and_check(cells: list[str], tmp_path: Path) -> tuple[Path, np.ndarray]:
    """Run the cells and export; return the script and the notebook run's global losses."""
    script, losses = tmp_path / "train.py", tmp_path / "notebook_losses.csv"
    _run_notebook([*cells, f"import nbdist\nnbdist.runs[-1].metrics.to_csv({str(losses)!r})",
                   f"%distribute export {script}"], tmp_path)
    # ruff's default rules: only the notebook's own lines (kept as typed) may be reported
    lint = subprocess.run(["ruff", "check", "--isolated", "--output-format", "json",
                           str(script)], capture_output=True, text=True)
    lines = script.read_text().splitlines()
    typed = {line.strip() for c in cells for line in c.splitlines()}
    found = [(v["code"], lines[v["location"]["row"] - 1]) for v in json.loads(lint.stdout)]
    assert all(line.strip() in typed for _, line in found), found
    return script, _global_losses(pd.read_csv(losses))


def test_tutorial_02_exported_trains_like_the_notebook(tmp_path):
    start, setup, model, step = _tutorial_cells(
        "02", "%distribute mirrored", "GLOBAL_BATCH, LR", "def make_model",
        "--step|compute_average_loss")
    cells = [start, setup + "\n" + SEED, model, step]
    script, notebook = _export_and_check(cells, tmp_path)
    assert len(notebook) == 48
    _script(["-m", "nbdist.launch", "--workers", "2", str(script), "--strategy",
             "multiworker", "--metrics", "workers.jsonl"], tmp_path)
    two_workers = nbdist.Run.load(str(tmp_path / "workers.jsonl"))
    assert (two_workers.workers, two_workers.replicas, two_workers.status) == (2, 1, "done")
    np.testing.assert_allclose(_global_losses(two_workers.metrics), notebook, rtol=1e-4)
    assert two_workers.plot() is not None   # the dashboard's figure of the finished job
    # plain `python train.py`: MirroredStrategy on 4 devices, with nbdist not importable
    out = _script(["-c", "import runpy, sys; sys.modules['nbdist'] = None; "
                   f"sys.argv = ['train.py']; runpy.run_path({str(script)!r}, "
                   "run_name='__main__')"], tmp_path)
    printed = [float(v) for v in re.findall(r"epoch \d/3: loss (\S+)", out)]
    np.testing.assert_allclose(printed, notebook[[15, 31, 47]], rtol=1e-4)


def test_tutorial_04_exported_trains_like_the_workers(tmp_path, tf_keras):
    start, data, step = _tutorial_cells("04", "%distribute multiworker", "def straggle",
                                        "--step|--epochs 2")
    data = data.replace("model = tf.keras", SEED + "model = tf.keras", 1)
    script, notebook = _export_and_check([start, data, step], tmp_path)
    text = script.read_text()
    assert 'os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")' in text
    assert "nbdist_worker, nbdist_workers = worker_index_and_count()" in text
    _script(["-m", "nbdist.launch", "--workers", "2", str(script), "--metrics", "m.jsonl"],
            tmp_path)
    job = nbdist.Run.load(str(tmp_path / "m.jsonl"))
    assert sorted(job.metrics.worker.unique()) == [0, 1]
    np.testing.assert_allclose(_global_losses(job.metrics), notebook, rtol=1e-4)


def test_a_keras_loss_object_prints_the_loss_of_the_global_batch(ip, tmp_path):
    # Keras divides a loss object's value by the replicas inside strategy.run: the script sums
    # the replicas' losses, as the notebook's run found when it traced the step
    assert run_cell(ip, """\
        import keras
        import numpy as np
        import tensorflow as tf
        tf.keras.utils.set_random_seed(7)
        x_kl = np.arange(128, dtype='float32').reshape(32, 4) / 128
        ds_kl = tf.data.Dataset.from_tensor_slices((x_kl, x_kl.sum(1, keepdims=True))).batch(8)
        mse_kl = keras.losses.MeanSquaredError()""").success
    assert run_cell(ip, """\
        %%distribute
        model_kl = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        opt_kl = tf.keras.optimizers.Adam(0.05)""").success
    assert run_cell(ip, """\
        %%distribute --step --data ds_kl --epochs 2
        x, y = batch
        with tf.GradientTape() as tape:
            loss = mse_kl(y, model_kl(x))
        grads = tape.gradient(loss, model_kl.trainable_variables)
        opt_kl.apply_gradients(zip(grads, model_kl.trainable_variables))""").success
    run = nbdist.runs[-1]
    assert run.replicas == 4 and run.loss_scale == 4
    notebook = run.metrics.groupby("step")["loss"].sum().to_numpy()
    script = tmp_path / "train.py"
    assert run_cell(ip, f"%distribute export {script} --force").success
    assert "ReduceOp.SUM" in script.read_text()
    out = _script(["-c", WITHOUT_NBDIST, str(script)], tmp_path)
    printed = [float(v) for v in re.findall(r"epoch \d/2: loss (\S+) \(\d+ steps\)", out)]
    np.testing.assert_allclose(printed, notebook[[3, 7]], rtol=1e-4)
