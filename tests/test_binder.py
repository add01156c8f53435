"""binder/: what Binder (repo2docker) builds from it, checked without Docker.

``jupyter-repo2docker --no-build --no-run .`` prints the Dockerfile it would build, which
shows the Python version, the pip install of binder/requirements.txt, postBuild and the start
script. The full check builds a fresh virtualenv from binder/ alone (as repo2docker does:
JupyterLab, requirements.txt, postBuild) and executes tutorials 00 (the quickstart), 04 and
05 (which need tf_keras) in it; test_notebooks.py checks what they printed there rather than
running them again. It installs TensorFlow (pip's cache makes a second build
on one machine cheaper), downloads included: minutes.
NBDIST_BINDER_VENV=0 skips it (fails under NBDIST_REQUIRE_ALL=1); .ci/run runs it.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import nbformat
from executed_notebooks import EXECUTED
from helpers import skip_unless_all_required
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:   # Python 3.10
    import tomli as tomllib  # pytest's own dependency there

ROOT = Path(__file__).resolve().parent.parent
BINDER = ROOT / "binder"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements() -> dict[str, Requirement]:
    lines = (BINDER / "requirements.txt").read_text().splitlines()
    reqs = [Requirement(line) for line in (ln.split("#")[0].strip() for ln in lines) if line]
    return {r.name: r for r in reqs}


def runtime_python() -> str:
    text = (BINDER / "runtime.txt").read_text().strip()
    assert text.startswith("python-"), f"runtime.txt must say python-X.Y, not {text!r}"
    return text.removeprefix("python-")


def test_requirements_pin_the_cpu_tensorflow_nbdist_supports():
    reqs = requirements()
    assert "tensorflow" not in reqs, "Binder has no GPU: use tensorflow-cpu (a 274 MB wheel)"
    pin = [s.version for s in reqs["tensorflow-cpu"].specifier if s.operator == "=="]
    assert pin, "pin tensorflow-cpu (==) so Binder images are reproducible"
    cpu_extra = next(Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["cpu"]
                     if r.startswith("tensorflow-cpu"))
    assert cpu_extra.specifier.contains(pin[0]), f"{pin[0]} is outside nbdist's {cpu_extra}"
    # tf-keras depends on the full `tensorflow` wheel: postBuild installs it with --no-deps.
    assert "tf-keras" not in reqs


def test_runtime_is_a_python_nbdist_supports():
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(runtime_python())


def test_scripts_are_executable_and_install_this_checkout():
    for name in ("postBuild", "start"):
        path = BINDER / name
        assert path.stat().st_mode & stat.S_IXUSR, f"binder/{name} must be executable"
        assert path.read_text().startswith("#!/bin/bash\n")
    post = (BINDER / "postBuild").read_text()
    assert "set -euo pipefail" in post
    assert "PIP_NO_CACHE_DIR=1" in post and "python -m pip install .\n" in post  # lab ext. too
    assert "jupyter labextension list" in post            # ... and fails the build without it
    assert post.rstrip().endswith("python -m nbdist.install_tf_keras")   # tf-keras for 04 and 05
    assert (BINDER / "start").read_text().rstrip().endswith('exec "$@"')


def test_repo2docker_plans_the_image():
    exe = shutil.which("jupyter-repo2docker")
    if exe is None:
        skip_unless_all_required("jupyter-repo2docker is not installed (pip install -e '.[test]')")
    done = subprocess.run([exe, "--no-build", "--no-run", "."], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    plan = done.stdout + done.stderr
    version = runtime_python()
    assert f"Building conda environment for python={version}" in plan
    assert 'pip install --no-cache-dir -r "binder/requirements.txt"' in plan
    assert "RUN ./binder/postBuild" in plan
    assert 'R2D_ENTRYPOINT="${REPO_DIR}/binder/start"' in plan
    # postBuild builds the lab extension with npm: the base environment must ship Node.js,
    # and JupyterLab 4 (the extension targets it).
    import repo2docker

    lock = (Path(repo2docker.__file__).parent / "buildpacks" / "conda"
            / f"environment.py-{version}-linux-64.lock").read_text()
    assert "/nodejs-" in lock and "/jupyterlab-4." in lock


def test_fresh_virtualenv_from_binder_runs_tutorials_00_04_and_05(tmp_path, request):
    if os.environ.get("NBDIST_BINDER_VENV") == "0":
        skip_unless_all_required("NBDIST_BINDER_VENV=0: no fresh virtualenv with TensorFlow")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(venv),
               TF_CPP_MIN_LOG_LEVEL="2")

    def run(*cmd: str, cwd: Path = ROOT, timeout: float = 1800) -> str:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    # What repo2docker does: its base environment has JupyterLab 4, then requirements.txt,
    # then postBuild from the repository root. The venv (1.9 GB) is deleted afterwards.
    request.addfinalizer(lambda: shutil.rmtree(venv, ignore_errors=True))
    run("python", "-m", "pip", "install", "-q", "jupyterlab>=4,<5", "-r",
        str(BINDER / "requirements.txt"))
    run(str(BINDER / "postBuild"))
    # tensorflow-cpu stayed the only TensorFlow, and tf_keras of its version came beside it.
    found = run("python", "-c", "import tf_keras; from nbdist.installed import "
                "tensorflow_distribution as t, installed_version as v; "
                "print(t(), v('tensorflow'), tf_keras.__version__)", cwd=tmp_path)
    assert "'tensorflow_cpu', '2.21." in found and "not installed 2.21." in found, found
    # the quickstart, where Binder opens; 04 and 05 need tf_keras. test_notebooks.py checks
    # these executions (a failing cell fails here, and test_notebooks.py then runs it again).
    artifacts = ROOT / "test-artifacts" / "notebooks"
    artifacts.mkdir(parents=True, exist_ok=True)
    for name in ("00-quickstart", "04-multi-worker", "05-parameter-server"):
        executed = tmp_path / f"{name}.ipynb"
        run("jupyter", "execute", "--timeout=600", f"--output={executed}",
            str(ROOT / "notebooks" / f"{name}.ipynb"), cwd=tmp_path)
        shutil.copy(executed, artifacts / executed.name)
        EXECUTED[name] = nbformat.read(executed, as_version=4)
