"""Device setup in a fresh process, where TensorFlow's device state is known."""

from helpers import run_python


def test_split_after_tensorflow_initialised_its_devices_says_how_to_fix():
    done = run_python("""
        import tensorflow as tf
        tf.constant(1.0)          # any tensor initialises TensorFlow's devices
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "nbdist")
        try:
            ip.run_line_magic("distribute", "mirrored --devices 2")
        except Exception as err:
            print("ERROR", type(err).__name__, err)
        ip.run_line_magic("distribute", "mirrored")   # one device still works
        print("REPLICAS", tf.distribute.get_strategy() is not None)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ERROR DeviceError" in done.stdout
    assert "Restart the kernel and run `%distribute mirrored --devices 2`" in done.stdout
    assert "nbdist: mirrored with 1 replica on" in done.stdout


def test_logical_devices_are_made_before_tensorflow_initialises_and_then_reused():
    done = run_python("""
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "nbdist")
        ip.run_line_magic("distribute", "mirrored --devices 3")
        ip.run_line_magic("distribute", "mirrored --devices 2")   # reuses 2 of the 3
        import tensorflow as tf
        print("LOGICAL", len(tf.config.list_logical_devices("CPU")))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mirrored with 3 replicas" in done.stdout
    assert "mirrored with 2 replicas on /device:CPU:0, /device:CPU:1" in done.stdout
    assert "LOGICAL 3" in done.stdout


CELL_SETUP = """
import numpy as np
import tensorflow as tf
x = np.ones((64, 4), "float32")
ds = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(16, drop_remainder=True)
"""
MODEL = """%%distribute
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
"""
STEP_4 = """%%distribute mirrored --devices 4 --step --data ds --steps 2
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0], global_batch_size=16)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""


def test_a_cell_asking_for_more_devices_than_the_kernel_has_says_restart_and_that_works():
    """The advice is to restart the kernel: `%distribute stop` and the new line would fail once
    TensorFlow initialised its devices. Follow the new advice in a real kernel: restart it,
    run the line the error names first, then the same cell."""
    import os
    import re

    from helpers import ROOT
    from jupyter_client.manager import start_new_kernel

    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=90, env=env)

    def run(code):
        out = []
        reply = kc.execute_interactive(code, timeout=180, output_hook=lambda m: out.append(
            m["content"].get("text") or m["content"].get("evalue") or ""))
        return reply["content"], "".join(out)

    try:
        assert run("%load_ext nbdist\n%distribute mirrored --devices 2")[0]["status"] == "ok"
        for code in (CELL_SETUP, MODEL):
            assert run(code)[0]["status"] == "ok"
        reply, _ = run(STEP_4)
        assert reply["status"] == "error", reply
        advice = reply["evalue"]
        assert "%distribute stop" not in advice and "cannot switch" in advice, advice
        line = re.search(r"Restart the kernel and run `(%distribute [^`]+)`", advice)
        assert line and line.group(1) == "%distribute mirrored --devices 4", advice
        km.restart_kernel(now=True)                     # what the advice says, in order
        kc.wait_for_ready(timeout=90)
        assert run(f"%load_ext nbdist\n{line.group(1)}")[0]["status"] == "ok"
        for code in (CELL_SETUP, MODEL):
            assert run(code)[0]["status"] == "ok"
        assert run(STEP_4)[0]["status"] == "ok"
        reply, out = run("import nbdist; print('REPLICAS', nbdist.runs[-1].replicas, "
                         "nbdist.runs[-1].status)")
        assert "REPLICAS 4 done" in out, out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
