"""Every private third-party API nbdist uses still exists in the installed libraries, and the
hooks work on their real objects (TensorFlow, Keras, tf_keras imported in this process; the
source scan and the fallbacks on stand-in objects are tests/test_private_apis.py)."""

from __future__ import annotations

from typing import Any

import pytest
from test_private_apis import _require_installed

from nbdist import hooks
from nbdist.hooks import keras as keras_hooks
from nbdist.hooks import tensorflow as tf_hooks
from nbdist.hooks import tf_data, tf_gradients


@pytest.mark.parametrize("api", hooks.REGISTRY, ids=lambda api: f"{api.library}:{api.hook}")
def test_declared_private_api_exists(api: hooks.PrivateAPI) -> None:
    _require_installed(api)
    why = api.missing()
    assert why is None, api.explain(why)


def test_check_finds_nothing_missing() -> None:
    assert hooks.check() == []


def test_tensorflow_hooks_on_real_objects() -> None:
    import tensorflow as tf

    fn = tf.function(lambda x: x * 2)
    concrete = fn.get_concrete_function(tf.constant(3))
    assert tf_hooks.can_call_flat(concrete)
    assert int(tf_hooks.call_flat(concrete, [tf.constant(4)])) == 8
    assert tf_hooks.quiet_retracing_warning(fn) and fn._omit_frequent_tracing_warning
    assert tf_hooks.eager_context_initialized()
    assert tf_hooks.server_def() is None       # this process is in no cluster
    tf_hooks.detach_from_cluster()             # nothing to detach: a no-op
    assert isinstance(tf.Variable(1.0), tf_hooks.trackable_class())


def test_atomic_updates_change_only_parameter_server_variables() -> None:
    """A Keras 3 variable of this process keeps Keras' own read-then-write ``assign_add``
    while the hook is active; one on a ``/job:ps/`` device gets the atomic op (the cluster
    tests check the counts that depend on it)."""
    import keras
    import tensorflow as tf

    def update_ops(variable: Any) -> set[str]:
        graph = tf.function(lambda: variable.assign_add(1.0)).get_concrete_function().graph
        return {op.type for op in graph.get_operations()} & {"AssignVariableOp",
                                                              "AssignAddVariableOp"}

    local = keras.Variable(0.0)
    with keras_hooks.atomic_variable_updates():
        assert update_ops(local) == {"AssignVariableOp"}
        local.assign_add(2.0)
    assert float(local.numpy()) == 2.0
    placed = type("Placed", (), {"device": "/job:ps/replica:0/task:1/device:CPU:0"})()
    assert keras_hooks.on_parameter_server(placed)
    assert not keras_hooks.on_parameter_server(local.value)
    assert not keras_hooks.on_parameter_server(object())


def test_gradient_registrations_of_a_trace_are_recorded_and_released() -> None:
    import tensorflow as tf

    @tf.custom_gradient
    def doubled_grad(x):
        return tf.identity(x), lambda dy: 2 * dy

    @tf.function
    def f(x):
        return doubled_grad(x)

    from nbdist.hooks.tf_gradients import _gradient_registry

    keys: list[str] = []
    with tf_gradients.recording_gradient_registrations(keys):
        concrete = f.get_concrete_function(tf.TensorSpec([], tf.float32))
    assert keys and all(k.startswith("CustomGradient") for k in keys)
    assert set(keys) <= set(_gradient_registry())
    x = tf.constant(3.0)
    with tf.GradientTape() as tape:   # still held: its gradient must still work
        tape.watch(x)
        y = concrete(x)
    assert tape.gradient(y, x).numpy() == 2.0
    recorded = list(keys)
    tf_gradients.release_gradient_registrations(keys)
    assert keys == [] and not set(recorded) & set(_gradient_registry())
    with tf_gradients.recording_gradient_registrations(keys):
        pass   # nothing traced, nothing recorded
    assert keys == []


def test_untuned_device_pipelines_turn_autotuning_off_only_inside(monkeypatch) -> None:
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops as mdi

    with tf_data.untuned_device_pipelines():   # a real iterator over the wrapped pipelines
        iterator = mdi.OwnedMultiDeviceIterator(tf.data.Dataset.range(6).batch(2),
                                                devices=["/cpu:0"])
    assert [int(tf.reduce_sum(next(iterator)[0])) for _ in range(3)] == [1, 5, 9]
    built = tf.data.Dataset.range(3)
    monkeypatch.setattr(mdi, "_create_device_dataset", lambda *args, **kwargs: built)
    original = mdi._create_device_dataset
    with tf_data.untuned_device_pipelines():
        with tf_data.untuned_device_pipelines():   # nested: wrapped once
            inside = mdi._create_device_dataset(None, None, 1, False)
        assert inside.options().autotune.enabled is False
        assert list(inside.as_numpy_iterator()) == [0, 1, 2]
    assert mdi._create_device_dataset is original
    assert built.options().autotune.enabled is not False
    monkeypatch.delattr(mdi, "_create_device_dataset")
    with tf_data.untuned_device_pipelines():   # gone: nothing to do
        assert not hasattr(mdi, "_create_device_dataset")


def test_pipeline_stages_name_the_stage_that_runs_python() -> None:
    import tensorflow as tf

    def same(x):
        return x

    base = tf.data.Dataset.range(8).batch(2)
    serial = base.map(lambda x: tf.py_function(same, [x], tf.int64)).repeat()
    parallel = base.map(lambda x: tf.numpy_function(same, [x], tf.int64),
                        num_parallel_calls=2).prefetch(1)
    assert [(s.op, s.python) for s in tf_data.pipeline_stages(serial)] == [
        ("RangeDataset", ()), ("BatchDatasetV2", ()), ("MapDataset", ("tf.py_function",)),
        ("RepeatDataset", ())]
    assert [(s.op, s.python) for s in tf_data.pipeline_stages(parallel)][2:] == [
        ("ParallelMapDatasetV2", ("tf.numpy_function",)), ("PrefetchDataset", ())]
    assert tf_data.pipeline_stages(object()) is None
