"""Every private third-party API nbdist uses is declared in nbdist.hooks and still exists.

Fast (no training, no cluster): one test per declared API (``nbdist.hooks.REGISTRY``) fails
naming the feature that needs it when the installed library lacks it; a source scan fails
when code outside ``nbdist/hooks/`` reaches a private third-party attribute itself. tf_keras
is optional: its APIs are skipped when it is not installed, unless ``NBDIST_REQUIRE_ALL`` is
set (CI sets it), which makes them fail instead. The hooks' fallbacks are unit-tested with
stand-in objects.
"""

from __future__ import annotations

import ast
import logging
import os
import pathlib
from typing import Any

import pytest
from helpers import run_python

from nbdist import hooks
from nbdist.hooks import ipykernel as ipykernel_hooks
from nbdist.hooks import ipyparallel as ipyparallel_hooks
from nbdist.hooks import keras as keras_hooks
from nbdist.hooks import tensorflow as tf_hooks
from nbdist.hooks import tf_coordinator, tf_keras

PACKAGE = pathlib.Path(hooks.__file__).resolve().parent.parent
#: Non-public import paths: only nbdist/hooks/ may import from them.
PRIVATE_MODULES = ("tensorflow.python", "tensorflow.core", "keras.src", "tf_keras.src")
#: Underscore names nbdist may use on objects outside nbdist/hooks/ that it does not define
#: with ``self.``: documented stdlib functions (``os._exit``, the public API of
#: ``collections.namedtuple``/``typing.NamedTuple``, ``sys._current_frames``) and markers nbdist
#: puts on its own wrappers. IPython's documented display protocol (``_repr_*_``,
#: ``_ipython_display_``) is public too.
ALLOWED = {"_exit", "_nbdist", "_fields", "_asdict", "_replace", "_make", "_field_defaults",
           "_repr_mimebundle_", "_repr_html_", "_repr_pretty_", "_ipython_display_",
           "_render_traceback_", "_current_frames"}


def _require_installed(api: hooks.PrivateAPI) -> None:
    """Skip (optional library, NBDIST_REQUIRE_ALL unset) or fail when the library is absent."""
    if not api.installed():
        message = f"{api.feature}: {api.library} is not installed, so {api.api} is unchecked"
        if api.optional and not os.environ.get("NBDIST_REQUIRE_ALL"):
            pytest.skip(message)
        pytest.fail(f"{message} (" + ("NBDIST_REQUIRE_ALL is set" if api.optional else
                                      f"{api.library} is a dependency of nbdist") + ")")


def test_a_missing_optional_library_skips_unless_all_are_required(monkeypatch) -> None:
    absent = hooks.PrivateAPI("nbdist_no_such_library", "X._y", "none.y", "a feature", "1.0",
                              "nothing", lambda: None, ("_y",), optional=True)
    monkeypatch.delenv("NBDIST_REQUIRE_ALL", raising=False)
    with pytest.raises(pytest.skip.Exception, match="a feature: nbdist_no_such_library"):
        _require_installed(absent)
    monkeypatch.setenv("NBDIST_REQUIRE_ALL", "1")
    with pytest.raises(pytest.fail.Exception, match=r"a feature: .*\(NBDIST_REQUIRE_ALL is set\)"):
        _require_installed(absent)


def test_check_reports_what_is_missing_with_the_feature() -> None:
    # the libraries that do not import TensorFlow (test_private_apis_installed.py: all)
    assert hooks.check(("argparse", "ipykernel", "ipyparallel")) == []
    gone = hooks.PrivateAPI("ipykernel", "Kernel._gone", "ipykernel.nothing", "a feature",
                            "7.4", "nothing works", lambda: _raise(ImportError("moved")))
    why = gone.missing()
    assert why == "ImportError: moved"
    text = gone.explain(why)
    assert text.startswith("a feature: ipykernel 7.") and "Without it: nothing works" in text


def _raise(err: Exception) -> Any:
    raise err


def test_importing_the_hooks_imports_no_library() -> None:
    done = run_python("""
        import sys
        import nbdist.hooks
        from nbdist.hooks import (ipykernel, ipyparallel, keras, tensorflow,
                                  tf_coordinator, tf_keras)
        heavy = [m for m in ("tensorflow", "plotly", "keras", "tf_keras", "ipyparallel")
                 if m in sys.modules]
        print("HEAVY", heavy, len(nbdist.hooks.REGISTRY))
    """)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout


# -- the registry covers every call site ------------------------------------------------------
def _sources() -> list[tuple[pathlib.Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), filename=str(path)))
            for path in sorted(PACKAGE.rglob("*.py"))
            if "hooks" not in path.relative_to(PACKAGE).parts]


def _own_names(trees: list[tuple[pathlib.Path, ast.Module]]) -> set[str]:
    """Underscore names nbdist defines: functions, classes, globals, ``self.``/``cls.``
    attributes and class attributes."""
    own: set[str] = set()
    for _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                own.add(node.attr)
    return {name for name in own if name.startswith("_")}


def _private_uses(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, name)`` of each ``x._name`` (x not self/cls) and of each ``"_name"`` given to
    getattr/hasattr/setattr/delattr, plus imports of non-public modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append((node.lineno, node.attr))
            if node.attr == "__internal__":
                found.append((node.lineno, node.attr))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
            found.append((node.lineno, node.args[1].value))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names]
            found += [(node.lineno, name) for name in names
                      if name.startswith(PRIVATE_MODULES)]
    return found


def _private(name: str) -> bool:
    return name == "__internal__" or (name.startswith("_") and not name.startswith("__"))


def test_no_private_third_party_api_outside_the_hooks() -> None:
    trees = _sources()
    own = _own_names(trees) | ALLOWED
    declared = {name: api for api in hooks.REGISTRY for name in api.names}
    problems = []
    for path, tree in trees:
        where = path.relative_to(PACKAGE.parent)
        for line, name in _private_uses(tree):
            api = declared.get(name)
            if api is not None:
                problems.append(f"{where}:{line} uses {name} ({api.feature}) itself: call "
                                f"nbdist.hooks.{api.hook} instead")
            elif name.startswith(PRIVATE_MODULES) or name not in own:
                problems.append(f"{where}:{line} uses {name}, private to another library: "
                                "move it into nbdist/hooks/ and declare it in REGISTRY")
    assert not problems, "\n".join(problems)


def _used_in_code(module: str) -> set[str]:
    """Attribute names, imported names and string constants in a hooks module's code, outside
    its ``DECLARED`` list and docstrings."""
    tree = ast.parse(PACKAGE.joinpath("hooks", f"{module}.py").read_text())
    used: set[str] = set()
    for top in tree.body:
        if isinstance(top, ast.Assign) and any(getattr(t, "id", "") == "DECLARED"
                                               for t in top.targets):
            continue
        docstrings = {id(n.value) for n in ast.walk(top) if isinstance(n, ast.Expr)}
        for node in ast.walk(top):
            if isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add(node.name)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and id(node) not in docstrings):
                used.add(node.value)
    return used


def test_every_declared_name_is_what_its_hook_uses() -> None:
    """The names the scan above looks for are the ones the hooks really use."""
    unused = [f"{api.id}: {name}" for api in hooks.REGISTRY for name in api.names
              if name not in _used_in_code(api.hook.split(".")[0])]
    assert all(api.names for api in hooks.REGISTRY) and not unused, unused


# -- fallbacks, with stand-ins ----------------------------------------------------------------
def test_tensorflow_hooks_degrade_on_objects_without_the_api() -> None:
    assert not tf_hooks.can_call_flat(object())
    assert tf_hooks.quiet_retracing_warning(object()) is False
    assert tf_hooks.set_collective_key_base(type("S", (), {}), 5) is False
    assert tf_coordinator.remote_value_ready(object()) is True    # fetch blocks instead
    assert tf_coordinator.recovery_lock(object()) is None
    assert tf_coordinator.stop_threads(object(), blocked=False) is False


def test_stop_threads_stops_every_part_and_only_clears_the_flag_when_blocked() -> None:
    calls: list[str] = []

    class Part:
        def __init__(self, name: str):
            self.name = name

        def stop(self) -> None:
            calls.append(self.name)

        def start_cancel(self) -> None:
            calls.append(f"cancel {self.name}")

    handler = Part("handler")
    handler._should_preemption_thread_run = True
    cluster = type("Cluster", (), {"failure_handler": handler, "workers": [Part("w0")],
                                   "closure_queue": Part("queue"),
                                   "resource_cancellation_mgr": Part("resources")})()
    coordinator = type("Coordinator", (), {"_cluster": cluster})()
    assert tf_coordinator.stop_threads(coordinator, blocked=True)
    assert calls == ["w0", "queue", "cancel resources"]
    assert handler._should_preemption_thread_run is False
    calls.clear()
    assert tf_coordinator.stop_threads(coordinator, blocked=False)
    assert calls == ["handler", "w0", "queue", "cancel resources"]


def test_remote_value_ready_reads_the_status() -> None:
    def remote(name: str) -> Any:
        return type("Remote", (), {"_status": type("Status", (), {"name": name})()})()

    assert not tf_coordinator.remote_value_ready(remote("NOT_READY"))
    assert tf_coordinator.remote_value_ready(remote("READY"))


def test_library_hooks_degrade_on_objects_without_the_api() -> None:
    assert keras_hooks.clear_initial_epoch(object()) is False
    assert keras_hooks.wrapped_variable(object()) is None
    assert tf_keras.accept_tensor_logs(object()) is False
    assert not ipykernel_hooks.can_watch_comm(None)
    assert not ipykernel_hooks.can_watch_comm(object())
    assert ipyparallel_hooks.client_config(object()) == {}


def test_watch_comm_sees_each_message_and_unwatch_restores_the_method(caplog) -> None:
    class Comm:
        def _reply_subshell_for(self, data: Any, default: Any) -> Any:
            return default

    comm, seen = Comm(), []
    assert ipykernel_hooks.can_watch_comm(comm)
    unwatch = ipykernel_hooks.watch_comm(comm, seen.append)
    assert comm._reply_subshell_for({"a": 1}, "sub") == "sub" and seen == [{"a": 1}]
    other = Comm()
    ipykernel_hooks.watch_comm(other, lambda data: _raise(ValueError("no view")))
    with caplog.at_level(logging.DEBUG, logger="nbdist.hooks.ipykernel"):
        assert other._reply_subshell_for({}, "sub") == "sub"   # on_data's error drops nothing
        assert other._reply_subshell_for({}, "sub") == "sub"
    warned, again = caplog.records     # reported once, then logged at debug level
    assert warned.levelno == logging.WARNING and "ValueError: no view" in warned.getMessage()
    assert again.levelno == logging.DEBUG
    unwatch()
    assert "_reply_subshell_for" not in vars(comm)


def test_cluster_running_without_the_private_method_reads_public_state() -> None:
    def launcher(state: str) -> Any:
        return type("Launcher", (), {"state": state})()

    def cluster(controller: str | None, engines: list[str]) -> Any:
        return type("Cluster", (), {
            "controller": None if controller is None else launcher(controller),
            "engines": {str(i): launcher(s) for i, s in enumerate(engines)}})()

    assert ipyparallel_hooks.cluster_running(cluster("running", []))
    assert not ipyparallel_hooks.cluster_running(cluster("after", ["after"]))
    assert ipyparallel_hooks.cluster_running(cluster(None, ["running"]))
    with_method = type("C", (), {"_is_running": lambda self: False})()
    assert not ipyparallel_hooks.cluster_running(with_method)


