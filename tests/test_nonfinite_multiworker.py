"""Multiworker names the worker whose batch was empty, then suggests its line."""


from helpers import run_err, run_ok
from test_nonfinite import MEAN_STEP

from nbdist.errors import NonFiniteLoss


def test_multiworker_names_the_worker_whose_batch_was_empty_then_suggests_its_line(ip):
    # each worker runs the same loop on its own replica; after stop, the line to run again
    # is this one, not the generic mirrored line
    from nbdist.cluster.multiworker.backend import live_clusters

    ip.run_line_magic("distribute", "stop")
    try:
        ip.run_line_magic("distribute", "multiworker --workers 2")
        run_ok(ip, "%%distribute\nimport numpy as np\nimport tensorflow as tf\n"
                   "short_w = tf.Variable(1.0)\nshort_opt = tf.keras.optimizers.SGD(0.01)\n"
                   "partial_ds = tf.data.Dataset.from_tensor_slices((np.ones((5, 3), 'float32'), "
                   "np.ones((5, 1), 'float32'))).batch(4)")
        err = run_err(ip, MEAN_STEP.format(data="partial_ds",
                                           loss="tf.reduce_mean(x * short_w)"))
        text = str(err)
        assert isinstance(err, NonFiniteLoss), repr(err)
        assert text.startswith("[worker 1] the loss is nan at step 1 (epoch 1) on replica 0,")
        assert ("Replica 0's batch at step 1 was empty (shapes (0, 3), (0, 1)), and the mean of "
                "an empty batch is NaN: that is the cause. This worker's share of the partial "
                "last batch of --data partial_ds held 0 examples") in text, text
        assert "drop_remainder=True" in text
        ip.run_line_magic("distribute", "stop")
        err = run_err(ip, MEAN_STEP.format(data="partial_ds", loss="1.0"))
        assert "Run `%distribute multiworker --workers 2` again (the last strategy of this " \
               "kernel) first" in str(err), str(err)
    finally:
        ip.run_line_magic("distribute", "stop")
        assert live_clusters() == []
        ip.run_line_magic("distribute", "mirrored --devices 4")
