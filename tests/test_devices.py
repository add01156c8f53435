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
    assert "nbdist: mirrored with 1 replica(s)" in done.stdout


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
    assert "mirrored with 3 replica(s)" in done.stdout
    assert "mirrored with 2 replica(s) on /device:CPU:0, /device:CPU:1" in done.stdout
    assert "LOGICAL 3" in done.stdout
