"""A step cell over a distributed dataset leaves large buffers reusable (nbdist.allocator).

TensorFlow's distributed iterator sets glibc's mmap threshold to 128 KiB (and turns off its
dynamic threshold): without nbdist's correction every buffer of 128 KiB or more is mapped,
zero-filled and unmapped again on every step. What a malloc of 30 MiB does after the cell
tells the two apart: mapped on its own (counted in mallinfo2's ``hblks``), or taken from the
heap and, once freed, kept there for the next step (the heap is not trimmed back).
"""

import ctypes
import platform
import time

import pytest
from helpers import mallinfo2, run_ok

import nbdist.allocator as allocator

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")

SETUP = """
import tensorflow as tf
alloc_ds = tf.data.Dataset.from_tensor_slices(tf.ones([16])).batch(4, drop_remainder=True)
"""
STEP = """%%distribute --step --data alloc_ds --timing-every 0
big = tf.fill([1 << 20], tf.reduce_sum(batch))   # 4 MB per replica and step
loss = tf.reduce_mean(big)
"""


def reused(size: int) -> bool:
    """Whether a malloc of ``size`` bytes comes from the heap and stays there once freed.

    Mapped on its own or not is read off the chunk itself (glibc's IS_MMAPPED bit, bit 1 of
    the size word just before the pointer), not from mallinfo2's count of mapped chunks, which
    TensorFlow's threads change at the same time."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    pointer = libc.malloc(size)
    word = ctypes.sizeof(ctypes.c_size_t)
    mapped = bool(ctypes.c_size_t.from_address(pointer - word).value & 2)
    held = mallinfo2().arena
    libc.free(pointer)
    kept = mallinfo2().arena
    return not mapped and kept > held - size // 2


def test_step_cell_leaves_large_buffers_reusable(ip, monkeypatch):
    run_ok(ip, SETUP)
    # TensorFlow's own setting, as a hand-written loop over the same dataset leaves it
    monkeypatch.setattr(allocator, "enabled", False)
    ctypes.CDLL(None).mallopt(-1, 128 << 10)   # glibc's default trim threshold, as at start
    run_ok(ip, STEP)
    assert not reused(30 << 20), "TensorFlow's iterator no longer sets 128 KiB"
    monkeypatch.setattr(allocator, "enabled", True)
    run_ok(ip, STEP)
    assert reused(30 << 20)


def test_the_heap_s_free_memory_goes_back_to_the_system_when_a_cell_ends(ip):
    """Buffers kept for the next step are not kept for the rest of the session: 30 MiB freed
    into the heap before a step cell are no longer resident soon after it."""
    import psutil

    run_ok(ip, SETUP)
    run_ok(ip, STEP)   # the allocator's setting is in place (reused above)
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size = 30 << 20
    pointer = libc.malloc(size)
    ctypes.memset(pointer, 1, size)          # resident
    me = psutil.Process()
    touched = me.memory_info().rss
    libc.free(pointer)                        # back in the heap, still resident
    assert me.memory_info().rss > touched - size // 2, "glibc returned it at once"
    run_ok(ip, STEP)
    deadline = time.monotonic() + 10     # after its iterators are deleted, on their thread
    while me.memory_info().rss >= touched - size // 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert me.memory_info().rss < touched - size // 2


def test_the_heap_is_trimmed_after_the_cell_and_its_iterators_are_gone(ip, monkeypatch):
    """When the magic returns, its frames and the distributed iterator it deletes on a thread
    still hold freed buffers (13 MB after a 50,000-step mirrored cell, ``benchmarks/soak.py``):
    the heap is trimmed once the cell is over and every iterator it handed over is deleted."""
    import sys

    import nbdist.data.iterate as iterate
    from nbdist.session import Session

    calls = []

    def record() -> bool:
        frame, codes = sys._getframe(1), set()
        while frame is not None:
            codes.add(frame.f_code)
            frame = frame.f_back
        calls.append({"iterators held": iterate.pending(),
                      "inside the magic": Session._run.__code__ in codes})
        return True

    assert iterate.wait_released(10)   # and the trim an earlier test's cell left to them
    monkeypatch.setattr(iterate, "release_free_memory", record)
    run_ok(ip, SETUP)
    assert calls == []                       # a cell without %%distribute: nothing to trim
    run_ok(ip, STEP)
    assert iterate.wait_released(10)
    assert calls == [{"iterators held": 0, "inside the magic": False}]
