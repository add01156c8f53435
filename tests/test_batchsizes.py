"""The words for uneven and empty replica batches (``nbdist.data.batchsizes``), from sizes
given by hand: the cases a kernel test does not reach cheaply (a worker's one replica, a
global batch not a multiple of the replicas, a short batch that is not empty)."""

from nbdist.data.batchsizes import ReplicaBatches

REPLICAS = ["replica 0", "replica 1"]


def batches(replicas: int = 2, **kwargs) -> ReplicaBatches:
    return ReplicaBatches("ds", per_replica=False, replicas=replicas, **kwargs)


def test_a_global_batch_not_a_multiple_of_the_replicas_is_noted_at_the_first_step():
    seen = batches()
    note = seen.observe([2.0, 1.0], 0, REPLICAS)
    assert note is not None and note.startswith(
        "step 0: the batch of 3 examples is not a multiple of the 2 replicas, so TensorFlow "
        "split it 2 + 1 across them: replica 1's batch held 1 example."), note
    assert "a multiple of the 2 replicas (e.g. 4 instead of 3)" in note
    assert seen.observe([1.0, 0.0], 3, REPLICAS) is None   # once a run


def test_whole_batches_say_nothing():
    seen = batches()
    assert seen.observe([4.0, 4.0], 0, REPLICAS) is None
    assert seen.observe([4.0, 4.0], 1, REPLICAS) is None
    assert seen.nonfinite_cause([4.0, 4.0], 1, [0], REPLICAS, None) is None


def test_a_short_batch_that_is_not_empty_is_a_possible_cause_only():
    seen = batches()
    seen.observe([4.0, 4.0], 0, REPLICAS)
    text, certain = seen.nonfinite_cause([2.0, 1.0], 5, [1], REPLICAS,
                                         lambda: ["(2, 3)", "(1, 3)"])
    assert not certain
    assert text.startswith("At step 5 a batch was short (replica 0's: (2, 3); replica 1's: "
                           "(1, 3)). The partial last batch of --data ds (3 examples"), text
    assert text.endswith("if that is not it:"), text


def test_a_worker_of_one_replica_compares_with_its_first_step():
    # parameter_server: one replica per worker, named by the worker; the global batch is
    # what the worker read
    seen = batches(replicas=1)
    seen.observe([8.0], 0, ["worker 1"])
    text, certain = seen.nonfinite_cause([0.0], 9, [0], ["worker 1"], None)
    assert certain
    assert text.startswith("Worker 1's batch at step 9 was empty, and the mean of an empty "
                           "batch is NaN: that is the cause."), text
    assert "`.batch(8, drop_remainder=True)`" in text, text
    assert ("The partial last batch of --data ds (0 examples, where the first step's held 8: "
            "the dataset's length is not a multiple of its batch size): worker 1's batch was "
            "empty.") in text, text


def test_shapes_that_cannot_be_read_leave_them_out():
    seen = batches()
    seen.observe([4.0, 4.0], 0, REPLICAS)

    def broken():
        raise RuntimeError("no shapes")

    text, _ = seen.nonfinite_cause([1.0, 0.0], 1, [1], REPLICAS, broken)
    assert text.startswith("Replica 1's batch at step 1 was empty, and the mean"), text


def test_a_multiworker_worker_speaks_of_its_share_of_the_global_batch():
    # a worker of 1 replica among 2 in sync: it sees its share only, and no global batch size
    seen = batches(replicas=2)
    seen.observe([2.0], 0, ["replica 0"])
    text, certain = seen.nonfinite_cause([0.0], 1, [0], ["replica 0"], lambda: ["(0, 3)"])
    assert certain
    assert ("Replica 0's batch at step 1 was empty (shape (0, 3)), and the mean of an empty "
            "batch is NaN: that is the cause. This worker's share of the partial last batch of "
            "--data ds held 0 examples, where its first step's held 2") in text, text
    assert "`.batch(GLOBAL_BATCH, drop_remainder=True)`" in text, text
