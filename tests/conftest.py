"""Shared fixtures: one real IPython shell with nbdist loaded and 4 logical CPU devices.

TensorFlow fixes its device layout once per process, so the in-process tests share one layout
(4 logical CPUs, made by the first `%distribute mirrored --devices 4`). Tests of device setup
that need a fresh process run a subprocess instead.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A shell that starts a command in the background (`cmd &` without job control) makes it
# ignore SIGINT, and Python keeps it ignored: the tests that interrupt the kernel (Kernel >
# Interrupt is a SIGINT) would then see nothing happen. Take SIGINT back, for this process
# and (reset to the default at exec) for the kernels and scenarios it starts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = Path(__file__).resolve().parent

# Test tiers (markers registered in pyproject.toml; README "Test tiers" runs each one):
#   unit       in this process, no IPython shell, no TensorFlow (a unit test importing it fails)
#   kernel     the magics in a real IPython shell or Jupyter kernel, local strategies
#   cluster    worker processes: ipyparallel engines, tf.distribute servers, a user's ipcluster
#   browser    JupyterLab driven in chromium
#   notebooks  the tutorials executed with nbclient, and the Binder setup that runs them
TIERS = ("unit", "kernel", "cluster", "browser", "notebooks")

# Every test file's tier, the one place tiers are given: a test of another tier goes in a file
# of that tier, so that `-m TIER` collects only that tier's files. A file missing here, or a test
# marked with another tier than its file's, fails collection.
FILE_TIERS = {
    "test_allocator.py": "kernel",
    "test_arrivals.py": "unit",
    "test_baseline.py": "kernel",
    "test_batchsizes.py": "unit",
    "test_binder.py": "notebooks",
    "test_channel.py": "unit",
    "test_checkpoint.py": "kernel",
    "test_checkpoint_multiworker.py": "cluster",
    "test_run_labels.py": "kernel",
    "test_stragglers.py": "unit",
    "test_displayguard.py": "unit",
    "test_cluster.py": "cluster",
    "test_cluster_coldstart.py": "cluster",
    "test_cluster_compat.py": "cluster",
    "test_cluster_input.py": "cluster",
    "test_cluster_profile.py": "cluster",
    "test_cluster_pull.py": "cluster",
    "test_cluster_pull_names.py": "unit",
    "test_cluster_pull_walker.py": "kernel",
    "test_cluster_shutdown.py": "cluster",
    "test_cluster_unit.py": "unit",
    "test_compare.py": "unit",
    "test_isolation.py": "cluster",
    "test_correctness.py": "kernel",
    "test_dashboard_aggregate.py": "unit",
    "test_dashboard_kernel.py": "kernel",
    "test_dashboard_look.py": "unit",
    "test_dashboard_series.py": "unit",
    "test_dashboard_tensorboard.py": "kernel",
    "test_dashboard_views.py": "unit",
    "test_dashboard_widget.py": "unit",
    "test_devices.py": "kernel",
    "test_docs.py": "notebooks",
    "test_elastic.py": "cluster",
    "test_explain.py": "kernel",
    "test_explain_rules.py": "unit",
    "test_explain_straggler.py": "cluster",
    "test_export.py": "notebooks",
    "test_export_kernel.py": "kernel",
    "test_export_optimizers.py": "unit",
    "test_families.py": "kernel",
    "test_fastcall.py": "kernel",
    "test_fit_metrics.py": "kernel",
    "test_fitreduce.py": "kernel",
    "test_graphview.py": "kernel",
    "test_header.py": "unit",
    "test_hostbed.py": "cluster",
    "test_hostbed_inject.py": "cluster",
    "test_hostbed_ssh.py": "cluster",
    "test_import.py": "unit",
    "test_architecture.py": "unit",
    "test_input.py": "kernel",
    "test_interrupts.py": "unit",
    "test_labcomm.py": "unit",
    "test_labcomm_kernel.py": "kernel",
    "test_labverdict.py": "unit",
    "test_labverdict_kernel.py": "kernel",
    "test_launch.py": "cluster",
    "test_lossform.py": "kernel",
    "test_lossform_multiworker.py": "cluster",
    "test_magic_args.py": "kernel",
    "test_magics.py": "kernel",
    "test_memory.py": "kernel",
    "test_mistakes.py": "kernel",
    "test_mistakes_workers.py": "cluster",
    "test_mixed_precision.py": "kernel",
    "test_mixed_precision_multiworker.py": "cluster",
    "test_nonfinite.py": "kernel",
    "test_nonfinite_multiworker.py": "cluster",
    "test_notebooks.py": "notebooks",
    "test_paramserver.py": "cluster",
    "test_paramserver_input.py": "cluster",
    "test_paramserver_tutorial.py": "cluster",
    "test_pasted.py": "kernel",
    "test_pasted_code.py": "unit",
    "test_patching.py": "unit",
    "test_picker.py": "kernel",
    "test_private_apis.py": "unit",
    "test_private_apis_installed.py": "kernel",
    "test_rerun.py": "kernel",
    "test_rewrite.py": "unit",
    "test_ring_model.py": "unit",
    "test_run_store.py": "unit",
    "test_setup_commands.py": "unit",
    "test_spec.py": "unit",
    "test_static_notebook.py": "kernel",
    "test_static_view.py": "unit",
    "test_steps_per_call.py": "kernel",
    "test_strategy_object.py": "kernel",
    "test_tensorflow_advice.py": "unit",
    "test_tiers.py": "unit",
    "test_timing.py": "kernel",
    "test_timing_split.py": "unit",
    "test_tutorial_objects.py": "kernel",
    "test_tutorials_command.py": "notebooks",
    "test_words.py": "unit",
    "browser/test_dashboard_controls.py": "browser",
    "browser/test_dashboard_fit.py": "browser",
    "browser/test_dashboard_live.py": "browser",
    "browser/test_dashboard_reload.py": "browser",
    "browser/test_dashboard_scale.py": "browser",
    "browser/test_dashboard_theme.py": "browser",
    "browser/test_lab.py": "browser",
    "browser/test_lab_workers.py": "browser",
    "browser/test_notebook7.py": "browser",
}

TIER_PROBLEMS = pytest.StashKey[bool]()
# The tiers whose tests run in a random order inside their module, as pyproject's addopts ask
# (pytest-random-order): each test sets up what it needs. The others' modules run in a random
# order, but each module's tests in file order: scenarios on one cluster or browser, not
# checked in a random order yet.
SHUFFLED_TIERS = ("unit", "kernel")


def pytest_terminal_summary(terminalreporter, config):
    """The order's seed, also under -q: a failure that depends on the order replays with it."""
    seed = config.getoption("random_order_seed", None)
    bucket = config.getoption("random_order_bucket", None)
    if seed is None or bucket is None or str(bucket).startswith("default:"):
        return
    seed = str(seed).removeprefix("default:")
    terminalreporter.write_line(
        f"random order: --random-order-bucket={bucket} --random-order-seed={seed} "
        "replays it")


def tier_of(path) -> str | None:
    """The tier FILE_TIERS gives the test file or folder at ``path``: a folder's when all its
    files have that one; None for a file outside the tests or not listed."""
    try:
        rel = Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    if rel in FILE_TIERS:
        return FILE_TIERS[rel]
    inside = {tier for name, tier in FILE_TIERS.items() if name.startswith(rel + "/")}
    return inside.pop() if len(inside) == 1 else None


def pytest_ignore_collect(collection_path, config):
    """`-m TIER` collects only that tier's files: the unit tier then imports no test module
    of the others (most import TensorFlow, which the unit tier must do without)."""
    tier = (config.getoption("markexpr") or "").strip()
    if tier in TIERS and tier_of(collection_path) not in (None, tier):
        return True
    return None


def pytest_collection_finish(session):
    """Split the CPU into 4 logical devices before any test can initialise TensorFlow's devices
    (tests that build models directly would otherwise lock the process to one CPU device); a
    run of unit tests only never imports TensorFlow, and fails if it was imported."""
    if session.config.stash.get(TIER_PROBLEMS, False):
        return   # collection failed: no test runs
    others = [t for t in TIERS if t != "unit"]
    if not any(item.get_closest_marker(t) for item in session.items for t in others):
        if "tensorflow" in sys.modules and session.items:
            raise pytest.UsageError(
                "TensorFlow was imported while collecting the unit tier: a test module (or a "
                "module it imports) imports it at its top. Import it inside the tests that "
                "need it, in a file of another tier.")
        return
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)


def pytest_addoption(parser):
    parser.addoption(
        "--update-docs", action="store_true",
        help="the browser tests also copy the screenshots the README shows into docs/ "
             "(commit them); without it they only go to test-artifacts/, so CI never "
             "changes the tree")


@pytest.hookimpl(tryfirst=True)   # before `-m` deselects: every collected test is checked
def pytest_collection_modifyitems(config, items):
    """Give each test its file's tier; exactly one tier per test, and one per file: a test of
    another tier than its file's belongs in a file of that tier."""
    problems = []
    shuffling = config.pluginmanager.hasplugin("random_order")
    for item in items:
        own = [m.name for m in item.iter_markers() if m.name in TIERS]
        tier = tier_of(item.path)
        if len(own) > 1:
            problems.append(f"{item.nodeid}: several tiers {own}")
        elif own and tier not in (None, own[0]):
            problems.append(f"{item.nodeid}: tier {own[0]!r} in a {tier!r} file (move it to "
                            f"a {own[0]!r} file)")
        elif not own:
            if tier is None:
                rel = Path(item.path).name
                problems.append(f"{item.nodeid}: no tier (add {rel!r} to FILE_TIERS in "
                                f"tests/conftest.py, or mark the test with one of {TIERS})")
                continue
            item.add_marker(getattr(pytest.mark, tier))
        if (own or [tier])[0] not in SHUFFLED_TIERS and shuffling:
            item.add_marker(pytest.mark.random_order(disabled=True))
    if problems:
        config.stash[TIER_PROBLEMS] = True
        raise pytest.UsageError("tests without exactly one tier:\n  " + "\n  ".join(problems))


@pytest.fixture(autouse=True)
def _unit_tests_do_without_tensorflow(request):
    """A unit test that imports TensorFlow fails (the unit tier runs without it, in seconds);
    checked where no test of another tier imported it before."""
    if request.node.get_closest_marker("unit") is None or "tensorflow" in sys.modules:
        yield
        return
    yield
    if "tensorflow" in sys.modules:
        pytest.fail(f"{request.node.nodeid} imported TensorFlow: the unit tier runs without it. "
                    "Move the test to a file of the kernel tier, or test without TensorFlow.",
                    pytrace=False)


@pytest.fixture(scope="session")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "nbdist")
    shell.run_line_magic("distribute", KERNEL_STRATEGY)
    yield shell


#: The strategy of the shared shell (`ip`), which every module starts with.
KERNEL_STRATEGY = "mirrored --devices 4"


@pytest.fixture(scope="module", autouse=True)
def _each_module_starts_with_the_kernel_strategy(request):
    """Modules run in a random order around the one shared shell: a module that ended with
    another strategy (stopped, 2 devices, central_storage) would change what the next one
    tests, so a kernel or cluster module starts with the shell's strategy set back."""
    if tier_of(request.node.path) in ("kernel", "cluster"):
        session = getattr(sys.modules.get("nbdist.session"), "_SESSION", None)
        backend = session.backend if session is not None else None
        if session is not None and (backend is None or backend.spec.magic_line().removeprefix(
                "%distribute ") != KERNEL_STRATEGY):
            from helpers import kernel_strategy

            kernel_strategy(session.shell, KERNEL_STRATEGY)
    yield


@pytest.fixture(scope="session")
def tf_keras():
    """tf_keras (extra `legacy-keras`), for tests of what needs it: skipped with the reason when
    it is missing, failed instead under NBDIST_REQUIRE_ALL=1 (the README's test command)."""
    if importlib.util.find_spec("tf_keras") is None:
        from helpers import skip_unless_all_required

        skip_unless_all_required("tf_keras is not installed: python3 -m nbdist.install_tf_keras")
    import tf_keras

    return tf_keras


@pytest.fixture(autouse=True)
def _outside_any_event_loop(request):
    """Tests run as in a terminal IPython, outside any event loop, unless they open a browser
    (Playwright's sync API runs inside one) or make a loop themselves: a loop left marked
    running by an earlier test made ipyparallel behave as in a Jupyter kernel for every later
    one, which hid a race with `ipcluster stop` from the tests written for it."""
    if "browser" not in request.fixturenames:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        assert loop is None, f"an earlier test left this thread inside a running loop: {loop!r}"
