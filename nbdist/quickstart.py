"""Headless quickstart: train with ``%%distribute`` in a real Jupyter kernel and print the result.

    python -m nbdist.quickstart [--devices 4] [--save quickstart.ipynb]

It builds a small notebook, executes it with nbclient in a fresh IPython kernel (so the magics
run exactly as in JupyterLab), prints every cell's text output and exits non-zero if a cell
failed.
"""

from __future__ import annotations

import argparse
import sys

CELLS = [
    "%load_ext nbdist",
    "%distribute mirrored --devices {devices}",
    """import numpy as np
import tensorflow as tf
GLOBAL_BATCH = 64
rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * 20, 16)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
train_ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH, drop_remainder=True)""",
    """%%distribute
model = tf.keras.Sequential([tf.keras.Input((16,)),
                             tf.keras.layers.Dense(32, activation="relu"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam(0.01)
bce = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")""",
    """%%distribute --step --data train_ds --epochs 3
features, labels = batch
with tf.GradientTape() as tape:
    logits = model(features, training=True)
    loss = tf.nn.compute_average_loss(bce(labels, logits), global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))""",
    """import nbdist
run = nbdist.runs[-1]
print(run.metrics.groupby("replica")[["loss", "grad_norm", "allreduce_ms"]].mean().round(4))""",
    "%distribute status",
]


def build_notebook(devices: int):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.replace("{devices}", str(devices))) for c in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the nbdist quickstart headless.")
    parser.add_argument("--devices", type=int, default=4, help="logical devices (default 4)")
    parser.add_argument("--save", help="also write the executed notebook here")
    args = parser.parse_args(argv)
    import os

    import nbformat
    from nbclient import NotebookClient

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # the kernel inherits it: less C++ noise
    from nbclient.exceptions import CellExecutionError

    nb = build_notebook(args.devices)
    client = NotebookClient(nb, timeout=600, kernel_name="python3")
    failed = False
    try:
        client.execute()
    except CellExecutionError as err:
        failed = True
        print(err, file=sys.stderr)
    for cell in nb.cells:
        print(f">>> {cell.source.splitlines()[0]}")
        for out in cell.get("outputs", []):
            if out.get("name") == "stderr" and not failed:
                continue
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            if text:
                print(text.rstrip())
    if args.save:
        nbformat.write(nb, args.save)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
