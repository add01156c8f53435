"""TensorFlow's parameter-server tutorial typed into nbdist cells: ``--partitioner`` shards its
Embedding over 2 parameter servers, step mode trains it with ``--checkpoint`` (no false
warning), and its distributed evaluation under CPU stress counts every scheduled step once.
Run in a fresh interpreter (tests/ps_tutorial_scenario.py, through ps_scenario.py)."""

import re

import pytest
from test_paramserver import scenario

from nbdist.cluster.paramserver.backend import live_ps_clusters
from nbdist.errors import ConfigError
from nbdist.session import current_session


@pytest.fixture(scope="module")
def tutorial():
    return scenario("tutorial")


@pytest.mark.parametrize("line, expected", [
    ("parameter_server --partitioner min_size", "is not a partitioner: give KIND:NUMBER"),
    ("parameter_server --partitioner fixed:0", "is not a partitioner"),
    ("parameter_server --partitioner fixed:2k", "is not a partitioner"),
    ("parameter_server --partitioner round:3", "`min_size:BYTES`"),
    ("mirrored --partitioner fixed:2", "which `mirrored` does not have"),
])
def test_a_bad_partitioner_is_refused_before_anything_starts(ip, line, expected):
    before = current_session().backend
    with pytest.raises(ConfigError) as info:
        ip.run_line_magic("distribute", line)
    assert expected in str(info.value) and "\n" not in str(info.value)
    assert live_ps_clusters() == [] and current_session().backend is before


def test_the_partitioner_is_in_status_and_its_equivalent_code(tutorial):
    assert tutorial["start_error"] is None
    status = tutorial["status"]
    made = ("tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=1024, "
            "max_shards=2)")
    assert f"variables  sharded by {made} (--partitioner)" in status
    assert f"ParameterServerStrategy(resolver, variable_partitioner={made})" in status
    assert "--partitioner min_size:1k" in status            # the magic line


def test_the_embedding_is_sharded_over_both_parameter_servers_and_trains(tutorial):
    assert tutorial["setup_error"] is None
    assert sorted(tutorial["shards"]) == [f"/job:ps/replica:0/task:{i}/device:CPU:0"
                                          for i in (0, 1)]
    assert tutorial["emb_error"] is None
    emb = tutorial["emb"]
    assert emb["status"] == "done" and emb["steps"] == 24
    # Each worker reads its own copy of the data, and the two update the weights
    # asynchronously: single steps may spike, so the epochs' medians are compared.
    first, *_, last = emb["epoch_median"]
    assert last < 0.2 * first, emb["rows"]


def test_a_keras3_model_with_sharded_variables_is_refused_before_it_trains(tutorial):
    note = [ln for ln in tutorial["start_printed"].splitlines() if "nbdist: note:" in ln]
    assert note and "Keras 3 layers and optimizers cannot train the ShardedVariables" in note[0]
    error = tutorial["k3_error"]
    assert error.startswith("StepCodeError: cell line 4 `loss = tf.reduce_mean(")
    assert re.search(r"`k3_model` \(Sequential\) holds the Keras 3 variable `[^`]*embeddings`",
                     error) and "do not support tf.distribute's ShardedVariable" in error
    assert "`import tf_keras`" in error and "without --partitioner" in error
    assert "\n" not in error and "object has no attribute 'handle'" in error   # quoted, not raised
    assert tutorial["k3_unchanged"]      # no Run, optimizer unbuilt, weights as they were


def test_checkpoint_warns_only_when_a_trained_variable_is_not_saved(tutorial):
    warning = "--checkpoint does not save"
    assert not any(warning in n for n in tutorial["emb"]["notes"])     # sharded, tf_keras
    assert tutorial["complete_error"] is None
    assert not any(warning in n for n in tutorial["complete_notes"])   # Keras 3
    assert tutorial["reached_error"] is None   # model reached as things["net"]: not saved
    missing = [n for n in tutorial["reached_notes"] if warning in n]
    assert missing and missing[0].startswith(f"{warning} 4 trainable variables")


@pytest.mark.parametrize("name", ["tf_keras", "keras3"])
def test_distributed_evaluation_under_cpu_stress_counts_each_step_once(tutorial, name):
    assert tutorial[f"{name}_eval_error"] is None
    inline = tutorial[f"{name}_inline"]
    for accuracy, count in tutorial[f"{name}_eval"]:
        assert count == 8 * 64                         # 8 steps of 64 examples, none lost
        assert accuracy == pytest.approx(inline, abs=1e-6)
    if name == "tf_keras":
        assert inline == 1.0
