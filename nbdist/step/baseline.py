"""One replica's speed on a run's own step: the baseline of ``%distribute explain --baseline``.

``measure_baseline(run)`` runs the step cell of an in-kernel step run again, alone on the
first device of the run (``tf.distribute.OneDeviceStrategy``), on the batches one of the run's
replicas reads (its ``--data`` read as the session's strategy reads it, the first replica's
part of each global batch, a few read ahead and repeated), for a few dozen steps after the
compile steps, stopping early after a few seconds. ``telemetry.explain`` compares its steps/s
with the run's: the run's speed-up over one replica and its scaling efficiency.

The user's objects never change. The step runs in a copy of the notebook's namespace in which
every object the cell trains (``checkpoint.step.named_trackables``: models, optimizers,
metrics, variables, also reached through the notebook's functions) is a copy made under the
one-device strategy: Keras ``clone_model`` with the same weights, an optimizer from the same
config (fresh state: its first steps build it, as the run's did). The notebook's functions the
step calls see that copy as their globals. Before the first step runs, the traced step is
checked to use no variable but the copies' (an object the step reaches another way: refused,
nothing ran). Runs on worker processes are refused: their step, data and objects live in the
workers, which are members of a cluster; the way to compare there is to train the same model
in the kernel on one device and on several.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import sys
import time
import types
import warnings
from typing import Any

from ..errors import ConfigError, NbdistWarning, RunInterrupted
from ..families import family
from ..telemetry.explain import STEADY_FROM, Baseline
from ..telemetry.run import Run, RunObserver
from ..words import count

MAX_STEADY = 40       # steps timed after the compile steps, at most
MIN_STEADY = 3        # ...and at least, whatever they cost
STEADY_SECONDS = 3.0  # after this long timing, stop at the next step
READ_AHEAD = 8        # per-replica batches read from the run's data, then repeated


class BaselineRefused(ConfigError):
    """The step cannot run on one replica without touching the notebook's objects."""


def measure_baseline(run: Run, user_ns: dict[str, Any], backend: Any) -> Baseline:
    """One replica's steps/s on ``run``'s step and per-replica batch (see the module
    docstring), with the notebook's namespace ``user_ns`` and the kernel's ``backend`` (None
    without a strategy; the session passes both). Raises ConfigError, changing nothing,
    where it cannot measure it."""
    cell = _checked_cell(run, user_ns, backend)
    started = time.perf_counter()   # the probe's own time: its copies, its data, its steps
    strategy = backend.kernel_strategy()
    import tensorflow as tf

    device = run.devices[0]
    probe = tf.distribute.OneDeviceStrategy(device)
    namespace = probe_namespace(run, cell.text, user_ns, probe, strategy)
    batches = _per_replica_batches(run, cell, user_ns, strategy)
    probe_run = _probe(run, cell, namespace, probe, device, batches)
    seconds = time.perf_counter() - started
    steps, rate = _steady_rate(probe_run)
    return Baseline(rate, _batch_size(batches[0]), steps, seconds, _short(device))



# -- what can be measured -------------------------------------------------------------------------
def _checked_cell(run: Run, user_ns: dict[str, Any], backend: Any) -> Any:
    """The run's step cell, if one replica can run it here now; else a ConfigError saying why
    and what to do instead."""
    name = f"Run {run.id}"
    if run.mode != "step":
        raise ConfigError(
            f"{name} is a Keras fit: --baseline runs a step cell again on one replica, and a "
            "fit has none to run. Train the model with a step cell (`%%distribute --step "
            "--data ds`), or compare fits on `%distribute mirrored --devices 1` and on more "
            "devices.")
    if not family(run.strategy).in_kernel:
        raise ConfigError(
            f"{name} trained on worker processes ({run.strategy}): its step, its data and the "
            "objects it trains live in the workers, each a member of the cluster, so one "
            "replica cannot run it alone there. To measure the scaling, train the same model "
            "in the kernel with `%distribute mirrored --devices 1`, then on more devices, and "
            "compare their examples/s.")
    if run.replicas * run.workers < 2:
        raise ConfigError(
            f"{name} trained on one replica: it is its own baseline. Train on several "
            "(`%distribute mirrored --devices 4`), then `%distribute explain --baseline`.")
    if run.strategy == "tpu":
        raise ConfigError(
            f"{name} trained on a TPU, whose cores run only under TPUStrategy: one of them "
            "cannot run the step alone from the kernel. Compare runs on fewer cores instead.")
    cell = run.step_cell
    if cell is None:
        raise ConfigError(
            f"{name} keeps no step cell to run again (it was loaded from a file or made "
            "outside a `%%distribute --step` cell): --baseline needs a step run of this "
            "kernel. Run the cell again, then `%distribute explain --baseline`.")
    current = (None if backend is None or backend.kernel_strategy() is None
               else (backend.spec.name, tuple(backend.devices)))
    if current != (run.strategy, tuple(run.devices)):
        now = ("no strategy" if current is None
               else f"{current[0]} on {count(len(current[1]), 'device')}")
        raise ConfigError(
            f"{name} trained under {run.strategy} on {count(len(run.devices), 'device')}, "
            f"and the notebook now has {now}: one replica reads the run's data as the run's "
            "strategy split it. "
            f"Set that strategy again (`%distribute {run.strategy} --devices "
            f"{len(run.devices)}`), then `%distribute explain {run.id} --baseline`.")
    _check_names(run, cell, user_ns)
    return cell


def _check_names(run: Run, cell: Any, user_ns: dict[str, Any]) -> None:
    """Refuse when the data or a name the step reads is gone from the notebook."""
    from ..cellnames import step_reads

    data = cell.spec.data
    if data not in user_ns:
        raise ConfigError(
            f"Run {run.id} trained on --data {data}, which is no longer in the notebook, so "
            "one replica has nothing to read. Define it again, or run the step again on the "
            "data you have now, then `%distribute explain --baseline`.")
    gone = sorted(n for n in step_reads(cell.text) if n not in user_ns
                  and not hasattr(builtins, n))
    if gone:
        raise ConfigError(
            f"Run {run.id}'s step reads {_names(gone)}, no longer in the notebook, so it cannot "
            "run again. Define them again (or run the step cell again with what you have now), "
            "then `%distribute explain --baseline`.")


# -- copies of what the step trains ---------------------------------------------------------------
def probe_namespace(run: Run, cell: str, user_ns: dict[str, Any], probe: Any,
                    strategy: Any) -> dict[str, Any]:
    """A copy of the notebook's namespace for the probe's step: every object the cell trains
    copied under ``probe``, the session's ``strategy`` replaced by ``probe``, the notebook's
    functions given the copy as their globals. Nothing is added to or changed in ``user_ns``."""
    from ..checkpoint.step import named_trackables

    objects = named_trackables(cell, user_ns, depth=4)
    copies: dict[int, Any] = {}
    for name, value in objects.items():
        if id(value) not in copies:
            copies[id(value)] = _copy(run, name, value, probe)
    namespace = dict(user_ns)
    for name, value in user_ns.items():
        if id(value) in copies:
            namespace[name] = copies[id(value)]
        elif value is strategy:
            namespace[name] = probe
    for name in _functions_called(cell, user_ns):
        namespace[name] = _rebound(run, name, user_ns[name], namespace)
    return namespace


def _functions_called(cell: str, user_ns: dict[str, Any]) -> list[str]:
    """The notebook's functions the step calls by name, and those they call, by name."""
    from ..cellnames import code_names, step_reads

    todo, found = list(step_reads(cell)), []
    while todo:
        name = todo.pop()
        value = user_ns.get(name)
        if (name not in found and isinstance(value, types.FunctionType)
                and value.__globals__ is user_ns):
            found.append(name)
            todo += code_names(value.__code__)
    return found


def _copy(run: Run, name: str, value: Any, probe: Any) -> Any:
    """``value`` made again under ``probe``: its weights (a model, a layer, a variable) or its
    configuration (an optimizer, a metric); BaselineRefused for anything else with state."""
    import tensorflow as tf

    keras = _keras_module(value)
    try:
        # read outside the probe's scope: the originals belong to the session's strategy
        if keras is not None and isinstance(value, keras.layers.Layer):   # models, metrics
            weights = value.get_weights()
            with probe.scope():
                if isinstance(value, keras.Model):
                    copy = keras.models.clone_model(value)
                else:
                    copy = type(value).from_config(value.get_config())
                _build_like(copy, value)
                if weights:
                    copy.set_weights(weights)
            return copy
        if keras is not None and isinstance(value, keras.optimizers.Optimizer):
            config = value.get_config()
            with probe.scope():
                return type(value).from_config(config)
        if isinstance(value, tf.Variable) or (keras is not None
                                              and isinstance(value, keras.Variable)):
            initial = value.numpy()
            make = tf.Variable if isinstance(value, tf.Variable) else keras.Variable
            with probe.scope():
                return make(initial, trainable=value.trainable,
                            name=value.name.split(":")[0])
    except Exception as err:
        raise BaselineRefused(
            f"`{name}` ({type(value).__name__}) cannot be copied for the one-replica probe "
            f"({type(err).__name__}: {_first_line(err)}), and the probe never trains the "
            f"notebook's own objects. Compare Run {run.id} with the same cell run on "
            "`%distribute mirrored --devices 1` instead.") from None
    raise BaselineRefused(
        f"`{name}` ({type(value).__name__}) holds state the step changes, and the one-replica "
        "probe can copy only Keras models, layers, optimizers, metrics and variables (it never "
        f"trains the notebook's own objects). Compare Run {run.id} with the same cell run on "
        "`%distribute mirrored --devices 1` instead.")


def _keras_module(value: Any) -> Any:
    """The Keras (``keras`` or ``tf_keras``) whose object ``value`` is, if either."""
    for module in ("keras", "tf_keras"):
        keras = sys.modules.get(module)
        if keras is not None and isinstance(value, (keras.layers.Layer,
                                                    keras.optimizers.Optimizer)):
            return keras
        if module == "keras" and keras is not None and isinstance(value, keras.Variable):
            return keras
    return None


def _build_like(copy: Any, original: Any) -> None:
    """Build a copy its constructor left unbuilt (a subclassed model, a layer) as the
    original was built."""
    if getattr(copy, "built", True) or not getattr(original, "built", False):
        return
    config = getattr(original, "get_build_config", lambda: None)()
    if config:
        copy.build_from_config(config)


def _rebound(run: Run, name: str, function: types.FunctionType,
             namespace: dict[str, Any]) -> types.FunctionType:
    """``function`` with ``namespace`` as its globals; refused when it holds an object with
    variables itself (a default argument or a closure's), which the copy would not replace."""
    held = [*(function.__defaults__ or ()), *(function.__kwdefaults__ or {}).values(),
            *(c.cell_contents for c in function.__closure__ or () if _filled(c))]
    if any(_has_variables(v) for v in held):
        raise BaselineRefused(
            f"The notebook's function `{name}` holds an object with variables in a default "
            "argument or a closure, which the one-replica probe cannot swap for a copy (it "
            f"never trains the notebook's own objects). Compare Run {run.id} with the same cell "
            "run on `%distribute mirrored --devices 1` instead.")
    rebound = types.FunctionType(function.__code__, namespace, function.__name__,
                                 function.__defaults__, function.__closure__)
    rebound.__kwdefaults__ = function.__kwdefaults__
    return functools.update_wrapper(rebound, function)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents   # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _has_variables(value: Any) -> bool:
    import tensorflow as tf

    if isinstance(value, tf.Variable):
        return True
    if isinstance(value, (type, types.ModuleType)):
        return False
    try:
        held = getattr(value, "variables", None)
    except Exception:   # a property that fails on an unbuilt model
        return False
    return isinstance(held, (list, tuple)) and len(held) > 0


class _OnlyCopies(RunObserver):
    """Before the probe's first step runs: refuse a traced step that uses a variable not made
    under the probe's strategy (the notebook's own, reached some way the copy missed)."""

    def __init__(self, run: Run, probe: Any):
        self.run, self.probe = run, probe

    def on_traced(self, tf_function: Any, batch: Any, timed: bool) -> None:
        from ..hooks.keras import wrapped_variable

        created_here = self.probe.extended.variable_created_in_scope
        used = tf_function.get_concrete_function(batch).variables
        foreign = []
        for variable in used:
            inner = wrapped_variable(variable)
            if not created_here(variable if inner is None else inner):
                foreign.append(str(getattr(variable, "path", None) or variable.name))
        if foreign:
            raise unreached(self.run, f"the variable {_names(sorted(set(foreign))[:3])}")


def unreached(run: Run, what: str) -> BaselineRefused:
    """The step uses ``what`` of the notebook's own objects, which the probe did not copy."""
    return BaselineRefused(
        f"Run {run.id}'s step uses {what} of the notebook's own objects, reached through an "
        "object or function the one-replica probe does not follow, so it could not swap it for "
        "a copy; the probe never trains the notebook's objects, so it stopped before any step "
        "ran. Reach the model and its optimizer by name in the step cell, or compare the run "
        "with the same cell run on `%distribute mirrored --devices 1`.")


# -- the probe ---------------------------------------------------------------------------------
def _per_replica_batches(run: Run, cell: Any, user_ns: dict[str, Any], strategy: Any
                         ) -> list[Any]:
    """The first replica's part of the run's first few global batches, read as the run's
    strategy read them."""
    from ..data import classify, distributed_input, lookup_dataset
    from ..data.iterate import new_iterator, release

    data = classify(lookup_dataset(user_ns, cell.spec.data), cell.spec.data)
    read = distributed_input(data, strategy, run.replicas, READ_AHEAD, say=None)
    iterator = new_iterator(read.dataset)
    batches = []
    try:
        for _ in range(READ_AHEAD):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            batches.append(strategy.experimental_local_results(batch)[0])
    finally:
        iterator = release(iterator)
    if not batches:
        raise ConfigError(f"Run {run.id}'s --data {cell.spec.data} has no batch now: one "
                          "replica has nothing to read. Give it data, then `%distribute "
                          "explain --baseline`.")
    return batches


def _probe(run: Run, cell: Any, namespace: dict[str, Any], probe: Any, device: str,
           batches: list[Any]) -> Run:
    """The step on one replica over ``batches`` repeated: its Run (in no list of runs)."""
    import tensorflow as tf

    from ..data import StepData, distributed_input
    from ..data.kinds import DATASET
    from ..spec import StrategySpec
    from ..strategies import StrategyHandle
    from .runner import StepRunner

    steps = STEADY_FROM + MAX_STEADY
    dataset = functools.reduce(lambda a, b: a.concatenate(b),
                               [tf.data.Dataset.from_tensors(b) for b in batches]).repeat()
    read = distributed_input(StepData(cell.spec.data, DATASET, dataset), probe, 1, steps,
                             say=None)
    spec = dataclasses.replace(cell.spec, epochs=1, steps=steps, timing_every=0,
                               checkpoint=None, show_code=False)
    probe_run = Run(id=run.id, mode="step", strategy="one_device", replicas=1,
                    devices=(device,), total_steps=steps, epochs=1)
    handle = StrategyHandle(StrategySpec("one_device"), probe, (device,),
                            "GPU" if "GPU" in device.upper() else "CPU")
    runner = StepRunner(cell.source, namespace, spec, probe_run,
                        observers=[_OnlyCopies(run, probe), _Budget()], dataset=read.dataset,
                        handle=handle)
    try:
        with warnings.catch_warnings():   # the cell's own warnings were shown when it ran
            warnings.simplefilter("ignore", NbdistWarning)
            runner.execute()
    except (ConfigError, KeyboardInterrupt):   # BaselineRefused too: nothing ran
        raise
    except RunInterrupted:
        raise RunInterrupted(f"The one-replica probe of Run {run.id} was interrupted; the "
                             "notebook's objects are as they were.") from None
    except Exception as err:
        if _mixing(err):   # raised as it traced the step: nothing ran
            raise unreached(run, "a variable") from None
        raise ConfigError(
            f"Run {run.id}'s step failed on one replica ({type(err).__name__}: "
            f"{_first_line(err)}), so there is no baseline; the notebook's objects are as they "
            f"were. `%distribute explain {run.id}` explains the run without it.") from err
    finally:
        runner.release()
    return probe_run


def _mixing(err: BaseException | None) -> bool:
    """TensorFlow's refusal of a variable of another strategy, anywhere in ``err``'s chain."""
    while err is not None:
        if "Mixing different tf.distribute.Strategy" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


class _Budget(RunObserver):
    """Stops the probe after ``MAX_STEADY`` steps past the compile steps, or at the first
    step after ``STEADY_SECONDS`` of them (and at least ``MIN_STEADY``)."""

    def __init__(self) -> None:
        self.steady = 0
        self.since: float | None = None

    def on_step(self, run: Run) -> None:
        self.steady = run.steps_done - STEADY_FROM
        if self.steady >= 0 and self.since is None:
            self.since = time.perf_counter()

    def should_stop(self) -> bool:
        if self.steady >= MAX_STEADY:
            return True
        return (self.since is not None and self.steady >= MIN_STEADY
                and time.perf_counter() - self.since >= STEADY_SECONDS)


def _steady_rate(probe_run: Run) -> tuple[int, float]:
    """The steps timed after the compile steps and their steps/s (from each step's end)."""
    frame = probe_run.metrics
    wall = frame.wall_time[frame.step >= STEADY_FROM - 1].to_numpy()
    steps = len(wall) - 1
    if steps < 1 or wall[-1] <= wall[0]:
        raise ConfigError(f"The one-replica probe of Run {probe_run.id} ran too few steps to "
                          "time: its data ended. Give the run more data, then `%distribute "
                          "explain --baseline`.")
    return steps, steps / float(wall[-1] - wall[0])


def _batch_size(batch: Any) -> int:
    import tensorflow as tf

    leaves = [t for t in tf.nest.flatten(batch) if getattr(t, "shape", None) is not None
              and len(t.shape)]
    return int(leaves[0].shape[0]) if leaves else 1


# -- words ---------------------------------------------------------------------------------------
def _names(names: list[str]) -> str:
    quoted = [f"`{n}`" for n in names]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _short(device: str) -> str:
    """``/job:localhost/replica:0/task:0/device:CPU:0`` as ``CPU:0``."""
    return device.rsplit("device:", 1)[-1]


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else "no message"

