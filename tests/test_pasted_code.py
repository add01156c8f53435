"""Pasted code read as source (nbdist.step.pasted): strategy constructors and TF_CONFIG found
however they are written."""


import pytest


@pytest.mark.parametrize(("code", "found"), [
    ("s = tf.distribute.MirroredStrategy()", ["MirroredStrategy"]),
    ("from tensorflow.distribute import MirroredStrategy as MS\ns = MS()", ["MirroredStrategy"]),
    ("import tensorflow\ns = tensorflow.distribute.OneDeviceStrategy('/cpu:0')",
     ["OneDeviceStrategy"]),
    ("s = tf.distribute.experimental.CentralStorageStrategy()", ["CentralStorageStrategy"]),
    ("from tensorflow import distribute as d\ns = d.experimental.MultiWorkerMirroredStrategy()",
     ["MultiWorkerMirroredStrategy"]),
    ("s = tf.distribute.experimental.ParameterServerStrategy(resolver)",
     ["ParameterServerStrategy"]),
    ("s = tf.distribute.TPUStrategy(resolver)", ["TPUStrategy"]),
    ("def f():\n    return tf.distribute.MirroredStrategy(\n        devices=['/cpu:0'])",
     ["MirroredStrategy"]),
    ("ok = isinstance(s, tf.distribute.MirroredStrategy)", []),
    ("s = tf.distribute.get_strategy()", []),
    ("s = mine.MirroredStrategy()", []),
])
def test_strategy_constructors_are_found_however_they_are_imported(code, found):
    from nbdist.step.pasted import pasted_code, replaced

    calls = pasted_code(code).strategies
    assert [c.class_name for c in calls] == found
    rewritten = replaced(code, calls)
    assert len(rewritten.splitlines()) == len(code.splitlines())   # errors keep their lines
    assert rewritten.count('__import__("nbdist").strategy()') == len(found)


@pytest.mark.parametrize("code", [
    "os.environ['TF_CONFIG'] = json.dumps(tf_config)",
    'os.environ.update(TF_CONFIG=\'{"cluster": {"worker": ["a:1"]}}\')',
    "os.environ.setdefault('TF_CONFIG', text)",
    "os.putenv('TF_CONFIG', text)",
])
def test_tf_config_is_found_however_it_is_set(code):
    from nbdist.step.pasted import pasted_code

    assert [c.line for c in pasted_code(code).tf_config] == [1]
