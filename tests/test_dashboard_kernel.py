"""The dashboard with real kernels: a notebook executed with nbclient (its saved outputs and
widget state), a Stop click through the comm while the cell runs, the header's rate and ETA."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from dashboard_helpers import STATIC

ROOT = Path(__file__).resolve().parents[1]

SETUP = [
    "%load_ext nbdist\n%distribute mirrored --devices 2",
    "import tensorflow as tf\nGLOBAL = 16\nx = tf.random.normal([{n}, 4])\n"
    "y = tf.random.normal([{n}, 2])\n"
    "ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL, drop_remainder=True)",
    "%%distribute\nmodel = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])\n"
    "optimizer = tf.keras.optimizers.SGD(0.05)",
]
STEP = ("%%distribute --step --data ds --epochs {epochs}\nx, y = batch\n"
        "with tf.GradientTape() as tape:\n"
        "    per = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=-1)\n"
        "    loss = tf.nn.compute_average_loss(per, global_batch_size=GLOBAL)\n"
        "grads = tape.gradient(loss, model.trainable_variables)\n"
        "optimizer.apply_gradients(zip(grads, model.trainable_variables))")


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


@pytest.mark.timeout(120)
def test_notebook_saves_dashboard_state_with_one_loss_series_per_replica(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbclient
    import nbformat

    for key, value in _kernel_env().items():
        monkeypatch.setenv(key, value)
    logdir = tmp_path / "tb"
    step = STEP.format(epochs=2).replace("--epochs 2", f"--epochs 2 --tensorboard {logdir}", 1)
    cells = [c.format(n=320) for c in SETUP] + [step]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=90, store_widget_state=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[-1].outputs
    # The live widgets gave way to the static final figure: no output needs a widget model.
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
                   for o in outputs)
    assert any("done, 40 steps" in o.get("data", {}).get("text/plain", "") for o in outputs)
    [fig] = [o.data[STATIC] for o in outputs if STATIC in o.get("data", {})]
    loss = {t["name"]: t for t in fig["data"] if t.get("yaxis") == "y"}
    assert sorted(loss) == ["global loss (sum of replicas)", "replica 0", "replica 1"]
    import base64

    for name in ("replica 0", "replica 1"):
        y = loss[name]["y"]
        y = np.frombuffer(base64.b64decode(y["bdata"]), y["dtype"])
        assert len(y) == 40 and np.all(np.isfinite(y))
    state = nb.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    models = {m["model_name"] for m in state.values()}
    assert {"VBoxModel", "ButtonModel", "IntProgressModel", "AnyModel"} <= models
    assert len(json.dumps(state)) < 60_000        # data only: no plotly.js in the state
    # --tensorboard DIR wrote one series directory per replica, and said where.
    [run_dir] = logdir.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["global", "replica_0", "replica_1"]
    assert all(list(p.glob("events.out.tfevents.*")) for p in run_dir.iterdir())
    assert any(f"TensorBoard scalars of run 1 in {run_dir}" in o.get("text", "") for o in outputs)


@pytest.mark.timeout(150)
def test_stop_click_ends_a_running_cell_at_a_step_boundary() -> None:
    """A real kernel, the Stop click sent through the comm while the cell is busy."""
    from jupyter_client.manager import start_new_kernel

    out: list[str] = []
    km, kc = start_new_kernel(kernel_name="python3", env=_kernel_env())
    try:
        for code in [c.format(n=16 * 400) for c in SETUP]:
            reply = kc.execute_interactive(code, timeout=90)
            assert reply["content"]["status"] == "ok", reply["content"]
        msg_id = kc.execute(STEP.format(epochs=50))          # 20,000 steps: minutes
        clicked = None
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            msg = kc.get_iopub_msg(timeout=100)
            content = msg["content"]
            if (msg["msg_type"] == "comm_open" and clicked is None
                    and content["data"]["state"].get("_model_name") == "ButtonModel"):
                time.sleep(1.0)
                kc.shell_channel.send(kc.session.msg("comm_msg", {
                    "comm_id": content["comm_id"],
                    "data": {"method": "custom", "content": {"event": "click"}}}))
                clicked = time.monotonic()
            if (msg["msg_type"] == "status" and content["execution_state"] == "idle"
                    and msg["parent_header"].get("msg_id") == msg_id):
                break
        assert clicked is not None, "the dashboard's Stop button never appeared"
        assert time.monotonic() - clicked < 30
        probe = kc.execute_interactive(
            "import nbdist; r = nbdist.runs[-1]\nprint(r.status, r.steps_done, r.total_steps)",
            timeout=30, output_hook=lambda m: out.append(m["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert probe["content"]["status"] == "ok"
    status, done, total = "".join(out).split()
    assert status == "stopped" and 0 < int(done) < int(total) == 20_000



@pytest.mark.timeout(150)
def test_the_header_shows_the_rate_and_the_eta_while_a_run_runs() -> None:
    """A real kernel: the dashboard header's updates (comm messages to the frontend) show
    steps/s and the time left at that rate; the last one, the outcome."""
    import re

    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=_kernel_env())
    headers: list[str] = []
    try:
        for code in [c.format(n=16 * 400) for c in SETUP]:
            reply = kc.execute_interactive(code, timeout=90)
            assert reply["content"]["status"] == "ok", reply["content"]
        reply = kc.execute_interactive(
            STEP.format(epochs=5), timeout=120,     # 2,000 steps
            output_hook=lambda msg: headers.append(
                ((msg["content"].get("data") or {}).get("state") or {}).get("value", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    headers = [re.sub(r"<[^>]+>", "", h) for h in headers
               if isinstance(h, str) and "<b>Run 1</b>" in h]
    running = [m for h in headers if (m := re.search(
        r"step (\d+)/2000 · epoch [1-5]/5 · ([\d.]+) steps/s · (\d+) s left", h))]
    assert running, headers
    for m in running:
        left, rate, eta = 2000 - int(m[1]), float(m[2]), int(m[3])
        assert left / (rate + 0.05) - 0.5 <= eta <= left / (rate - 0.05) + 0.5, m[0]
    assert "✓ finished" in headers[-1] and "step 2000/2000 · epoch 5/5" in headers[-1]
    assert "left" not in headers[-1]
