"""patched(): class attributes replaced inside a block, each class left exactly as it was."""

import pytest

from nbdist.patching import patched


class Base:
    def greet(self):
        return "base"

    @staticmethod
    def tool():
        return "tool"


class Child(Base):
    pass


def test_inherited_attributes_are_removed_again_and_own_ones_restored():
    original_tool = Base.__dict__["tool"]
    with patched([(Child, "greet", lambda self: "child"), (Base, "tool", staticmethod(str))]):
        assert Child().greet() == "child" and Base().greet() == "base"
        assert Base.tool() == ""
    assert "greet" not in Child.__dict__ and Child().greet() == "base"
    assert Base.__dict__["tool"] is original_tool and Child.tool() == "tool"


def test_values_wrapping_the_original_are_read_before_any_is_set():
    wrap = Base.greet
    with patched((cls, "greet", lambda self, f=wrap: f(self) + "!") for cls in (Base, Child)):
        assert Child().greet() == "base!"   # not wrapped twice through Base's replacement
    assert Child().greet() == "base"


def test_an_error_in_the_block_still_restores():
    with pytest.raises(RuntimeError), patched([(Base, "greet", lambda self: "x")]):
        raise RuntimeError("boom")
    assert Base().greet() == "base"
