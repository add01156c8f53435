"""How long each tutorial in notebooks/ takes to run top to bottom, against a notebook that
only sets nbdist up (``%load_ext nbdist``, ``import tensorflow``, ``%distribute mirrored
--devices 4``), measured side by side.

Each round runs the baseline, then the tutorial, each in a fresh kernel with nbclient (as
tests/test_notebooks.py does); it prints both times and their ratio (what the tutorial adds
over starting a kernel with TensorFlow). On 2 idle cores the tutorials took ~30-75 s each.

    python benchmarks/notebooks.py [--only 00-quickstart,03-ring-allreduce] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BASELINE = ["%load_ext nbdist", "import tensorflow as tf", "%distribute mirrored --devices 4"]


def execute(nb: nbformat.NotebookNode, cwd: Path) -> float:
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    started = time.perf_counter()
    client.execute()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names (default: all)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    names = args.only.split(",") if args.only else sorted(p.stem for p in
                                                         NOTEBOOKS.glob("*.ipynb"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    workdir = ROOT / "test-artifacts" / "bench-notebooks"
    workdir.mkdir(parents=True, exist_ok=True)
    for name in names:
        ratios = []
        for _ in range(args.rounds):
            base = nbformat.v4.new_notebook(
                cells=[nbformat.v4.new_code_cell(src) for src in BASELINE],
                metadata={"kernelspec": {"name": "python3", "language": "python",
                                         "display_name": "Python 3"}})
            base_s = execute(base, workdir)
            tutorial_s = execute(nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4),
                                 workdir)
            ratios.append(tutorial_s / base_s)
            print(f"{name}: {tutorial_s:.1f} s vs baseline {base_s:.1f} s: "
                  f"ratio {ratios[-1]:.1f}", flush=True)
        if len(ratios) > 1:
            print(f"{name}: median ratio {statistics.median(ratios):.1f}")


if __name__ == "__main__":
    main()
