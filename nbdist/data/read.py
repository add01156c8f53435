"""``--data`` handed to the session's strategy: a distributed dataset for ``strategy.run``
loops (the kernel's strategies, each multiworker worker), a per-worker dataset for
parameter_server's ``ClusterCoordinator``; with the steps of an epoch and a note for the Run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, DataError
from .checks import (
    check_dataset,
    check_distributed_spec,
    check_strategy,
    flat_specs,
    refuse_unbatched,
    steps_per_epoch,
    warn_unknown_length,
)
from .freshstack import on_fresh_stack
from .kinds import ACCEPTED, DATASET, DISTRIBUTED, FUNCTION, WORKER_FN, StepData


@dataclass
class ReadData:
    """``--data`` ready for a family's loop: what it iterates, steps per epoch, and a note
    for the Run on how TensorFlow reads it (None: nothing to say)."""

    dataset: Any
    per_epoch: int | None
    note: str | None = None


def distributed_input(data: StepData, strategy: Any, local_replicas: int, max_steps: int | None,
                      say: Callable[[str], None] | None = print) -> ReadData:
    """The distributed dataset a ``strategy.run`` loop iterates, and its steps per epoch.

    ``local_replicas``: the replicas this process feeds (all of them in the kernel, a worker's
    own under multiworker).
    """
    name = data.name
    if data.kind == DATASET:
        check_dataset(data.value, name, strategy.num_replicas_in_sync, max_steps)
        per_epoch = steps_per_epoch(data.value, max_steps)
        if per_epoch is None:
            warn_unknown_length(name, say)
        dist = on_fresh_stack(strategy.experimental_distribute_dataset, data.value)
        return ReadData(dist, per_epoch)
    contexts: list[Any] = []
    if data.kind == FUNCTION:
        dist = on_fresh_stack(strategy.distribute_datasets_from_function,
                              _checked_fn(data, contexts))
    else:
        dist = data.value
        check_strategy(dist, name, strategy)
    check_distributed_spec(dist, data)
    per_epoch = _distributed_steps(dist, local_replicas, max_steps, name, data.kind)
    if per_epoch is None:
        warn_unknown_length(name, say)
    return ReadData(dist, per_epoch, _function_note(name, contexts))


def _distributed_steps(dist: Any, local_replicas: int, max_steps: int | None, name: str,
                       kind: str) -> int | None:
    import tensorflow as tf

    from ..hooks.tensorflow import distributed_from_function

    card = _cardinality(dist)
    if card == tf.data.INFINITE_CARDINALITY:
        if max_steps is None:
            raise ConfigError(
                f"--data {name} repeats forever, so an epoch never ends. Give --steps N (steps "
                "per epoch) or drop the `.repeat()`"
                + (" in the dataset function." if kind == FUNCTION else ".")
            )
        return max_steps
    if card is None or card < 0:
        return max_steps
    if distributed_from_function(dist):
        # each replica of this process takes its own per-replica batch from the pipeline
        card = -(-card // max(1, local_replicas))
    return card if max_steps is None else min(card, max_steps)


def _cardinality(dist: Any) -> int | None:
    """A distributed dataset's cardinality (a property there, not a method), None if it has
    none yet (one made under parameter_server is built on the workers)."""
    try:
        card = dist.cardinality
    except (ValueError, AttributeError):
        return None
    if callable(card):
        card = card()
    try:
        return int(card)
    except (TypeError, ValueError):
        return None


def per_worker_input(data: StepData, strategy: Any, coordinator: Any,
                     max_steps: int | None) -> ReadData:
    """What ``coordinator.schedule`` iterates (``coordinator.create_per_worker_dataset``),
    and the steps per epoch; the coordinator must know them, so a length it cannot count
    needs ``--steps``."""
    from ..hooks.tf_coordinator import per_worker_dataset_coordinator

    name = data.name
    per_epoch: int | None = max_steps
    contexts: list[Any] = []
    note = (f"parameter_server: --data {name} ({data.kind}) is read by each worker as it is "
            "built, and an epoch is --steps steps spread over the workers")
    if data.kind == DATASET:
        check_dataset(data.value, name, 1, max_steps)
        per_epoch = steps_per_epoch(data.value, max_steps)
        if per_epoch is None:
            raise DataError(
                f"--data {name}: its number of batches is unknown (e.g. after `filter`), and "
                "under parameter_server the coordinator must know how many steps to schedule. "
                "Give --steps N (steps per epoch)."
            )
        source: Any = data.value.repeat()
        note = ("parameter_server: each worker reads its own copy of the dataset, repeated; an "
                "epoch is as many steps as the dataset has batches, spread over the workers")
    elif data.kind == FUNCTION:
        fn = _checked_fn(data, contexts, repeat=True)

        def source() -> Any:   # as TensorFlow's parameter-server tutorial builds it
            return strategy.distribute_datasets_from_function(fn)
    elif data.kind == DISTRIBUTED:
        check_strategy(data.value, name, strategy)
        source = data.value
    elif data.kind == WORKER_FN:
        source = data.value
    else:
        if per_worker_dataset_coordinator(data.value) is not coordinator:
            raise DataError(
                f"--data {name} was made by another ClusterCoordinator than this notebook's. "
                "Make it with the notebook's: in a `%%distribute` cell, `coordinator = "
                "tf.distribute.coordinator.ClusterCoordinator(tf.distribute.get_strategy())` "
                f"is it; or pass the dataset function itself. {ACCEPTED}."
            )
        source = None
    if per_epoch is None:
        raise DataError(
            f"--data {name} is a {data.kind}: under parameter_server each worker builds its "
            "own dataset from it, so the coordinator cannot count the batches of an epoch, and "
            "it must know how many steps to schedule. Give --steps N (steps per epoch)."
        )
    if source is None:
        return ReadData(data.value, per_epoch, note)
    per_worker = on_fresh_stack(_per_worker_dataset, strategy, coordinator, source)
    try:
        spec = per_worker.element_spec
    except (NotImplementedError, AttributeError, ValueError):
        spec = None
    if spec is not None:
        refuse_unbatched(flat_specs(spec), data)
    if contexts:
        note = (f"{_function_note(name, contexts)}; under parameter_server every worker builds "
                "its own dataset from it with that same context (TensorFlow's design), "
                "repeated, and an epoch is --steps steps spread over the workers")
    return ReadData(per_worker, per_epoch, note)


def _per_worker_dataset(strategy: Any, coordinator: Any, source: Any) -> Any:
    with strategy.scope():
        return coordinator.create_per_worker_dataset(source)


def _checked_fn(data: StepData, contexts: list[Any],
                repeat: bool = False) -> Callable[[Any], Any]:
    """The user's dataset function, its result checked to be a tf.data.Dataset (and repeated
    for parameter_server's per-worker datasets); the InputContexts TensorFlow passes it are
    appended to ``contexts``."""
    fn, name = data.value, data.name

    def dataset_fn(input_context: Any) -> Any:
        import tensorflow as tf

        contexts.append(input_context)
        dataset = fn(input_context)
        if not isinstance(dataset, tf.data.Dataset):
            raise DataError(
                f"--data {name}: the dataset function returned a "
                f"{type(dataset).__module__}.{type(dataset).__name__}, not a tf.data.Dataset. "
                "It must return the dataset of this input pipeline, batched per replica: "
                "`return dataset.batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH))`."
            )
        return dataset.repeat() if repeat else dataset

    return dataset_fn


def _function_note(name: str, contexts: list[Any]) -> str | None:
    """How TensorFlow called a dataset function here (the Run's note), None if it did not."""
    if not contexts:
        return None
    ctx = contexts[0]
    ids = ", ".join(str(c.input_pipeline_id) for c in contexts)
    return (f"--data {name} is a dataset function: TensorFlow called it with "
            f"num_input_pipelines={ctx.num_input_pipelines}, input_pipeline_id={ids} here "
            f"(num_replicas_in_sync={ctx.num_replicas_in_sync}); each replica takes its own "
            "per-replica batch every step")
