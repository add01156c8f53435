"""Large tensors reused by the allocator, not mapped afresh on every step.

TensorFlow (2.21, Linux, Python >= 3.11) calls glibc's ``mallopt(M_MMAP_THRESHOLD, 128 KiB)``
whenever it builds a ``GeneratorDataset`` kernel, to mitigate a memory growth it saw with
``Dataset.from_generator``. Every distributed dataset iterator builds one (its
``MultiDeviceIterator`` feeds each device from a generator dataset), so the first step of a
step cell does it in the kernel (local strategies) and in every multiworker worker. Setting
the threshold also turns off glibc's dynamic threshold, which would otherwise rise to the size
of the buffers a program frees and reuse them. From then on every buffer of 128 KiB or more (a
step's tensors, the collective's receive buffers, the gRPC messages that carry them) is a fresh
``mmap``, zero-filled one page fault at a time, and unmapped when freed: at 4 MB per all-reduce,
two workers spent 2.4x the CPU per step of the same all-reduce in a process where TensorFlow had
not done this (``benchmarks/mw_step_cost.py``).

``keep_large_buffers`` sets what glibc's dynamic threshold would reach at most: the mmap
threshold to 32 MiB (``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit) and the trim threshold to twice
that (else the heap is trimmed back to the system as soon as 128 KiB at its top are free, and
the next step faults its pages in again). Freed buffers below 32 MiB then stay in the process
for the next step, as in any process TensorFlow left alone; larger ones still go back to the
system when freed. Elsewhere than glibc it does nothing.

The buffers kept stay with the process after its cell ends: ``release_free_memory`` (glibc's
``malloc_trim``) hands the free ones back once a cell is over, so a notebook session does not
keep the largest step's buffers (and freed row chunks) for the rest of the day.
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems (32 MiB).
LARGE_BUFFERS = 32 * 1024 * 1024

#: False leaves TensorFlow's setting alone (``benchmarks/mw_step_cost.py`` compares both).
enabled = True
_libc: Any = None


def _glibc(name: str) -> Any:
    """A glibc function, or False elsewhere."""
    global _libc
    if _libc is None:
        _libc = False
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                _libc = ctypes.CDLL(None)
            except OSError:
                pass
    return getattr(_libc, name, False) if _libc else False


def keep_large_buffers(threshold: int = LARGE_BUFFERS) -> bool:
    """Let buffers below ``threshold`` bytes be reused after they are freed (see the module
    doc); True if it was set (glibc only)."""
    mallopt = _glibc("mallopt") if enabled else None
    return (bool(mallopt) and mallopt(M_MMAP_THRESHOLD, threshold) == 1
            and mallopt(M_TRIM_THRESHOLD, 2 * threshold) == 1)


def release_free_memory() -> bool:
    """Give the system back the free memory the process's heaps hold (after a cell: a few
    ms); True if glibc did release some."""
    trim = _glibc("malloc_trim") if enabled else None
    return bool(trim) and trim(0) == 1
