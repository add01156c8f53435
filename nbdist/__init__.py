"""nbdist: distributed TensorFlow from a notebook.

    %load_ext nbdist
    %distribute mirrored --devices 4
    %%distribute --step --data train_ds

Importing nbdist is cheap: TensorFlow, plotly and the magics load only when used.
"""

from __future__ import annotations

from typing import Any

from . import session as session  # registers Run.explain's probes (input, baseline)
from . import widgets as widgets  # registers Run.plot (the Run store imports no view)
from .errors import NbdistError
from .telemetry.run import Run, runs
from .tflogs import set_verbose
from .version import __version__ as __version__

# What the API reference documents (docs/reference/api.md; tests/test_import.py compares them).
# ``load_ipython_extension`` is IPython's hook behind ``%load_ext nbdist``, not called by users.
__all__ = [
    "NbdistError",
    "Run",
    "compare",
    "picker",
    "pull",
    "push",
    "runs",
    "set_verbose",
    "show_graph",
    "strategy",
]


def show_graph(fn: Any, *args: Any, **options: Any) -> Any:
    """Draw the dataflow graph of a tf.function traced on ``args``: ops as nodes, tensors as
    edges, one color per device, collective ops highlighted, op counts per device below.
    Returns the GraphView (see ``nbdist.graphview.graph_view`` for the options)."""
    from .graphview import show_graph as show

    return show(fn, *args, **options)


def compare(runs: Any = None, x: str = "step", metric: str = "loss", **options: Any) -> Any:
    """Overlay runs' curves, one line per run, as TensorBoard's run selector does: ``metric``
    (``loss``, ``accuracy``, ``val_loss``, ``step_ms``...) against ``x`` ("step"; "time":
    seconds since each run started; "wall": the clock). ``runs``: Runs (``nbdist.runs[-3:]``,
    ``nbdist.Run.load(PATH)``), default every run of this kernel; each is named by its
    ``--name`` or by what differs between them (``Run.label``). ``smoothing=0.6`` smooths the
    lines as TensorBoard does. A run resumed from a ``--checkpoint`` goes on from the run it
    resumed. Returns a plotly Figure, shown when it is the cell's value (see
    ``nbdist.widgets.compare``)."""
    from .widgets.compare import compare as draw

    return draw(runs, x=x, metric=metric, **options)


def strategy() -> Any:
    """The notebook's ``tf.distribute`` strategy (the one ``%distribute ...`` built), for
    hand-written code: ``strategy.run``, ``strategy.experimental_distribute_dataset``,
    ``strategy.scope()``. ``%distribute`` also names it ``strategy`` in the notebook unless
    that name is already yours. In a worker process: that worker's strategy."""
    import sys

    worker = sys.modules.get("nbdist.cluster.inengine.worker")
    if worker is not None and worker.is_worker() and worker.state().handle is not None:
        return worker.state().handle.strategy
    from .session import current_session

    return current_session().strategy()


def picker() -> Any:
    """Show the strategy picker widget (the same as ``%distribute`` with no arguments)."""
    from .widgets.picker import picker as show

    return show()


def push(*names: str, **values: Any) -> None:
    """Copy kernel variables (``push("lr", "config")``) and/or values (``push(lr=0.1)``) into
    every worker's namespace (``%distribute multiworker``); ``%distribute push NAME...``."""
    from .session import current_session

    current_session().push(*names, **values)


def pull(name: str, worker: int = 0, into: Any = None) -> Any:
    """The value of ``name`` on worker ``worker`` (default 0); ``%distribute pull NAME``. A
    Keras model comes as a model of this kernel's Keras: ``into`` (a kernel model) with its
    weights set in place when they have the same shapes, else one built from its config."""
    from .session import current_session

    return current_session().pull(name, worker, into)


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%distribute`` / ``%%distribute`` (called by ``%load_ext nbdist``), the hooks
    on cells without it (their fits recorded, their pasted strategy code checked), and open
    the comm that keeps the JupyterLab status bar up to date."""
    from .lab.comm import LabChannel
    from .lab.state import kernel_state
    from .lab.verdict import LiveVerdict
    from .magics import DistributeMagics
    from .session import current_session
    from .tflogs import quiet_cpp_logs
    from .widgets.progress import has_frontend

    quiet_cpp_logs()    # before TensorFlow first logs; NBDIST_VERBOSE=1 keeps its C++ lines
    ipython.register_magics(DistributeMagics)
    session = current_session(ipython)
    if session.lab_channel is None:
        # the status bar's verdict: only where a frontend shows it
        session.follow_verdict(lambda changed: LiveVerdict(changed,
                                                           enabled=has_frontend(ipython)))
        channel = LabChannel(lambda: kernel_state(session), session.status_text)
        session.listeners.append(channel.publish)       # throttled; cheap when unchanged
        ipython.events.register("post_run_cell", session.flush_listeners)
        session.lab_channel = channel
    if session.pre_run_cell not in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", session.pre_run_cell)
        ipython.events.register("post_run_cell", session.post_run_cell)
        session.lab_channel.open()
    if session.pasted_in_plain_cell not in ipython.input_transformers_post:
        ipython.input_transformers_post.append(session.pasted_in_plain_cell)


def unload_ipython_extension(ipython: Any) -> None:
    from .session import current_session

    session = current_session(ipython)
    session.stop()
    if session.pre_run_cell in ipython.events.callbacks["pre_run_cell"]:
        session.post_run_cell()
        ipython.events.unregister("pre_run_cell", session.pre_run_cell)
        ipython.events.unregister("post_run_cell", session.post_run_cell)
    if session.pasted_in_plain_cell in ipython.input_transformers_post:
        ipython.input_transformers_post.remove(session.pasted_in_plain_cell)
    if session.lab_channel is not None:
        session.lab_channel.close()
        session.listeners.remove(session.lab_channel.publish)
        ipython.events.unregister("post_run_cell", session.flush_listeners)
        session.lab_channel = None


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "nbdist"}]
