"""Size of executed, saved notebooks: notebooks/00-quickstart.ipynb and one with ten dashboards.

Executes each with nbclient in a fresh kernel (widget state stored, as JupyterLab's "save
widget state" would), writes it and prints its size and how much of it is widget state.
Budget: the tutorial <= 1 MB, ten dashboards <= 2 MB.

    python benchmarks/notebook_size.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
TEN = ["%load_ext nbdist", "%distribute mirrored --devices 2",
       "import numpy as np, tensorflow as tf\n"
       "x = np.random.default_rng(0).normal(size=(640, 8)).astype('float32')\n"
       "ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(32, drop_remainder=True)",
       "%%distribute\nmodel = tf.keras.Sequential([tf.keras.Input((8,)), "
       "tf.keras.layers.Dense(1)])\n"
       "optimizer = tf.keras.optimizers.SGD(0.01)"] + [
       "%%distribute --step --data ds --epochs 5\na, b = batch\nwith tf.GradientTape() as tape:\n"
       "    loss = tf.nn.compute_average_loss(tf.square(model(a) - b)[:, 0], "
       "global_batch_size=32)\ngrads = tape.gradient(loss, model.trainable_variables)\n"
       "optimizer.apply_gradients(zip(grads, model.trainable_variables))"] * 10


def execute(nb: nbformat.NotebookNode, cwd: Path, out: Path) -> None:
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=900, kernel_name="python3", store_widget_state=True,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    nbformat.write(nb, out)
    state = json.dumps(nb.metadata.get("widgets", {}))
    print(f"{out.name}: {out.stat().st_size / 1e3:.0f} kB, widget state "
          f"{len(state) / 1e3:.0f} kB")
    for i, c in enumerate(nb.cells):
        for o in c.get("outputs", []):
            sizes = {mime: len(v if isinstance(v, str) else json.dumps(v))
                     for mime, v in o.get("data", {}).items()}
            if sum(sizes.values()) > 10_000:
                parts = ", ".join(f"{m} {n / 1e3:.0f} kB" for m, n in sizes.items())
                print(f"  cell {i}: {sum(sizes.values()) / 1e3:.0f} kB ({parts})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--quickstart-only", action="store_true",
                        help="skip the ten-dashboard notebook")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="nbdist-size-"))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                             os.environ.get("PYTHONPATH")]))
    quick = nbformat.read(ROOT / "notebooks" / "00-quickstart.ipynb", as_version=4)
    execute(quick, ROOT / "notebooks", out / "00-quickstart.ipynb")
    if args.quickstart_only:
        return
    ten = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in TEN])
    execute(ten, out, out / "ten-dashboards.ipynb")


if __name__ == "__main__":
    main()
