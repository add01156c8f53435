"""`python -m nbdist.tutorials`: JupyterLab opens on the quickstart, or its URL is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

from helpers import ROOT


def test_tutorials_opens_jupyterlab_on_the_quickstart_and_prints_its_url(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(PYTHONPATH=ROOT, JUPYTER_RUNTIME_DIR=str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nbdist.tutorials", "--ServerApp.port=0",
         "--ServerApp.ip=127.0.0.1"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        lines, url = [], None
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"http://127\.0\.0\.1:\d+/lab/tree/notebooks/00-quickstart\.ipynb"
                              r"\?token=\w+", line)
            url = found.group(0) if found else None
        assert url, "".join(lines)
        assert "no browser opens here" in lines[0]
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # loopback
        for _ in range(60):       # the server may print its URL just before it listens
            try:
                with opener.open(url, timeout=30) as page:   # the URL works as printed
                    assert page.status == 200 and "JupyterLab" in page.read().decode()
                    break
            except urllib.error.URLError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"{url} never answered")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
