"""Checks on the dataset a step-mode cell trains on, before anything is traced."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError, DataError

_MISSING = object()


def lookup_dataset(user_ns: dict[str, Any], name: str) -> Any:
    """The ``--data`` variable from the user's namespace, or a DataError saying what is wrong."""
    value = user_ns.get(name, _MISSING)
    if value is _MISSING:
        raise DataError(
            f"--data {name}: there is no variable `{name}` in the notebook. Create the "
            f"tf.data.Dataset first (e.g. `{name} = tf.data.Dataset.from_tensor_slices((x, y))"
            ".batch(64)`) or pass the right name."
        )
    return value


def check_dataset(dataset: Any, name: str, replicas: int, max_steps: int | None) -> None:
    """Raise if ``dataset`` cannot be split across ``replicas`` (or would never end)."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"--data {name} is a {type(dataset).__module__}.{type(dataset).__name__}, not a "
            "tf.data.Dataset. Wrap it: `tf.data.Dataset.from_tensor_slices((x, y))"
            ".batch(GLOBAL_BATCH)`."
        )
    specs = tf.nest.flatten(dataset.element_spec)
    unbatched = [s for s in specs if getattr(s, "shape", None) is not None and s.shape.rank == 0]
    if unbatched:
        raise DataError(
            f"--data {name} yields single examples (a scalar component of shape ()), which "
            f"cannot be split across {replicas} replicas. Batch it with the global batch size: "
            f"`{name} = {name}.batch(GLOBAL_BATCH, drop_remainder=True)`."
        )
    sizes = {s.shape[0] for s in specs if getattr(s, "shape", None) is not None
             and s.shape.rank and s.shape[0] is not None}
    if not sizes:  # batch size not static (no drop_remainder): look at the first element
        first = next(iter(dataset.take(1)), None)
        sizes = {int(t.shape[0]) for t in tf.nest.flatten(first)
                 if getattr(t, "shape", None) is not None and t.shape.rank}
    small = [b for b in sizes if b < replicas]
    if small:
        raise DataError(
            f"--data {name} has batches of {min(small)} examples, fewer than the {replicas} "
            "replicas, so some replicas would get no data. Use a global batch size of at least "
            f"{replicas} (ideally a multiple of it)."
        )
    if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY and max_steps is None:
        raise ConfigError(
            f"--data {name} repeats forever, so an epoch never ends. Give --steps N "
            "(steps per epoch) or drop the `.repeat()`."
        )


def steps_per_epoch(dataset: Any, max_steps: int | None) -> int | None:
    """Steps in one epoch when known (for progress and ETA), else None."""
    import tensorflow as tf

    card = int(dataset.cardinality())
    if card == tf.data.INFINITE_CARDINALITY:
        return max_steps
    if card < 0:
        return max_steps
    return card if max_steps is None else min(card, max_steps)
