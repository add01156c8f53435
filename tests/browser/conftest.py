"""A real JupyterLab, started by the tests on 127.0.0.1, driven by Playwright in Debian's chromium.

Screenshots go to ``test-artifacts/`` (kept by CI as artifacts).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import skip_unless_all_required
from labhelpers import ARTIFACTS, KERNEL_CONNECTED


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


def _chromium() -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.fail("Debian's chromium is required for the browser tests: "
                    "apt-get install chromium (.ci/run does it)")
    return chromium


def _serve(tmp_path_factory, module: str, expose: str):
    """Start ``python -m module`` (jupyterlab or notebook) on a free loopback port, in a
    directory of its own; yield its URL and directory; shut it down (and its kernels)."""
    workdir = tmp_path_factory.mktemp(module)
    port = _free_port()
    # User settings of its own: no "get notified about Jupyter news?" toast over the page.
    settings = workdir / ".settings"
    notification = (settings / "@jupyterlab" / "apputils-extension"
                    / "notification.jupyterlab-settings")
    notification.parent.mkdir(parents=True)
    (workdir / "notebooks").mkdir()
    notification.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", JUPYTER_PLATFORM_DIRS="1",
               JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTER_PATH=os.pathsep.join(filter(None, [
                   _tested_extension(tmp_path_factory), os.environ.get("JUPYTER_PATH")])))
    log = open(workdir / "server.log", "w")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--no-browser", "--allow-root",
         f"--ServerApp.port={port}", "--ServerApp.ip=127.0.0.1",
         "--IdentityProvider.token=", "--ServerApp.password=",
         f"--{expose}.expose_app_in_browser=True", f"--ServerApp.root_dir={workdir / 'notebooks'}"],
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
                raise RuntimeError((workdir / "server.log").read_text()[-3000:]) from None
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError(f"{module} did not start within 90 s")
    yield {"url": url, "dir": workdir / "notebooks"}
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
def lab_server(tmp_path_factory):
    yield from _serve(tmp_path_factory, "jupyterlab", "LabApp")


@pytest.fixture(scope="session")
def notebook7_server(tmp_path_factory):
    """Notebook 7 (the ``notebook`` package), started only by the tests that use it."""
    try:
        import notebook
    except ImportError:
        notebook = None
    if notebook is None or int(notebook.__version__.split(".")[0]) < 7:
        skip_unless_all_required(
            "Notebook 7 is not installed: pip install -e '.[test]' installs it")
    yield from _serve(tmp_path_factory, "notebook", "JupyterNotebookApp")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through Playwright's sync API, for one test module: while that API is
    open this thread counts as inside a running asyncio loop, and ipyparallel, seeing one, runs
    a ``Cluster``'s work on a loop of its own as in a Jupyter kernel. Held for the session, it
    ran every later test that way, which hid the race test_hostbed_ssh now shows on purpose."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=_chromium(), headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"],
        )
        yield b
        b.close()


def _page(browser, notebook_url):
    """A fresh page whose ``open_notebook(name)`` goes to ``notebook_url(name)`` and waits for
    the notebook's kernel; closed at teardown."""
    ARTIFACTS.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()

    def open_notebook(name: str):
        page.goto(notebook_url(name))
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_function(KERNEL_CONNECTED, timeout=60_000)
        return page

    page.open_notebook = open_notebook
    yield page
    context.close()


@pytest.fixture
def lab_page(lab_server, browser):
    """A fresh JupyterLab page; call ``open_notebook(name)`` to open a notebook."""
    def url(name: str) -> str:
        # A workspace of its own, reset: JupyterLab must not restore another test's notebooks.
        workspace = name.replace(".ipynb", "").replace("/", "-")
        return f"{lab_server['url']}/lab/workspaces/{workspace}/tree/{name}?reset"

    yield from _page(browser, url)


@pytest.fixture
def notebook7_page(notebook7_server, browser):
    """Like ``lab_page``, in Notebook 7 (one notebook per browser page)."""
    yield from _page(browser, lambda name: f"{notebook7_server['url']}/notebooks/{name}")
