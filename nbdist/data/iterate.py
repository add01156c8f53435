"""Iterating ``--data``: batches with the time spent fetching each, and iterators that never
make a cell wait for TensorFlow to delete them.

Deleting a tf.data iterator joins its autotuning thread (the ``tf_data_model`` thread that
TensorFlow starts for every iterator's pipeline). In TensorFlow 2.21 that thread can miss the
cancellation: ``CancellationManager::StartCancel`` runs the callback that wakes it *before* it
marks itself cancelled, so the woken thread may see "not cancelled" and sleep out the rest of
its tuning period, which doubles from 10 ms up to 60 s while the iterator is read. A
distributed dataset's iterator over N local devices holds N + 1 pipelines (the host's and one
per device), joined one after another, each doubling its period while it waits its turn:
``del iterator`` could block a cell for tens of seconds at random
(``benchmarks/iterator_delete.py`` reproduces it with plain TensorFlow, and shows that with
autotuning off the wait disappears).

So nbdist builds the per-device pipelines without autotuning (``new_iterator``: they have
nothing to tune; the user's pipeline keeps its options), and deletes each iterator on a
thread of its own (``release``): the wait releases the GIL, and the iterator's memory is
freed when it ends, after at most one tuning period (at exit, Python waits for it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..allocator import keep_large_buffers, release_free_memory
from ..hooks.tf_data import untuned_device_pipelines
from .freshstack import on_fresh_stack

# After ``release`` returns, the caller drops its own reference (``it = release(it)``); wait this
# long for that before dropping ours anyway (then whoever holds the last one deletes it).
_HANDOVER_S = 1.0
RELEASE_THREAD = "nbdist-iterator-release"

_idle = threading.Condition()
_in_hand = [0]
_release_memory_after = [False]   # release_free_memory_when_idle asked while iterators were held


def new_iterator(dataset: Any) -> Any:
    """``iter(dataset)``, built away from the cell's code (``freshstack``); a distributed
    one's per-device pipelines do not autotune."""
    return on_fresh_stack(_untuned_iter, dataset, abandoned=release)


def _untuned_iter(dataset: Any) -> Any:
    with untuned_device_pipelines():
        return iter(dataset)


def release(iterator: Any) -> None:
    """Delete ``iterator`` on a thread of its own; returns None, so that
    ``iterator = release(iterator)`` leaves that thread the only reference."""
    if iterator is None:
        return None
    with _idle:
        _in_hand[0] += 1
    # Not a daemon: Python waits for it at exit, since one still inside TensorFlow when the
    # interpreter finalises aborts the process ("terminate called ...").
    threading.Thread(target=_drop, args=([iterator],), name=RELEASE_THREAD).start()
    return None


def pending() -> int:
    """Iterators handed over and not yet deleted."""
    with _idle:
        return _in_hand[0]


def wait_released(timeout: float) -> bool:
    """Wait until every iterator handed over so far is deleted (and the heap trimmed, if
    ``release_free_memory_when_idle`` asked for it); False if ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    with _idle:
        while _in_hand[0]:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _idle.wait(left)
    return True


def release_free_memory_when_idle() -> None:
    """``allocator.release_free_memory`` now or, while iterators handed over are still being
    deleted, once the last one is: deleting a distributed iterator frees its pipelines' buffers,
    which ``keep_large_buffers`` would otherwise keep in the heap for the rest of the session."""
    with _idle:
        if _in_hand[0]:
            _release_memory_after[0] = True
            return
    release_free_memory()


def _drop(box: list[Any]) -> None:
    item = box.pop()
    deadline = time.monotonic() + _HANDOVER_S
    # 2 references: ``item`` and getrefcount's argument; more: the caller's is still alive.
    while sys.getrefcount(item) > 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    del item   # TensorFlow's wait, if any, happens here
    with _idle:
        _in_hand[0] -= 1
        if not _in_hand[0] and _release_memory_after[0]:
            _release_memory_after[0] = False
            release_free_memory()   # before the waiters wake: wait_released() includes it
        _idle.notify_all()


def skip_batches(iterator: Any, n: int) -> int:
    """Advance ``iterator`` by ``n`` batches (those a resumed run already trained on: a
    distributed iterator cannot be checkpointed); returns how many there were."""
    for done in range(n):
        try:
            next(iterator)
        except StopIteration:
            return done
    return n


def timed_batches(dataset: Any, max_steps: int | None,
                  first: Callable[[Any], None] | None = None,
                  skip: int = 0) -> Iterator[tuple[Any, float]]:
    """Yield (batch, milliseconds spent fetching it), at most ``max_steps`` per epoch, after
    skipping its first ``skip`` (counted in ``max_steps``); after the first fetched, large
    buffers are reused again (``nbdist.allocator``). ``first`` is called with the first batch
    yielded before it is yielded (outside the fetch time)."""
    iterator = new_iterator(dataset)
    count = 0
    try:
        if skip:
            count = skip_batches(iterator, skip)
            keep_large_buffers()
            if count < skip:
                return
        while max_steps is None or count < max_steps:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            count += 1
            fetch_ms = (time.perf_counter() - start) * 1e3
            if count == skip + 1:   # the first batch built the distributed iterator's pipelines
                keep_large_buffers()
                if first is not None:
                    first(batch)
            yield batch, fetch_ms
    finally:   # also when the loop stops early and closes this generator
        iterator = release(iterator)


def first_element(dataset: Any) -> Any:
    """The first element of a tf.data.Dataset (None if it is empty)."""
    iterator = iter(dataset.take(1))
    try:
        return next(iterator, None)
    finally:
        iterator = release(iterator)
