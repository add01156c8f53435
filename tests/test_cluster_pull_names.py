"""The names `%distribute pull` takes: a variable with attributes and literal keys."""

from __future__ import annotations

import pytest

from nbdist.cluster import sendable


def test_pull_names_are_a_variable_with_attributes_and_literal_keys():
    assert sendable.parse_name("history.history['loss'][-1]") == [
        ("name", "history"), ("attr", "history"), ("item", "loss"), ("item", -1)]
    for bad in ("f()", "a[1:2]", "a + b", "x[y]", "", "1"):
        with pytest.raises(ValueError):
            sendable.parse_name(bad)
