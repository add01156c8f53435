"""Whether this kernel's TensorFlow can host a new strategy, and what a cell whose strategy
differs from the kernel's is told (``strategy_mismatch``).

A family that binds the kernel's TensorFlow context for good (the parameter-server
coordinator, when it cannot detach from a cluster whose worker died) marks it here with
``taint``; every backend calls ``check_kernel_usable`` before it builds a strategy.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..hooks.tensorflow import eager_context_initialized
from ..spec import StrategySpec
from ..strategies import TOO_LATE, physical_gpus
from ..words import count

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


def why_cannot_host(spec: StrategySpec) -> str | None:
    """Why this kernel cannot switch to ``spec`` without a restart (what building it would
    raise), or None. Changes nothing: a refused cell line uses it to give advice that works."""
    if _TAINTED is not None:
        return RESTART_KERNEL.format(why=_TAINTED)
    want = spec.devices or 1
    if not spec.family.kernel_devices or want < 2:
        return None
    import tensorflow as tf

    if gpus := physical_gpus():
        return None if want <= len(gpus) else f"--devices {want}: there are {len(gpus)} GPUs."
    split = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("CPU")[0])
    if (split and len(split) >= want) or not eager_context_initialized():
        return None
    return TOO_LATE.format(have=count(len(tf.config.list_logical_devices("CPU")), "CPU device"),
                           want=want,
                           name=spec.name)


def strategy_mismatch(inline: StrategySpec, current: StrategySpec) -> str:
    """A cell's strategy differs from the kernel's: what to do, checked to work."""
    asked = f"This cell asks for `{inline.magic_line()}` but the kernel's strategy is " \
            f"`{current.magic_line()}`."
    blocked = why_cannot_host(inline)
    if blocked is not None:   # switching in this kernel would fail: say so, and the way out
        return (f"{asked} Drop the strategy from the cell line to run on the kernel's. "
                f"This kernel cannot switch: {blocked}")
    return (f"{asked} Drop the strategy from the cell line to run on the kernel's, or switch "
            f"first with `{inline.magic_line()}` on a line of its own, then create the model "
            "and optimizer again in a `%%distribute` cell (variables belong to the strategy "
            "they were made under) and run this cell.")
