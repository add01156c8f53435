"""Can these engines be nbdist workers? TensorFlow importable, same versions as the kernel.

Before any worker builds its strategy, ``preflight`` runs on every engine (one round trip, in
parallel) and reports the engine's TensorFlow and nbdist versions, read from package metadata
(``importlib.metadata``: the distribution first on the engine's ``sys.path``), then sets the
engine's environment (``TF_USE_LEGACY_KERAS``... must precede the TensorFlow import) and
imports TensorFlow. The kernel learns its own versions the same way, without importing
TensorFlow. ``check_reports`` turns what is wrong into one paragraph naming the worker and
the fix, before any worker waits on another in a collective it could never complete.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import socket
import sys
from typing import Any

from ..hooks.tensorflow import eager_context_initialized
from ..installed import tensorflow_distribution
from .engines.base import ClusterStartError


def nbdist_version() -> str | None:
    try:
        return importlib.metadata.version("nbdist")
    except importlib.metadata.PackageNotFoundError:
        return None


def kernel_versions() -> dict[str, Any]:
    """What the workers must match: this kernel's TensorFlow and nbdist (nothing imported)."""
    return {"tf": tensorflow_distribution(), "nbdist": nbdist_version()}


def tf_context_initialized() -> bool:
    """True if this process already initialised TensorFlow's eager context (too late for
    MultiWorkerMirroredStrategy, which must configure collective ops first)."""
    return eager_context_initialized()


# -- on the engine ----------------------------------------------------------------------------
def preflight(environment: dict[str, str], expected_tf: str | None) -> dict[str, Any]:
    """Runs on an engine: its versions; then, if TensorFlow matches, set ``environment``
    (only while TensorFlow is not imported yet) and import TensorFlow."""
    tf_dist = tensorflow_distribution()
    report: dict[str, Any] = {
        "host": socket.gethostname(), "pid": os.getpid(), "python": sys.executable,
        "tf": tf_dist, "nbdist": nbdist_version(),
        "tf_initialized": tf_context_initialized(),
    }
    if expected_tf is not None and tf_dist is not None and tf_dist[1] != expected_tf:
        return report   # a mismatch is reported as such; importing would only take time
    if "tensorflow" in sys.modules:   # too late to set: only check what matters
        report["env_conflicts"] = {
            k: os.environ.get(k) for k, v in environment.items()
            if k == "TF_USE_LEGACY_KERAS" and (os.environ.get(k) or "0") != v}
    else:
        os.environ.update(environment)
    spec = importlib.util.find_spec("tensorflow")
    report["tf_origin"] = getattr(spec, "origin", None) if spec else None
    try:
        import tensorflow  # noqa: F401  (what setup needs next anyway; slow, once)
    except BaseException as err:  # a broken install raises anything; the kernel reports it
        report["import_error"] = f"{type(err).__name__}: {str(err).strip()[:500]}"
    return report


# -- in the kernel ----------------------------------------------------------------------------
def check_engines(dispatcher: Any, engine_ids: list[int], environment: dict[str, str],
                  fix_env: str) -> dict[int, int]:
    """Run ``preflight`` on every worker's engine (``dispatcher``: a ``Dispatcher``); raise
    one ClusterStartError if any cannot be a worker; return {worker: engine pid}."""
    kernel = kernel_versions()
    expected = kernel["tf"][1] if kernel["tf"] else None
    n = len(engine_ids)
    outcomes, _ = dispatcher.call(preflight, [(environment, expected)] * n, quiet=True)
    who = {i: f"{i} (engine {engine_ids[i]})" for i in range(n)}
    broken = {w: o.error for w, o in outcomes.items() if not o.ok}
    if broken:   # e.g. nbdist itself missing there: the check could not even be unpickled
        w = min(broken)
        raise ClusterStartError(
            f"worker {who[w]} could not run nbdist's check ({broken[w]['type']}: "
            f"{broken[w]['message']}). Every engine needs nbdist and TensorFlow installed, "
            f"the same versions as this kernel's (nbdist {kernel['nbdist']}); then {fix_env}."
        )
    reports = {w: o.value for w, o in outcomes.items()}
    for w, report in reports.items():
        who[w] = f"{w} (engine {engine_ids[w]}, pid {report['pid']} on {report['host']})"
    check_reports(reports, who, kernel, fix_env)
    return {w: r["pid"] for w, r in reports.items()}


def _names(workers: list[int], who: dict[int, str]) -> str:
    named = ", ".join(who[w] for w in workers)
    return f"worker {named}" if len(workers) == 1 else f"workers {named}"


def _grouped(problems: dict[int, str]) -> tuple[list[int], str]:
    """The first problem and every worker that has exactly that problem."""
    first = min(problems)
    return sorted(w for w, text in problems.items() if text == problems[first]), problems[first]


def check_reports(reports: dict[int, dict[str, Any]], who: dict[int, str],
                  kernel: dict[str, Any], fix_env: str) -> None:
    """Raise ClusterStartError (one paragraph) if some worker cannot run this kernel's nbdist.

    ``who[i]`` names worker i (engine id, pid, host); ``fix_env`` ends each message: how to get
    fresh engines and retry (local processes, or a user's cluster).
    """
    kernel_tf = kernel.get("tf")
    checks = [
        ("import", lambda r: r.get("import_error")),
        ("missing", lambda r: r.get("tf") is None and r.get("tf_origin") is None),
        ("version", lambda r: kernel_tf and r.get("tf") and r["tf"][1] != kernel_tf[1]
         and f"{r['tf'][1]} ({r['tf'][0]})"),
        ("nbdist", lambda r: kernel.get("nbdist") and r.get("nbdist") not in (
            None, kernel["nbdist"]) and r["nbdist"]),
        ("initialized", lambda r: r.get("tf_initialized")),
        ("env", lambda r: r.get("env_conflicts") and ", ".join(
            f"{k}={v!r}" for k, v in sorted(r["env_conflicts"].items()))),
    ]
    for kind, test in checks:
        problems = {w: str(test(r)) for w, r in reports.items() if test(r)}
        if problems:
            workers, detail = _grouped(problems)
            raise ClusterStartError(_message(kind, _names(workers, who), detail,
                                             reports[workers[0]], kernel_tf, fix_env))


def _want(kernel_tf: tuple[str, str] | None) -> str:
    return f"`{kernel_tf[0]}=={kernel_tf[1]}`" if kernel_tf else "TensorFlow"


def _message(kind: str, names: str, detail: str, report: dict[str, Any],
             kernel_tf: tuple[str, str] | None, fix_env: str) -> str:
    python = report.get("python", "?")
    if kind == "import":
        origin = report.get("tf_origin") or "nowhere"
        return (f"{names} cannot import TensorFlow ({detail}; `tensorflow` resolves to "
                f"{origin}). Each worker must import the same TensorFlow as this kernel: "
                f"install {_want(kernel_tf)} for the engines' Python ({python}), and check "
                f"that their PYTHONPATH holds no other `tensorflow` package; then {fix_env}.")
    if kind == "missing":
        return (f"{names} has no TensorFlow installed (its Python is {python}). Install "
                f"{_want(kernel_tf)} there (`{python} -m pip install ...`); then {fix_env}.")
    if kind == "version":
        have = f"{kernel_tf[1]} ({kernel_tf[0]})" if kernel_tf else "?"
        return (f"{names} runs TensorFlow {detail} but this kernel has {have}. "
                "MultiWorkerMirroredStrategy needs the same TensorFlow on every worker (their "
                "graphs and collective ops must agree), and nbdist checks it against the "
                f"kernel's. Install {_want(kernel_tf)} for the engines' Python ({python}); "
                f"then {fix_env}.")
    if kind == "nbdist":
        return (f"{names} has nbdist {detail} but this kernel has a different version; the "
                "kernel and its workers talk nbdist's own protocol. Install the kernel's "
                f"nbdist version for the engines' Python ({python}); then {fix_env}.")
    if kind == "initialized":
        return (f"{names} already initialised TensorFlow (code ran there before, e.g. with "
                "%px), and MultiWorkerMirroredStrategy must be created before any other "
                f"TensorFlow operation in a process. The engines need fresh processes: "
                f"{fix_env}.")
    return (f"{names} already imported TensorFlow with {detail}, which differs from what "
            "nbdist needs (TF_USE_LEGACY_KERAS is read when TensorFlow loads Keras): the "
            f"engines need fresh processes (or choose --keras to match): {fix_env}.")
