"""A real JupyterLab, started by the tests on 127.0.0.1, driven by Playwright in Debian's chromium.

Screenshots go to ``test-artifacts/`` (kept by CI as artifacts).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from labhelpers import ARTIFACTS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tested_extension(tmp_path_factory) -> str:
    """A JUPYTER_PATH entry holding the lab extension built in the tree under test (the one
    ``import nbdist`` finds: PYTHONPATH), so JupyterLab loads it rather than the installed
    copy (the first ``labextensions/nbdist`` on the path wins)."""
    import nbdist

    built = Path(nbdist.__file__).parent / "labextension"
    if not (built / "package.json").exists():
        return ""                  # not built in this tree: the installed copy is used
    root = tmp_path_factory.mktemp("jupyter-path")
    (root / "labextensions").mkdir()
    (root / "labextensions" / "nbdist").symlink_to(built, target_is_directory=True)
    return str(root)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is required for the browser tests: "
                    "apt-get install chromium (.ci/run does it)")
    workdir = tmp_path_factory.mktemp("lab")
    port = _free_port()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JUPYTER_PLATFORM_DIRS="1",
               JUPYTER_PATH=os.pathsep.join(filter(None, [
                   _tested_extension(tmp_path_factory), os.environ.get("JUPYTER_PATH")])))
    log = open(workdir / "lab.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
         f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         "--IdentityProvider.token=", "--ServerApp.password=",
         "--LabApp.expose_app_in_browser=True", f"--ServerApp.root_dir={workdir}"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((workdir / "lab.log").read_text()[-3000:]) from None
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("JupyterLab did not start within 90 s")
    yield {"url": url, "dir": workdir, "chromium": chromium}
    # Shut the server down (it stops its kernels), then make sure nothing is left.
    try:
        req = urllib.request.Request(f"{url}/api/shutdown", method="POST")
        urllib.request.urlopen(req, timeout=10)
        proc.wait(timeout=30)
    except Exception:
        proc.kill()
        proc.wait(timeout=10)
    log.close()


@pytest.fixture(scope="session")
def browser(lab_server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=lab_server["chromium"], headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"],
        )
        yield b
        b.close()


@pytest.fixture
def lab_page(lab_server, browser):
    """A fresh page; call ``open(name)`` to open a notebook and wait for its kernel."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()

    def open_notebook(name: str):
        # A workspace of its own, reset: JupyterLab must not restore another test's notebooks.
        workspace = name.replace(".ipynb", "").replace("/", "-")
        page.goto(f"{lab_server['url']}/lab/workspaces/{workspace}/tree/{name}?reset")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function(
            "() => { const w = window.jupyterapp.shell.currentWidget;"
            " return w && w.sessionContext && w.sessionContext.session &&"
            " w.sessionContext.session.kernel &&"
            " w.sessionContext.session.kernel.connectionStatus === 'connected'; }",
            timeout=60_000)
        return page

    page.open_notebook = open_notebook
    yield page
    context.close()
