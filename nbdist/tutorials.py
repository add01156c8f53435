"""Open the tutorials in JupyterLab: ``python -m nbdist.tutorials [NOTEBOOK]``.

Starts ``jupyter lab`` on ``notebooks/00-quickstart.ipynb`` (or NOTEBOOK) of this checkout.
Where no browser can open (no display, a container, SSH), JupyterLab is started with
``--no-browser`` and the URL to open is printed. Extra arguments go to ``jupyter lab``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from .install_tf_keras import INSTALL_HINT

FIRST = "00-quickstart.ipynb"


def notebooks_dir() -> Path:
    """``notebooks/`` of the current directory, else of the checkout nbdist runs from."""
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if (base / "notebooks" / FIRST).is_file():
            return base / "notebooks"
    raise SystemExit("nbdist: no notebooks/ here: run this from the nbdist checkout "
                     "(the tutorials are not part of the installed package).")


def can_open_browser() -> bool:
    """False where a browser cannot open: Linux with no display, or an SSH session."""
    if os.environ.get("SSH_CONNECTION"):
        return False
    return not sys.platform.startswith("linux") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def lab_command(notebook: str, extra: list[str], browser: bool) -> tuple[list[str], Path]:
    """The ``jupyter lab`` command line and the directory it runs in (the checkout)."""
    folder = notebooks_dir()
    path = folder / notebook
    if not path.is_file():
        names = ", ".join(sorted(p.name for p in folder.glob("*.ipynb")))
        raise SystemExit(f"nbdist: no tutorial {notebook!r}; there are {names}.")
    # The URL JupyterLab prints (and opens) is its default_url: point it at the notebook.
    tree = path.relative_to(folder.parent).as_posix()
    cmd = [sys.executable, "-m", "jupyterlab", f"--LabApp.default_url=/lab/tree/{tree}"]
    if not browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")   # containers often run as root
    return cmd + extra, folder.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbdist.tutorials",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", nargs="?", default=FIRST, help=f"default: {FIRST}")
    parser.add_argument("--no-browser", action="store_true",
                        help="only print the URL (default: open a browser where one can)")
    args, extra = parser.parse_known_args(argv)
    if importlib.util.find_spec("jupyterlab") is None:
        raise SystemExit("nbdist: JupyterLab is not installed: pip install 'nbdist[lab]'.")
    if importlib.util.find_spec("tf_keras") is None:
        print(f"nbdist: tutorials 04 and 05 need tf_keras: run `{INSTALL_HINT}` first.")
    browser = can_open_browser() and not args.no_browser
    cmd, cwd = lab_command(args.notebook, extra, browser)
    if not browser:
        print("nbdist: no browser opens here: open the URL that JupyterLab "
              "prints below (http://127.0.0.1:PORT/lab/tree/notebooks/...?token=...).", flush=True)
    os.chdir(cwd)
    os.execv(sys.executable, cmd)
    return 0   # not reached


if __name__ == "__main__":
    sys.exit(main())
