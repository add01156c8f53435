"""What runs inside each engine of a ``parameter_server`` cluster: one ``tf.distribute.Server``.

Under ParameterServerStrategy the worker and parameter-server processes run no Python code
of their own: each hosts a TensorFlow gRPC server, and the coordinator (the notebook's
kernel) sends them functions to run (workers) and variables to hold (parameter servers).
``serve`` starts that server on the task's port and returns; the server keeps running on
TensorFlow's own threads while the engine stays free for ``describe`` and ``exit_soon``.
Functions return plain dicts, never exception objects (see ``failures.describe_exception``).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from ..failures import describe_exception
from ..protocol import Outcome

_SERVER: Any = None          # the tf.distribute.Server of this process
_TASK: dict[str, Any] = {}   # {"job": "worker" | "ps", "index": i, "cluster": {...}}


def serving() -> bool:
    """True once this engine runs a TensorFlow server for nbdist."""
    return _SERVER is not None


def serve(cluster: dict[str, list[str]], job: str, index: int) -> dict[str, Any]:
    """Start this process's TensorFlow server as task ``index`` of ``job`` in ``cluster``."""
    global _SERVER
    try:
        import tensorflow as tf

        tf.get_logger().setLevel("WARNING")
        if _SERVER is not None:
            raise RuntimeError(f"this engine already serves /job:{_TASK['job']}/task:"
                               f"{_TASK['index']}")
        try:
            _SERVER = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                                           task_index=index, protocol="grpc", start=True)
        except Exception as err:
            text = str(err)
            if "already in use" in text or "Could not start gRPC server" in text:
                raise RuntimeError(
                    f"TensorFlow could not listen on {cluster[job][index]} for /job:{job}/"
                    f"task:{index} (another process took the port after nbdist chose it). "
                    "Run `%distribute restart`: it picks new free ports."
                ) from err
            raise
        _TASK.update(job=job, index=index, cluster=cluster)
        return Outcome(ok=True, value=describe()).to_dict()
    except BaseException as err:  # reported to the kernel, which names this task
        return Outcome(ok=False, error=describe_exception(err)).to_dict()


def describe() -> dict[str, Any]:
    """This task's identity and TensorFlow version, for ``%distribute status``."""
    import tensorflow as tf

    return {"pid": os.getpid(), "host": socket.gethostname(), "job": _TASK.get("job"),
            "index": _TASK.get("index"), "tf_version": tf.__version__,
            "target": getattr(_SERVER, "target", None)}


def exit_soon() -> None:
    """End this engine in a moment, skipping atexit handlers (a gRPC server cannot be
    stopped in TensorFlow 2: ``Server.join`` never returns and there is no ``stop``)."""
    threading.Timer(0.05, os._exit, (0,)).start()
