"""The test tiers, the README's commands and CI agree: `.ci/run` is the README's test command,
which runs every tier, `ruff check` and the quickstart; the README has one command per tier;
a test without exactly one tier fails collection."""

import ast
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

try:
    import tomllib
except ImportError:   # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# By path: `import conftest` may find tests/browser/conftest.py, whichever pytest loaded first.
_SPEC = importlib.util.spec_from_file_location("tiers_conftest", ROOT / "tests" / "conftest.py")
conftest = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(conftest)


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def ci_commands() -> list[str]:
    """What `.ci/run` runs: its lines less comments and the shell's own setup."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if line.strip()
            and not line.lstrip().startswith(("#", "set ", "cd "))]


def test_ci_runs_exactly_the_readme_test_command_which_runs_everything():
    # The README's first two commands: set up and open the tutorials, then run all tests.
    setup, test_command = (block.strip() for block in readme_commands()[:2])
    assert ci_commands() == [test_command]
    steps = test_command.split(" && ")
    assert "python3 -m nbdist.quickstart" in steps     # the headless check the README documents
    prose = (ROOT / "README.md").read_text().replace(test_command, "")
    assert "python3 -m nbdist.quickstart" in prose, "the README no longer explains the quickstart"
    assert "ruff check" in steps
    assert steps[-1] == "NBDIST_REQUIRE_ALL=1 python3 -m pytest -q"   # no -m: every tier
    # The user's install sets up and opens the tutorials; CI installs what it installs and
    # nothing by hand: the same installer steps, and pip only for this package, whose `test`
    # extra is the user's extras plus test tools.
    user = setup.split(" && ")
    assert user[-1] == "python3 -m nbdist.tutorials"
    assert [s for s in user if "pip install" in s] == ["python3 -m pip install -e '.[cpu,lab]'"]
    assert [s for s in steps if "pip install" in s] == ["python3 -m pip install -q -e '.[test]'"]
    tf_keras = "python3 -m nbdist.install_tf_keras"
    assert [s for s in user if "nbdist.install_tf_keras" in s] == [tf_keras]
    assert [s for s in steps if "nbdist.install_tf_keras" in s] == [tf_keras]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "nbdist[cpu,lab]" in extras["test"]
    assert not any(r.lower().startswith(("tf-keras", "tf_keras", "tensorflow"))
                   for r in extras["test"])


def test_the_readme_runs_each_tier_registered_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = [line.split(":")[0] for line in config["markers"]]
    assert registered == list(conftest.TIERS) and "--strict-markers" in config["addopts"]
    tier_block = next(b for b in readme_commands() if "-m unit" in b)
    commands = [line.split("#")[0].strip() for line in tier_block.splitlines()]
    assert commands == [f"python3 -m pytest -q -m {tier}" for tier in conftest.TIERS]
    assert set(conftest.FILE_TIERS.values()) <= set(conftest.TIERS)
    files = {p.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert files == set(conftest.FILE_TIERS)


def test_a_test_without_exactly_one_tier_fails_collection(tmp_path):
    (tmp_path / "test_new.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.unit
        def test_tiered():
            pass

        def test_forgotten():
            pass

        @pytest.mark.unit
        @pytest.mark.kernel
        def test_greedy():
            pass
    """))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "unit", "-p", "conftest",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"})
    out = done.stdout + done.stderr
    assert done.returncode == 4, out
    assert "test_new.py::test_forgotten: no tier" in out
    assert "test_new.py::test_greedy: several tiers ['kernel', 'unit']" in out
    assert "test_tiered:" not in out


def test_each_test_file_has_the_one_tier_of_its_file():
    """FILE_TIERS is where tiers are given: no test file marks a test (or itself) with another
    tier, so that `-m TIER` can collect only that tier's files."""
    wrong = {}
    for name, tier in conftest.FILE_TIERS.items():
        tree = ast.parse((ROOT / "tests" / name).read_text())
        marks = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                 and ast.unparse(node.value) == "pytest.mark" and node.attr in conftest.TIERS}
        if marks - {tier}:
            wrong[name] = sorted(marks - {tier})
    assert wrong == {}, f"tests of another tier than their file's (move them): {wrong}"


def _planted(tmp_path, source: str, *args: str) -> subprocess.CompletedProcess:
    """pytest with the tests' conftest on ``source`` as tmp_path/test_new.py."""
    (tmp_path / "test_new.py").write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
         "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), *args, str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"})


def test_a_unit_test_that_imports_tensorflow_fails(tmp_path):
    """The unit tier runs without TensorFlow: a unit test importing it fails (a stand-in
    module here, named as TensorFlow's, so that this test stays fast)."""
    done = _planted(tmp_path, """
        import sys
        import types

        import pytest

        @pytest.mark.unit
        def test_imports_tensorflow():
            sys.modules["tensorflow"] = types.ModuleType("tensorflow")

        @pytest.mark.unit
        def test_plain():
            pass
    """, "-m", "unit")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "test_new.py::test_imports_tensorflow imported TensorFlow: the unit tier runs " \
           "without it" in out
    assert "2 passed, 1 error" in out   # the error: its teardown


def test_the_benchmarks_shell_needs_no_test_tools():
    """The README lists `python3 benchmarks/...` after its install, which brings no pytest:
    the benchmarks' IPython shell (``benchmarks/common.py``) loads nbdist and runs magics with
    pytest unimportable, and no benchmark uses IPython's testing shell (it imports pytest:
    every benchmark that ran cells failed so after the README's install)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["pytest"] = None          # as after `pip install -e '.[cpu,lab]'`
        sys.path.insert(0, "benchmarks")
        from common import nbdist_shell
        ip = nbdist_shell(strategy=None)
        result = ip.run_cell("%distribute status\\nanswer = 6 * 7")
        assert result.success and ip.user_ns["answer"] == 42, result
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
    users = [p.name for p in (ROOT / "benchmarks").glob("*.py")
             if "IPython.testing" in p.read_text()]
    assert users == [], f"benchmarks that need IPython's testing shell (pytest): {users}"
