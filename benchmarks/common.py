"""What the benchmarks that run cells share: a real IPython shell with nbdist loaded, cells
that must succeed, the tiny MLP of ``overhead.py`` on the kernel's strategy, and CPU and wall
time of one side measured the same way as the other's."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from typing import Any

# After overhead.SETUP: the data, model and optimizer both sides train (STEPS batches).
MLP_ON_STRATEGY = """
train_ds = make_data("mlp", GLOBAL_BATCH).repeat().take(STEPS)
dist_ds = strategy.experimental_distribute_dataset(train_ds)
with strategy.scope():
    model = make_model("mlp")
    optimizer = tf.keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
"""


def ipython_shell() -> Any:
    """A real IPython shell, the kind a Jupyter kernel runs (``InteractiveShell``: no terminal,
    no history file). Made from IPython alone: IPython's testing shell imports pytest, which
    the README's install does not bring, so benchmarks built on it failed there."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    return InteractiveShell.instance(config=config)


def nbdist_shell(strategy: str | None = "mirrored --devices 4") -> Any:
    """A real IPython shell with nbdist loaded and ``%distribute STRATEGY`` run (the default
    splits the CPU into 4 logical devices for the whole process)."""
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "nbdist")
    if strategy:
        ip.run_line_magic("distribute", strategy)
    return ip


def ok(ip: Any, code: str) -> None:
    """Run a cell; end the benchmark with its error if it fails."""
    result = ip.run_cell(textwrap.dedent(code), store_history=False)
    if result.error_before_exec or result.error_in_exec:
        error = result.error_before_exec or result.error_in_exec
        raise SystemExit(f"benchmark cell failed: {error}")


def mlp_on_strategy(ip: Any, steps: int) -> None:
    """``MLP_ON_STRATEGY`` in ``ip`` (after overhead.SETUP), ``steps`` batches."""
    ip.user_ns.update(GLOBAL_BATCH=64, kind="mlp", time=time, STEPS=steps)
    ok(ip, MLP_ON_STRATEGY)


def timed(action: Callable[[], Any]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``action()``: CPU is user+sys of this process, all
    threads (steadier than wall on a shared machine)."""
    cpu, wall = time.process_time(), time.perf_counter()
    action()
    return time.process_time() - cpu, time.perf_counter() - wall


def ratio(a: list[tuple[float, float]], b: list[tuple[float, float]], i: int) -> float:
    """Total of ``a`` over total of ``b`` (i: 0 CPU, 1 wall) over interleaved rounds."""
    return sum(x[i] for x in a) / sum(x[i] for x in b)
