"""Checks on ``--data`` before anything is traced: batched, big enough for the replicas, an
epoch that ends, made with the session's strategy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import ConfigError, DataError
from .iterate import first_element
from .kinds import ACCEPTED, DATASET, GET_STRATEGY, StepData


def check_dataset(dataset: Any, name: str, replicas: int, max_steps: int | None) -> None:
    """Raise if ``dataset`` cannot be split across ``replicas`` (or would never end)."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(f"--data {name} is a {type(dataset).__module__}."
                        f"{type(dataset).__name__}, not a tf.data.Dataset. {ACCEPTED}.")
    specs = flat_specs(dataset.element_spec)
    refuse_unbatched(specs, StepData(name, DATASET, dataset))
    static = {s.shape[0] for s in specs if s.shape.rank and s.shape[0] is not None}
    sizes = static
    if not sizes:  # batch size not static (no drop_remainder): look at the first element
        first = first_element(dataset)
        sizes = {int(t.shape[0]) for t in tf.nest.flatten(first)
                 if getattr(t, "shape", None) is not None and t.shape.rank}
    small = [b for b in sizes if b < replicas]
    if small:
        maybe_unbatched = (
            f" If it is not batched (its elements are single examples of shape "
            f"{_shapes(dataset.element_spec)}), batch it with the global batch size: "
            f"`{name} = {name}.batch(GLOBAL_BATCH, drop_remainder=True)`." if static else "")
        raise DataError(
            f"--data {name} has batches of {min(small)} examples, fewer than the {replicas} "
            "replicas, so some replicas would get no data. Use a global batch size of at least "
            f"{replicas} (ideally a multiple of it).{maybe_unbatched}"
        )
    if int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY and max_steps is None:
        raise ConfigError(
            f"--data {name} repeats forever, so an epoch never ends. Give --steps N "
            "(steps per epoch) or drop the `.repeat()`."
        )


def steps_per_epoch(dataset: Any, max_steps: int | None) -> int | None:
    """Steps in one epoch of a tf.data.Dataset of global batches when known, else None."""
    import tensorflow as tf

    card = int(dataset.cardinality())
    if card == tf.data.INFINITE_CARDINALITY:
        return max_steps
    if card < 0:
        return max_steps
    return card if max_steps is None else min(card, max_steps)


def flat_specs(element_spec: Any) -> list[Any]:
    """The TensorSpecs of an element (of every replica's part, for a distributed one)."""
    import tensorflow as tf

    return [s for s in tf.nest.flatten(element_spec, expand_composites=True)
            if getattr(s, "shape", None) is not None and s.shape.rank is not None]


def _unbatched(specs: list[Any]) -> bool:
    """Elements that cannot be batches: a scalar component, or components whose (static)
    first dimensions differ (every component of a batch has the batch size first)."""
    if any(s.shape.rank == 0 for s in specs):
        return True
    firsts = {s.shape[0] for s in specs if s.shape[0] is not None}
    return len(firsts) > 1


def refuse_unbatched(specs: list[Any], data: StepData) -> None:
    if not _unbatched(specs):
        return
    name = data.name
    shapes = ", ".join(str(tuple(s.shape)) for s in specs)
    if data.kind == DATASET:
        fix = (f"Batch it with the global batch size: `{name} = {name}.batch(GLOBAL_BATCH, "
               "drop_remainder=True)`.")
    else:
        fix = ("Batch the dataset the function returns with the per-replica batch size: "
               "`dataset.batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH))`.")
    raise DataError(
        f"--data {name} is not batched: its elements are single examples (component shapes "
        f"{shapes}; in a batch every component starts with the batch size), so they cannot be "
        f"split across replicas. {fix}"
    )


def _shapes(element_spec: Any) -> str:
    import tensorflow as tf

    return str(tf.nest.map_structure(lambda s: tuple(s.shape), element_spec))


def check_strategy(dist: Any, name: str, strategy: Any) -> None:
    """Refuse a distributed dataset made with another strategy than the session's."""
    from ..hooks.tensorflow import distributed_dataset_strategy

    made_with = distributed_dataset_strategy(dist)
    if made_with is None or made_with is strategy:
        return
    raise DataError(
        f"--data {name} was distributed with another strategy (a "
        f"{type(made_with).__name__}) than this notebook's {type(strategy).__name__}: its "
        "batches are laid out for that strategy's replicas and devices. Pass the "
        "tf.data.Dataset or the dataset function itself (nbdist distributes it), or "
        f"distribute it with the notebook's strategy ({GET_STRATEGY})."
    )


def check_distributed_spec(dist: Any, data: StepData) -> None:
    try:
        spec = dist.element_spec
    except (AttributeError, ValueError):
        return
    refuse_unbatched(flat_specs(spec), data)


def warn_unknown_length(name: str, say: Callable[[str], None] | None) -> None:
    if say is not None:
        say(f"nbdist: --data {name}: TensorFlow cannot tell how many batches it has (its "
            "cardinality is unknown, e.g. after `filter`), so an epoch ends only when the data "
            "runs out and the progress bar has no end. If it repeats (`.repeat()` before "
            "`.filter(...)`), the epoch never ends: give --steps N (steps per epoch).")
