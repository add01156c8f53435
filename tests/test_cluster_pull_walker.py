"""The walker behind `%distribute pull`: framework objects found wherever pickle would reach
them, on real TensorFlow objects in this process."""

from __future__ import annotations

import time

import numpy as np

from nbdist.cluster import sendable


# -- the walker, in this process ---------------------------------------------------------------
def test_the_walker_finds_framework_objects_wherever_pickle_would_reach_them():
    import tensorflow as tf

    variable = tf.Variable(1.0)

    class Box:
        pass

    box = Box()
    box.inner = {"x": [1, (2, variable)]}
    loop: list = []
    loop.append(loop)

    def closes_over():
        return variable

    assert sendable.find_unsendable(box, "box") == {
        "path": "box.inner['x'][1][1]", "kind": "variable",
        "type": "tensorflow.python.ops.resource_variable_ops.ResourceVariable"}
    assert sendable.find_unsendable(closes_over, "f")["path"] == "a variable f closes over"
    for plain in (loop, {"loss": [0.5, 0.25]}, tf.constant([1.0]), tf.TensorShape([2]),
                  tf.float32, np.zeros(3), [np.ones(2)] * 3, tf, tf.Variable):
        assert sendable.find_unsendable(plain, "x") is None, plain
    assert sendable.find_unsendable(tf.data.Dataset.range(2), "ds")["kind"] == "dataset"
    assert sendable.find_unsendable(tf.function(lambda: 1), "f")["kind"] == "function"
    assert sendable.find_unsendable(tf.ragged.constant([[1]]), "r")["kind"] == "tensorflow"
    nested = variable
    for _ in range(sendable.MAX_DEPTH + 1):
        nested = [nested]
    assert sendable.find_unsendable(nested, "n") is None   # deeper than looked: not found
    big = [*range(2_000_000), variable]
    start = time.monotonic()
    assert sendable.find_unsendable(big, "big") is None
    assert time.monotonic() - start < 0.5   # bounded: MAX_OBJECTS
