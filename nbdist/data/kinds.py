"""What a ``--data`` value is: a dataset, a dataset function, a distributed or per-worker
dataset (``classify``); anything else is refused saying what ``--data`` takes."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ..errors import DataError

_MISSING = object()

DATASET, FUNCTION, DISTRIBUTED, PER_WORKER, WORKER_FN = (
    "dataset", "function", "distributed", "per-worker dataset", "per-worker function")

ACCEPTED = (
    "--data takes a tf.data.Dataset of global batches, a dataset function "
    "`fn(input_context)` returning per-replica batches (as "
    "`strategy.distribute_datasets_from_function` takes), or a tf.distribute.DistributedDataset "
    "made with this notebook's strategy"
)

GET_STRATEGY = ("in a `%%distribute` cell, `tf.distribute.get_strategy()` is the notebook's "
                "strategy")


@dataclass(frozen=True)
class StepData:
    """The ``--data`` value and what kind of input it is (``DATASET``, ``FUNCTION``...)."""

    name: str
    kind: str
    value: Any


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

    from ..hooks.tf_coordinator import per_worker_dataset_coordinator

    if isinstance(value, tf.data.Dataset):
        return StepData(name, DATASET, value)
    if isinstance(value, tf.distribute.DistributedDataset):
        return StepData(name, DISTRIBUTED, value)
    if per_worker_dataset_coordinator(value) is not None:
        if not per_worker:
            raise DataError(
                f"--data {name} is a per-worker dataset (`coordinator.create_per_worker_dataset"
                "`), which only the ClusterCoordinator of a parameter_server strategy can run. "
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
