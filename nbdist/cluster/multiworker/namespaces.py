"""``%distribute push`` and ``pull``: values between the kernel and the workers' namespaces,
pickled by ipyparallel.

Only plain data crosses: a value that is or holds a TensorFlow or Keras object (a model, a
History, a variable, a dataset...) is refused at once, with what to move instead. Pickling a
pulled value happens on the one worker it comes from, and pickling a Keras model reads its
variables: under MultiWorkerMirroredStrategy such a read can be a collective that every worker
must join, so the worker would wait forever and the cluster would stall. The pulled value is
checked on the worker first (``inengine.transfer.check_pull``, by type only), before
ipyparallel pickles anything there. A pulled name that is a Keras model itself comes as a
model of the kernel's Keras, its weights read on every worker (``models``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import ConfigError
from .. import sendable
from ..inengine import transfer

#: Seconds a worker gets to check a value before it is pulled (type inspection: milliseconds).
CHECK_TIMEOUT_S = 30.0

#: What each kind of object is, for the refusal (``sendable.find_unsendable``'s kinds).
WHAT = {
    "history": "a Keras History callback ({type}), which holds its model",
    "model": "a Keras model ({type})",
    "metric": "a Keras metric ({type})",
    "layer": "a Keras layer ({type})",
    "optimizer": "a Keras optimizer ({type})",
    "callback": "a Keras callback ({type}), which holds the model it was used with",
    "variable": "a variable ({type})",
    "distributed": "a distributed value ({type}: one value per replica)",
    "strategy": "a tf.distribute strategy ({type})",
    "dataset": "a dataset ({type}: a pipeline, not data)",
    "iterator": "an iterator over a dataset ({type})",
    "function": "a tf.function ({type})",
    "tensorflow": "a TensorFlow object ({type})",
    "keras": "a Keras object ({type})",
}
#: Kinds whose pickling reads variables (a model's save), rather than failing or copying
#: runtime state.
_READS_VARIABLES = {"history", "model", "metric", "layer", "optimizer", "callback", "variable",
                    "distributed"}

#: What to pull instead; ``{x}``: where the object is in the pulled value.
PULL_INSTEAD = {
    "history": "Pull `{x}.history` instead: a dict of lists, each metric's value per epoch.",
    "model": ("Pull the model itself instead: `%distribute pull {x}` (every worker reads its "
              "weights, so every read is joined by all, and it comes as a model of this "
              "kernel's Keras)."),
    "layer": ("Run `weights = {x}.get_weights()` in a `%%distribute` cell (every worker runs "
              "it), then `%distribute pull weights` (a list of NumPy arrays)."),
    "metric": ("Run `value = float({x}.result())` in a `%%distribute` cell (every worker runs "
               "it, so its all-reduce is joined by all), then `%distribute pull value`."),
    "variable": ("Run `value = {x}.numpy()` in a `%%distribute` cell (every worker runs it), "
                 "then `%distribute pull value` (a NumPy array)."),
    "distributed": ("Reduce or unpack it in a `%%distribute` cell (every worker runs it), e.g. "
                    "`value = [t.numpy() for t in strategy.experimental_local_results({x})]`, "
                    "then `%distribute pull value`."),
    "strategy": ("A strategy belongs to the process that created it: there is nothing to copy; "
                 "`%distribute status` describes the workers'."),
    "dataset": ("Take elements as NumPy in a `%%distribute` cell, e.g. `batches = list({x}"
                ".take(2).as_numpy_iterator())` for a tf.data dataset, then `%distribute pull "
                "batches`."),
}
_PULL_OTHERWISE = ("Compute plain Python or NumPy values from it in a `%%distribute` cell (every "
                   "worker runs the cell, so any collective it needs is joined by all), then pull "
                   "those.")

#: What to push instead; ``{x}``: where the object is in the pushed value.
PUSH_INSTEAD = {
    "history": "Push `{x}.history` instead: a dict of lists.",
    "model": ("Push its weights instead: `weights = {x}.get_weights()` here, `%distribute push "
              "weights`, then build the model in a `%%distribute` cell and call "
              "`model.set_weights(weights)` there."),
    "layer": ("Push `weights = {x}.get_weights()` instead, and build the layer in a "
              "`%%distribute` cell."),
    "variable": ("Push `value = {x}.numpy()` instead, and create the variable from it in a "
                 "`%%distribute` cell."),
    "dataset": ("Push the arrays it is made from and build the dataset in a `%%distribute` cell "
                "(each worker then reads its own share)."),
}
_PUSH_OTHERWISE = ("Push plain Python or NumPy values and create the TensorFlow or Keras objects "
                   "from them in a `%%distribute` cell.")


def _what(found: dict[str, str], name: str, where: str) -> str:
    """"`history` on worker 1 is a Keras History callback (tf_keras...History), ..."."""
    what = WHAT.get(found["kind"], WHAT["tensorflow"]).format(type=found["type"])
    path = found["path"]
    if path == name:
        return f"`{name}` {where} is {what}"
    if _expression(path):
        return f"`{name}` {where} holds {what} at `{path}`"
    return f"`{name}` {where} holds {what}, as {path}"


def _instead(hints: dict[str, str], otherwise: str, found: dict[str, str]) -> str:
    """The hint for the kind, written with the object's path when that is an expression
    (``results['model']``, not "an element of results")."""
    if not _expression(found["path"]):
        return otherwise
    return hints.get(found["kind"], otherwise).format(x=found["path"])


def _expression(path: str) -> bool:
    try:
        sendable.parse_name(path)
    except ValueError:
        return False
    return True


def push_refusal(name: str, found: dict[str, str]) -> str:
    """Why ``name``, a kernel variable holding a TensorFlow or Keras object, is not pushed."""
    instead = _instead(PUSH_INSTEAD, _PUSH_OTHERWISE, found)
    return (f"`%distribute push {name}` refused: {_what(found, name, 'in this kernel')}. The "
            "kernel's own TensorFlow and Keras objects are not what the workers need: they run "
            "their own Keras under their strategy, so a model, layer, optimizer, variable or "
            "dataset must be created on them, in a `%%distribute` cell; pickling this one would "
            f"save its variables and state for nothing. {instead} Nothing was sent.")


def pull_refusal(name: str, worker_index: int, found: dict[str, str]) -> str:
    """Why ``name`` on worker ``worker_index`` is not pulled (``check_pull``'s
    ``unsendable``)."""
    kind = found["kind"]
    where = f"on worker {worker_index}"
    if kind in _READS_VARIABLES:
        read = "it" if kind in ("variable", "distributed") else "its variables"
        why = (f"Pickling it to send it would read {read}: under "
               "MultiWorkerMirroredStrategy a read of a distributed variable can be a "
               f"collective that every worker must join, and only worker {worker_index} would "
               "run it, so it would wait forever and stall the cluster.")
    else:
        why = (f"It is state of worker {worker_index}'s own TensorFlow runtime, not data, and "
               "pickling it could run TensorFlow work there (a collective, under "
               f"MultiWorkerMirroredStrategy) on worker {worker_index} alone, which would stall "
               "the cluster.")
    instead = _instead(PULL_INSTEAD, _PULL_OTHERWISE, found)
    return (f"`%distribute pull {name}` refused: {_what(found, name, where)}. {why} {instead} "
            "Nothing was pickled; the workers are unchanged.")


def push_values(client: Any, engine_ids: list[int], values: dict[str, Any]) -> None:
    """Copy ``values`` into every worker's namespace; a value that is or holds a TensorFlow or
    Keras object is refused before anything is sent."""
    for name, value in values.items():
        found = sendable.find_unsendable(value, name)
        if found is not None:
            raise ConfigError(push_refusal(name, found))
    try:
        # not block=True: ipyparallel's blocking calls swallow a kernel interrupt and return
        # an AsyncResult, which would read as done
        client[engine_ids].push(values, block=False).get()
    except Exception as err:
        raise ConfigError(f"Could not send {sorted(values)} to the workers: {err}. Only "
                          "picklable values can be pushed: push the plain data it holds or "
                          "is built from (numbers, strings, lists, dicts, NumPy arrays), and "
                          "make the object itself on the workers in a `%%distribute` cell "
                          "(a lock, a file, a connection belongs to one process).") from None


def pull_value(client: Any, engine_ids: list[int], name: str, worker_index: int,
               pull_model: Callable[[str, int], Any] | None = None) -> Any:
    """The value of ``name`` on worker ``worker_index`` (``engine_ids[worker_index]``):
    a variable, with ``.attribute`` and ``[key]`` parts. Checked on that worker first: a value
    that is or holds a TensorFlow or Keras object is refused, and nothing is pickled; a value
    that is a Keras model is ``pull_model(name, worker_index)``, if given."""
    if not 0 <= worker_index < len(engine_ids):
        raise ConfigError(f"--worker {worker_index}: the workers are 0..{len(engine_ids) - 1}.")
    problem = _check_on_worker(client[engine_ids[worker_index]], name, worker_index)
    if problem is not None:
        if pull_model is not None and problem["kind"] == "model" \
                and problem["path"] == name.strip():
            return pull_model(name.strip(), worker_index)
        raise ConfigError(pull_refusal(name, worker_index, problem))
    try:
        return client[engine_ids[worker_index]].pull(name, block=False).get()   # see push_values
    except Exception as err:
        what = getattr(err, "ename", type(err).__name__)
        if what == "NameError":
            raise ConfigError(_missing_on_worker(name, worker_index)) from None
        raise ConfigError(f"Could not pull `{name}` from worker {worker_index} ({what}: "
                          f"{getattr(err, 'evalue', err)}). Only picklable values can "
                          "be pulled; pull arrays or weights instead.") from None


def _missing_on_worker(name: str, worker_index: int) -> str:
    return (f"worker {worker_index} has no variable `{name}`: the workers have only what "
            "`%%distribute` cells assigned there and what `%distribute push` sent. A value of "
            f"this kernel: push it first, `%distribute push {name}`; a value the workers make: "
            "run the `%%distribute` cell that assigns it, then pull.")


def _check_on_worker(engine: Any, name: str, worker_index: int) -> dict[str, str] | None:
    """Raise the refusal ``transfer.check_pull`` finds on the worker, if any, but for a
    TensorFlow or Keras object: returned (``sendable.find_unsendable``'s dict)."""
    try:
        problem = engine.apply_async(transfer.check_pull, name).get(timeout=CHECK_TIMEOUT_S)
    except Exception as err:
        what = getattr(err, "ename", type(err).__name__)
        raise ConfigError(
            f"Could not pull `{name}`: worker {worker_index} did not check it ({what}: "
            f"{getattr(err, 'evalue', err)}). `%distribute status` shows whether it is busy "
            "or stuck.") from None
    if problem is None:
        return None
    kind = problem["problem"]
    if kind == "syntax":
        raise ConfigError(
            f"`%distribute pull {name}`: pull takes a variable name, with `.attribute` and "
            "`[key]` parts (e.g. `history.history['loss']`). Compute anything else in a "
            "`%%distribute` cell, `value = ...`, then `%distribute pull value`.")
    if kind == "missing":
        raise ConfigError(_missing_on_worker(problem["name"], worker_index))
    if kind == "computed":
        expr = problem["expr"]
        raise ConfigError(
            f"`%distribute pull {name}` refused: `{expr}` on worker {worker_index} is not a "
            f"plain attribute of its {problem['type']}: reading it runs TensorFlow or Keras "
            f"code, which nbdist does not run on worker {worker_index} alone (it may read "
            "distributed variables, a collective every worker must join). Compute it in a "
            f"`%%distribute` cell, `value = {expr}` (every worker runs it), then `%distribute "
            "pull value`.")
    if kind == "unsendable":
        return problem
    raise ConfigError(f"Could not pull `{name}` from worker {worker_index} "
                      f"({problem.get('text', kind)}).")
