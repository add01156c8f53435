"""What a step-mode cell trains on (``--data``): what it is, checked, and read the way
TensorFlow reads it under the session's strategy, before anything is traced or any Run exists.

``--data NAME`` names one of (``classify``):

* a ``tf.data.Dataset`` of *global* batches. nbdist distributes it:
  ``strategy.experimental_distribute_dataset`` (each step's batch is split across the
  replicas; under multiworker TensorFlow auto-shards it across the workers); under
  parameter_server each worker reads its own repeated copy
  (``coordinator.create_per_worker_dataset(dataset.repeat())``).
* a dataset function ``fn(input_context)`` returning *per-replica* batches, as
  ``strategy.distribute_datasets_from_function`` takes (TensorFlow's input, multi-worker and
  parameter-server tutorials). nbdist hands it to the session's strategy, which calls it once
  per input pipeline with a ``tf.distribute.InputContext``: one pipeline in the kernel's
  local strategies; under multiworker one per worker (``input_pipeline_id`` is the worker's
  index, ``num_input_pipelines`` the number of workers); under parameter_server TensorFlow
  gives every worker the same context (pipeline 0 of 1), and nbdist builds the per-worker
  dataset as the tutorial does: ``coordinator.create_per_worker_dataset(lambda:
  strategy.distribute_datasets_from_function(fn))``, each worker's dataset repeated.
* a ``tf.distribute.DistributedDataset`` (``experimental_distribute_dataset`` or
  ``distribute_datasets_from_function``) made with the session's strategy: used as it is.
  One made with another strategy is refused.
* under parameter_server, also what ``coordinator.create_per_worker_dataset`` returns (or the
  no-argument function it takes), used as it is.

Checks (a ``DataError`` or ``ConfigError`` naming the fix): the value is one of those; its
elements are batches (not single examples), and a global batch holds at least one example per
replica; an epoch ends (a dataset repeated forever needs ``--steps``; one of unknown length
gets a warning saying the same).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, DataError

_MISSING = object()

DATASET, FUNCTION, DISTRIBUTED, PER_WORKER, WORKER_FN = (
    "dataset", "function", "distributed", "per-worker dataset", "per-worker function")

ACCEPTED = (
    "--data takes a tf.data.Dataset of global batches, a dataset function "
    "`fn(input_context)` returning per-replica batches (as "
    "`strategy.distribute_datasets_from_function` takes), or a tf.distribute.DistributedDataset "
    "made with this session's strategy"
)
GET_STRATEGY = ("in a `%%distribute` cell, `tf.distribute.get_strategy()` is the session's "
                "strategy")


@dataclass(frozen=True)
class StepData:
    """The ``--data`` value and what kind of input it is (``DATASET``, ``FUNCTION``...)."""

    name: str
    kind: str
    value: Any


@dataclass
class ReadData:
    """``--data`` ready for a family's loop: what it iterates, steps per epoch, and a note
    for the Run on how TensorFlow reads it (None: nothing to say)."""

    dataset: Any
    per_epoch: int | None
    note: str | None = None


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


def classify(value: Any, name: str, per_worker: bool = False) -> StepData:
    """What kind of input ``value`` is, or a DataError saying what --data takes.

    ``per_worker``: the session is parameter_server (per-worker datasets are accepted).
    """
    import tensorflow as tf

    from .hooks.tf_coordinator import per_worker_dataset_coordinator

    if isinstance(value, tf.data.Dataset):
        return StepData(name, DATASET, value)
    if isinstance(value, tf.distribute.DistributedDataset):
        return StepData(name, DISTRIBUTED, value)
    if per_worker_dataset_coordinator(value) is not None:
        if not per_worker:
            raise DataError(
                f"--data {name} is a per-worker dataset (`coordinator.create_per_worker_dataset"
                "`), which only a parameter_server session's ClusterCoordinator can run. "
                f"{ACCEPTED}."
            )
        return StepData(name, PER_WORKER, value)
    what = f"{type(value).__module__}.{type(value).__name__}"
    if isinstance(value, (tf.data.Iterator, tf.distribute.DistributedIterator)) or (
            hasattr(value, "__next__") and not callable(value)):
        raise DataError(
            f"--data {name} is an iterator ({what}); nbdist iterates the data itself, once per "
            f"epoch. Pass the dataset it iterates. {ACCEPTED}."
        )
    if callable(value):
        arity = _positional_arity(value)
        if arity == 1:
            return StepData(name, FUNCTION, value)
        if arity == 0 and per_worker:
            return StepData(name, WORKER_FN, value)
        if arity == 0:
            raise DataError(
                f"--data {name} is a function without arguments. A dataset function takes the "
                "`input_context` TensorFlow passes it (`def dataset_fn(input_context): ...`, "
                "as `strategy.distribute_datasets_from_function` takes); if it returns the "
                f"whole dataset, pass its result: `{name}_ds = {name}()`, then "
                f"`--data {name}_ds`."
            )
        raise DataError(
            f"--data {name} is a function of {arity} arguments; a dataset function takes one, "
            f"the `input_context`. Bind the others: `fn = lambda input_context: "
            f"{name}(GLOBAL_BATCH, input_context)`, then `--data fn` (TensorFlow's "
            "multi-worker tutorial does the same)."
        )
    raise DataError(
        f"--data {name} is a {what}, which nbdist cannot read. {ACCEPTED}. For arrays: "
        f"`{name}_ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)`."
    )


def _positional_arity(fn: Any) -> int | None:
    """How many positional arguments ``fn`` requires (1 if it takes *args), None if unknown
    or more than it can take with one."""
    target = getattr(fn, "python_function", fn)   # a tf.function: the user's function
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return 1   # a builtin or C callable: let TensorFlow call it
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values()):
        return 1 if len(required) <= 1 else len(required)
    if len(required) > 1:
        return len(required)
    if required or positional:
        return 1
    return 0


# -- the kernel's local strategies and multiworker: a distributed dataset -------------------------
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
            _warn_unknown_length(name, say)
        return ReadData(strategy.experimental_distribute_dataset(data.value), per_epoch)
    contexts: list[Any] = []
    if data.kind == FUNCTION:
        dist = strategy.distribute_datasets_from_function(_checked_fn(data, contexts))
    else:
        dist = data.value
        _check_strategy(dist, name, strategy)
    _check_distributed_spec(dist, data)
    per_epoch = _distributed_steps(dist, local_replicas, max_steps, name, data.kind)
    if per_epoch is None:
        _warn_unknown_length(name, say)
    return ReadData(dist, per_epoch, _function_note(name, contexts))


def _distributed_steps(dist: Any, local_replicas: int, max_steps: int | None, name: str,
                       kind: str) -> int | None:
    import tensorflow as tf

    from .hooks.tensorflow import distributed_from_function

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


# -- parameter_server: a per-worker dataset -------------------------------------------------------
def per_worker_input(data: StepData, strategy: Any, coordinator: Any,
                     max_steps: int | None) -> ReadData:
    """What ``coordinator.schedule`` iterates (``coordinator.create_per_worker_dataset``),
    and the steps per epoch; the coordinator must know them, so a length it cannot count
    needs ``--steps``."""
    from .hooks.tf_coordinator import per_worker_dataset_coordinator

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
        _check_strategy(data.value, name, strategy)
        source = data.value
    elif data.kind == WORKER_FN:
        source = data.value
    else:
        if per_worker_dataset_coordinator(data.value) is not coordinator:
            raise DataError(
                f"--data {name} was made by another ClusterCoordinator than this session's. "
                "Make it with the session's: in a `%%distribute` cell, `coordinator = "
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
    with strategy.scope():
        per_worker = coordinator.create_per_worker_dataset(source)
    try:
        spec = per_worker.element_spec
    except (NotImplementedError, AttributeError, ValueError):
        spec = None
    if spec is not None:
        _refuse_unbatched(_flat_specs(spec), data)
    if contexts:
        note = (f"{_function_note(name, contexts)}; under parameter_server every worker builds "
                "its own dataset from it with that same context (TensorFlow's design), "
                "repeated, and an epoch is --steps steps spread over the workers")
    return ReadData(per_worker, per_epoch, note)


# -- checks ---------------------------------------------------------------------------------------
def check_dataset(dataset: Any, name: str, replicas: int, max_steps: int | None) -> None:
    """Raise if ``dataset`` cannot be split across ``replicas`` (or would never end)."""
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(f"--data {name} is a {type(dataset).__module__}."
                        f"{type(dataset).__name__}, not a tf.data.Dataset. {ACCEPTED}.")
    specs = _flat_specs(dataset.element_spec)
    _refuse_unbatched(specs, StepData(name, DATASET, dataset))
    static = {s.shape[0] for s in specs if s.shape.rank and s.shape[0] is not None}
    sizes = static
    if not sizes:  # batch size not static (no drop_remainder): look at the first element
        first = next(iter(dataset.take(1)), None)
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


def _flat_specs(element_spec: Any) -> list[Any]:
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


def _refuse_unbatched(specs: list[Any], data: StepData) -> None:
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


def _check_strategy(dist: Any, name: str, strategy: Any) -> None:
    """Refuse a distributed dataset made with another strategy than the session's."""
    from .hooks.tensorflow import distributed_dataset_strategy

    made_with = distributed_dataset_strategy(dist)
    if made_with is None or made_with is strategy:
        return
    raise DataError(
        f"--data {name} was distributed with another strategy (a "
        f"{type(made_with).__name__}) than this session's {type(strategy).__name__}: its "
        "batches are laid out for that strategy's replicas and devices. Pass the "
        "tf.data.Dataset or the dataset function itself (nbdist distributes it), or "
        f"distribute it with the session's strategy ({GET_STRATEGY})."
    )


def _check_distributed_spec(dist: Any, data: StepData) -> None:
    try:
        spec = dist.element_spec
    except (AttributeError, ValueError):
        return
    _refuse_unbatched(_flat_specs(spec), data)


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


def _warn_unknown_length(name: str, say: Callable[[str], None] | None) -> None:
    if say is not None:
        say(f"nbdist: --data {name}: TensorFlow cannot tell how many batches it has (its "
            "cardinality is unknown, e.g. after `filter`), so an epoch ends only when the data "
            "runs out and the progress bar has no end. If it repeats (`.repeat()` before "
            "`.filter(...)`), the epoch never ends: give --steps N (steps per epoch).")
