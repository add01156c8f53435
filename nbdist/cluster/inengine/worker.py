"""What runs inside each worker engine: its strategy, its channel to the kernel, heartbeats.

The kernel calls these functions on the engines through ipyparallel (``apply``); they return
plain dicts, never exception objects (see ``failures.describe_exception``). The engine's
process environment already holds ``TF_USE_LEGACY_KERAS`` (set by the launcher, before any
TensorFlow import); ``setup`` adds ``TF_CONFIG`` and creates MultiWorkerMirroredStrategy before
any other TensorFlow op, as TensorFlow requires.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ...telemetry.channel import ChannelClient
from .. import protocol
from ..failures import describe_exception
from ..protocol import Outcome, StopGate
from . import stacks
from .faults import FaultPlan

#: Seconds between heartbeats.
HEARTBEAT_S = 1.0


@dataclass
class WorkerState:
    index: int
    workers: int
    tf_config: dict[str, Any]
    keras: str
    channel: ChannelClient | None = None
    handle: Any = None                      # nbdist.strategies.StrategyHandle
    step: int = 0                           # steps done in the current (or last) run
    running: bool = False                   # in a run (``runs.in_run``)
    gate: StopGate | None = None
    faults: FaultPlan | None = None
    send_unsent: Any = None                 # in a run: sends its rows not sent yet (runs.in_run)
    cells: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


_STATE: WorkerState | None = None


def state() -> WorkerState:
    if _STATE is None:
        raise RuntimeError("this engine is not an nbdist worker (setup was not called)")
    return _STATE


def is_worker() -> bool:
    """True once this engine has become an nbdist worker."""
    return _STATE is not None


def release() -> bool:
    """Stop being a worker (heartbeats, channel); True if this engine was one."""
    global _STATE
    st, _STATE = _STATE, None
    if st is None:
        return False
    st.stop.set()
    if st.channel is not None:
        st.channel.close()
    return True


def setup(index: int, workers: int, tf_config: dict[str, Any],
          options: dict[str, Any]) -> dict[str, Any]:
    """Become worker ``index``: connect the channel, then create the strategy."""
    global _STATE
    try:
        os.environ["TF_CONFIG"] = json.dumps(tf_config)
        st = WorkerState(index, workers, tf_config, options["keras"])
        st.gate = StopGate(lambda message: _send(st, message))
        st.faults = FaultPlan(lambda message: _send(st, message), lambda: _flush(st))
        host, port = options["channel"]
        st.channel = ChannelClient((host, port), bytes.fromhex(options["key"]), index,
                                   on_message=lambda message: _on_control(st, message))
        _STATE = st
        threading.Thread(target=_heartbeat, args=(st, options.get("kernel_pid")),
                         name="nbdist-heartbeat", daemon=True).start()
        _build(st, options)
        _user_namespace().update(nbdist_worker=index, nbdist_workers=workers)
        return Outcome(ok=True, value=describe()).to_dict()
    except BaseException as err:  # reported to the kernel, which names this worker
        return Outcome(ok=False, error=describe_exception(err)).to_dict()


def _build(st: WorkerState, options: dict[str, Any]) -> None:
    from ...spec import StrategySpec
    from ...strategies import build_strategy

    legacy = os.environ.get("TF_USE_LEGACY_KERAS") == "1"
    if legacy != (st.keras == "legacy"):
        raise RuntimeError(f"engine started with TF_USE_LEGACY_KERAS={legacy}, "
                           f"but keras={st.keras!r} was asked for")
    spec = StrategySpec.from_dict(options["spec"])
    import tensorflow as tf

    # TensorFlow's INFO lines about the strategy would stream into every cell as noise.
    tf.get_logger().setLevel("WARNING")
    try:
        st.handle = build_strategy(spec, collective_timeout=options.get("collective_timeout"))
        # what TensorFlow's tutorials call it, for hand-written code in the workers' cells
        _user_namespace().setdefault("strategy", st.handle.strategy)
    except Exception as err:
        text = str(err)
        if "already in use" in text or "Could not start gRPC server" in text:
            raise RuntimeError(
                f"TensorFlow could not listen on its TF_CONFIG port {_my_address(st)}: it is "
                "already in use (another process took it after nbdist chose it). Run the "
                "`%distribute multiworker` line (or `%distribute restart`) again: nbdist picks "
                "new free ports."
            ) from err
        raise


def _my_address(st: WorkerState) -> str:
    return st.tf_config["cluster"]["worker"][st.index]


def _machine() -> str:
    """This machine: its running kernel's boot id (Linux), else the host name. Workers with
    the same one share its cores (simulated hosts in network namespaces included)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or socket.gethostname()
    except OSError:
        return socket.gethostname()


def describe() -> dict[str, Any]:
    """This worker's identity, TF_CONFIG, devices and Keras, for ``%distribute status``."""
    st = state()
    info: dict[str, Any] = {
        "worker": st.index, "pid": os.getpid(), "host": socket.gethostname(),
        "machine": _machine(),
        "tf_config": st.tf_config, "keras_mode": st.keras,
    }
    if st.handle is not None:
        import tensorflow as tf

        keras_module = tf.keras.__name__.split(".")[0]
        version = getattr(sys.modules.get(keras_module), "__version__", "?")
        info.update(
            devices=list(st.handle.devices), device_kind=st.handle.device_kind,
            replicas_local=len(st.handle.devices), replicas_total=st.handle.replicas,
            tf_version=tf.__version__, keras=f"{keras_module} {version}",
        )
    return info


def _send(st: WorkerState, message: dict[str, Any]) -> None:
    if st.channel is not None:
        st.channel.send(message)


def _flush(st: WorkerState) -> None:
    """Send the run's unsent rows and wait until the channel has written everything (before
    the process is killed or stopped)."""
    send_unsent = st.send_unsent
    if send_unsent is not None:
        send_unsent()
    if st.channel is not None:
        st.channel.flush(2.0)


def _on_control(st: WorkerState, message: dict[str, Any]) -> None:
    """Kernel messages, on the channel's reader thread (they work while the main thread is
    blocked)."""
    kind = message["type"]
    if kind == protocol.DUMP_STACKS:   # a stall: the kernel may kill this worker next
        _flush(st)
        _send(st, {"type": protocol.STACKS, **stacks.snapshot(st.step)})
    elif kind == protocol.FLUSH_ROWS:
        _flush(st)
        _send(st, {"type": protocol.ROWS_FLUSHED})
    elif kind == protocol.INJECT:
        # --at-step N counts the steps of a run: between runs, wait for the next one
        st.faults.on_control(message, st.step if st.running else -1)
    else:
        st.gate.on_control(message)


def _heartbeat(st: WorkerState, kernel_pid: int | None) -> None:
    """Tell the kernel we are alive; exit if the (local) kernel process is gone."""
    while not st.stop.wait(HEARTBEAT_S):
        _send(st, {"type": protocol.HEARTBEAT, "step": st.step})
        if kernel_pid and not _pid_alive(kernel_pid):
            os._exit(3)  # the kernel died without stopping us: do not linger as an orphan


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _user_namespace() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("nbdist workers run inside ipyparallel engines (IPython kernels)")
    return shell.user_ns


def user_namespace() -> dict[str, Any]:
    """The engine's user namespace: where cells run and ``push``/``pull`` put and take."""
    return _user_namespace()


def exit_soon() -> None:
    """End this engine process in a moment, skipping atexit handlers.

    A worker cannot be stopped gracefully anyway: TensorFlow's own exit handlers wait for
    the other tasks of the coordination service, which makes SIGTERM take seconds.
    """
    st = _STATE
    if st is not None:
        st.stop.set()
        if st.channel is not None:
            st.channel.close()
    threading.Timer(0.05, os._exit, (0,)).start()


def ping() -> dict[str, Any]:
    """A trivial round trip (tests, benchmarks)."""
    return Outcome(ok=True, value=time.time()).to_dict()
