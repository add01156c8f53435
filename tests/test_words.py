"""Counted nouns read as English, including multi-word and irregular ones."""

from nbdist.words import count


def test_counted_nouns():
    assert count(1, "replica") == "1 replica"
    assert count(4, "replica") == "4 replicas"
    assert count(0, "step") == "0 steps"
    assert count(3, "op") == "3 ops"
    assert count(2, "process") == "2 processes"
    assert count(2, "worker process") == "2 worker processes"
    assert count(1, "fresh worker process") == "1 fresh worker process"
    assert count(2, "parameter server") == "2 parameter servers"
    assert count(2, "index", "indices") == "2 indices"
