"""Whether this kernel's TensorFlow can host a new strategy.

A family that binds the kernel's TensorFlow context for good (the parameter-server
coordinator, when it cannot detach from a cluster whose worker died) marks it here with
``taint``; every backend calls ``check_kernel_usable`` before it builds a strategy.
"""

from __future__ import annotations

from ..errors import ConfigError

#: Why this kernel's TensorFlow context cannot host another strategy (None: it can).
_TAINTED: str | None = None

RESTART_KERNEL = (
    "This kernel's TensorFlow context is still bound to the parameter-server cluster that "
    "was stopped ({why}), and TensorFlow cannot detach it safely. Restart the kernel "
    "(Kernel > Restart), then choose the strategy again."
)


def check_kernel_usable() -> None:
    """Raise a ConfigError if an earlier parameter-server session left the kernel unusable."""
    if _TAINTED is not None:
        raise ConfigError(RESTART_KERNEL.format(why=_TAINTED))


def taint(why: str) -> None:
    global _TAINTED
    _TAINTED = why
