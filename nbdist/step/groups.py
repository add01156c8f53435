"""Several steps per compiled call: ``--steps-per-call K|auto``.

For a small step, calling the compiled function costs more than the step computes (~0.3-0.5
ms of dispatch per call here). As TensorFlow's custom-loop guides do, ``compile_group`` puts
the loop inside one ``tf.function``: a ``tf.while_loop`` over the distributed iterator runs up
to ``n`` steps per call (``n`` is a tensor, so every group size, the last partial one
included, uses one trace), stops early when the data ends (``get_next_as_optional``), and
gathers each step's per-replica numbers and a ``tf.timestamp`` after it into TensorArrays: one
row per step and replica is recorded after the call, as with one step per call. The steps run
the same operations in the same order, so the weights are those of one step per call.

``CallSizer`` chooses ``n``: ``K``, or with ``auto`` the fewest steps that keep the call's
dispatch under 5% of its time, at most 100 ms of steps (the Stop button and the dashboard act
between calls), measured on the run's first calls (3 of one step, 3 of 8 steps).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..families import STRATEGY_NAMES


def stack_replicas(strategy: Any, out: dict[str, Any]) -> Any:
    """A step's outputs as one [metrics, replicas] float64 tensor: one host fetch, not one per
    metric (float64 keeps tf.timestamp's precision; float32 losses convert exactly)."""
    import tensorflow as tf

    return tf.stack([tf.cast(tf.stack(strategy.experimental_local_results(v)), tf.float64)
                     for v in out.values()])


def unconverted_stack() -> Any:
    """``stack_replicas`` for calling inside a traced step: AutoGraph would otherwise rewrite
    it at every trace (40 ms of a cold start's first step), for no control flow of its own."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert(stack_replicas)


def compile_group(strategy: Any, replica_fn: Any, keys: list[str],
                  tracing: Callable[[], contextlib.AbstractContextManager[Any]]) -> Any:
    """A ``tf.function`` of ``(iterator, n)`` running up to ``n`` steps; it returns the steps'
    rows [steps, metrics, replicas], ``steps + 1`` timestamps (the call's start, then after each
    step) and how many steps ran (fewer than ``n`` when the data ended). ``tracing()`` wraps
    the tracing of the step on the replicas (``StepProbe.tracing``)."""
    import tensorflow as tf

    stack = unconverted_stack()

    def train_steps(arg: Any) -> Any:
        iterator, n = arg

        def body(i: Any, rows: Any, stamps: Any, last: Any, more: Any) -> Any:
            optional = iterator.get_next_as_optional()

            def step() -> Any:
                with tracing():
                    out = strategy.run(replica_fn, args=(optional.get_value(),))
                keys[:] = list(out)
                row = stack(strategy, out)
                with tf.control_dependencies([row, last]):   # after this step and the last
                    stamp = tf.timestamp()
                return i + 1, rows.write(i, row), stamps.write(i + 1, stamp), stamp

            i, rows, stamps, last = tf.cond(optional.has_value(), step,
                                            lambda: (i, rows, stamps, last))
            return i, rows, stamps, last, optional.has_value()

        rows = tf.TensorArray(tf.float64, size=0, dynamic_size=True)
        start = tf.timestamp()
        stamps = tf.TensorArray(tf.float64, size=0, dynamic_size=True).write(0, start)
        # one iteration at a time: the steps run in order, as with one step per call
        count, rows, stamps, _, _ = tf.while_loop(
            lambda i, rows, stamps, last, more: tf.logical_and(i < n, more), body,
            (tf.constant(0), rows, stamps, start, tf.constant(True)), parallel_iterations=1)
        return rows.stack(), stamps.stack(), count

    return tf.function(train_steps)


def agreement(strategy: Any) -> Callable[[int], int] | None:
    """For a strategy whose replicas span several workers (multiworker): a function that
    turns each worker's choice of a whole number into the one all of them take (the mean,
    rounded up) with one all-reduce; None when every replica is in this process.

    Each worker measures its own calls, but the calls must be the same on every worker: a
    worker running more steps in a call than a peer, or a timed step the peer runs grouped,
    waits in the call's collective until it times out. So ``auto`` group sizes and the
    timed steps' spacing are agreed on; each worker calls it at the same steps (all take
    the same decisions before it)."""
    import tensorflow as tf

    local = len(strategy.extended.worker_devices)
    if strategy.num_replicas_in_sync <= local:
        return None

    def agree(choice: int) -> int:
        mine = strategy.run(lambda: tf.constant(float(choice), tf.float64))
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, mine, axis=None)
        return math.ceil(float(total) / strategy.num_replicas_in_sync)

    return agree


@functools.lru_cache(maxsize=64)
def steps_tensor(n: int) -> Any:
    """``n`` as the int32 tensor a grouped call takes (one trace for every group size)."""
    import tensorflow as tf

    return tf.constant(n, tf.int32)


class CallSizer:
    """How many steps the next call runs (see the module doc)."""

    target = 0.05          # dispatch at most this share of a call
    max_call_ms = 100.0    # ...but no call longer than this (Stop, dashboard) unless K says so
    max_steps = 256
    probe = 8              # auto measures calls of 1 and of this many steps
    samples = 3

    def __init__(self, setting: int | str, agree: Callable[[int], int] | None = None):
        self.auto = setting == "auto"
        self.agree = agree   # several workers: one K for all (``agreement``)
        self.k = 1 if self.auto else int(setting)
        self._one: list[float] = []                      # ms of calls of one step
        self._many: list[tuple[int, float]] = []         # (steps, ms) of longer calls
        self.measured: tuple[float, float] | None = None   # (dispatch ms, compute ms per step)

    def size(self) -> int:
        if not self.auto or self.measured is not None:
            return self.k
        return 1 if len(self._one) < self.samples else self.probe

    def observe(self, steps: int, call_ms: float) -> None:
        """A call (not the one that traced) of ``steps`` untimed steps took ``call_ms`` (a
        call the timing or the data cut short counts with its own length)."""
        if not self.auto or self.measured is not None:
            return
        if steps == 1:
            self._one.append(call_ms)
        else:
            self._many.append((steps, call_ms))
        if len(self._one) < self.samples or len(self._many) < self.samples:
            return
        one = min(self._one)
        compute = max(statistics.median((ms - one) / (n - 1) for n, ms in self._many), 1e-3)
        dispatch = max(one - compute, 0.0)
        wanted = math.ceil(dispatch * (1 - self.target) / (self.target * compute))
        longest = max(1, math.floor(self.max_call_ms / compute))
        self.k = max(1, min(wanted, longest, self.max_steps))
        if self.agree is not None:
            self.k = self.agree(self.k)
        self.measured = (dispatch, compute)

    def note(self) -> str | None:
        """For the Run: what ``auto`` chose and why."""
        if not self.auto:
            return None
        if self.measured is None:
            return ("--steps-per-call auto: the run ended before the group size was measured "
                    f"({self.samples} calls of one step and {self.samples} longer ones are "
                    "needed), so it ran short calls; with more steps it picks K itself")
        dispatch, compute = self.measured
        return (f"--steps-per-call auto chose {self.k} steps per call (measured {dispatch:.2f} "
                f"ms to dispatch a call, {compute:.2f} ms per step)")


def lost_rows_note(step: int, wanted: int) -> str:
    """For the Run of a grouped call that failed."""
    return (f"the call of steps {step}-{step + wanted - 1} failed: the rows of the steps it "
            f"finished are lost with it (at most {wanted - 1}; their updates to the weights "
            "are kept), as --steps-per-call runs them inside one compiled call")


GROUPED_NOTE = ("data_ms is not measured with --steps-per-call: the batches are read inside the "
                "compiled call; step_ms is the time between the steps' in-graph timestamps")


def refuse_grouped_steps(spec: Any, family: str) -> None:
    """For a family whose steps are scheduled one by one (parameter_server): refuse
    ``--steps-per-call`` before anything runs rather than ignore it."""
    if spec.steps_per_call != 1:
        raise ConfigError(
            f"--steps-per-call {spec.steps_per_call} groups steps into one call of "
            f"strategy.run, but {family} schedules each step on a worker by itself "
            "(ClusterCoordinator.schedule). Drop --steps-per-call here; it applies to "
            f"{', '.join(n for n in STRATEGY_NAMES if n != family)}.")
