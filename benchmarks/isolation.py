"""Local clusters isolated from other hosts (the engines in a private network namespace)
against the same clusters unisolated (``NBDIST_ISOLATION=0``), side by side.

For each local family, a fresh IPython process per side and round runs ``%load_ext nbdist``,
the ``%distribute`` line, a setup cell and a one-step step cell (cold start: launch to the end
of that first step), then a ``--steps`` step cell (steady-state steps/s without its first 20
steps, from the rows' wall times). Rounds alternate which side goes first.

* multiworker: ``multiworker --workers 2``, the job of benchmarks/multiworker.py;
* parameter_server: ``parameter_server --workers 2 --ps 1``, the job of
  benchmarks/paramserver.py.

    python benchmarks/isolation.py [--rounds 3] [--steps 300] [--family multiworker]

It prints each round, then per family the medians of each side and the ratios isolated /
unisolated (cold start: lower is better; steps/s: higher is better). Target: within 5%.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from multiworker import SETUP as MW_SETUP  # noqa: E402  (the same jobs as those benchmarks)
from overhead import STEP_BODY  # noqa: E402
from ps_scenario import SETUP as PS_SETUP  # noqa: E402
from ps_scenario import STEP as PS_STEP  # noqa: E402

WARMUP = 20
FAMILIES = {
    "multiworker": ("multiworker --workers 2", "%%distribute\n" + MW_SETUP,
                    "%%distribute --step --data {data} --steps {steps}\n" + STEP_BODY),
    "parameter_server": ("parameter_server --workers 2 --ps 1", PS_SETUP,
                         PS_STEP.replace("{flags}", "--steps {steps}")),
}


def session(family: str, t0: float, steps: int, out: str) -> None:
    """One side of one round, in this (fresh) process."""
    from common import ipython_shell

    line, setup, step = FAMILIES[family]
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        import nbdist

        ip = ipython_shell()
        ip.run_line_magic("load_ext", "nbdist")
        ip.run_line_magic("distribute", line)
        ip.run_cell(setup, store_history=False).raise_error()
        ip.run_cell(step.format(data="ds", steps=1), store_history=False).raise_error()
        cold = time.time() - t0
        ip.run_cell(step.format(data="long_ds", steps=steps), store_history=False).raise_error()
        frame = nbdist.runs[-1].metrics
        if "worker" in frame and family == "multiworker":
            frame = frame[frame.worker == 0]
        wall = sorted(frame["wall_time"].tolist())
        isolated = "no port is open to other hosts" in _status(ip)
        ip.run_line_magic("distribute", "stop")
    with open(out, "w") as f:
        json.dump({"cold_s": cold, "steps_per_s": (len(wall) - WARMUP - 1)
                   / (wall[-1] - wall[WARMUP]), "isolated": isolated}, f)


def _status(ip) -> str:
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        ip.run_line_magic("distribute", "status")
    return sink.getvalue()


def run_side(family: str, isolation: str, steps: int) -> dict:
    out = tempfile.mktemp(suffix=".json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", NBDIST_ISOLATION=isolation,
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    t0 = time.time()
    subprocess.run([sys.executable, __file__, "--session", family, str(t0), str(steps), out],
                   env=env, check=True, timeout=900)
    with open(out) as f:
        result = json.load(f)
    os.remove(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--family", choices=sorted(FAMILIES), action="append")
    parser.add_argument("--session", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.session:
        family, t0, steps, out = args.session
        session(family, float(t0), int(steps), out)
        return
    for family in args.family or list(FAMILIES):
        sides: dict[str, list[dict]] = {"1": [], "0": []}
        for r in range(args.rounds):
            for isolation in (("1", "0") if r % 2 == 0 else ("0", "1")):
                result = run_side(family, isolation, args.steps)
                if result["isolated"] != (isolation == "1"):
                    raise SystemExit(f"{family}: NBDIST_ISOLATION={isolation} but the status "
                                     f"says isolated={result['isolated']}")
                sides[isolation].append(result)
                print(f"{family} round {r} {'isolated  ' if isolation == '1' else 'unisolated'}"
                      f" cold start {result['cold_s']:.2f} s, "
                      f"{result['steps_per_s']:.1f} steps/s", flush=True)
        med = {side: {key: statistics.median(x[key] for x in runs)
                      for key in ("cold_s", "steps_per_s")} for side, runs in sides.items()}
        print(f"RESULT {family}: cold start isolated {med['1']['cold_s']:.2f} s vs "
              f"unisolated {med['0']['cold_s']:.2f} s (ratio "
              f"{med['1']['cold_s'] / med['0']['cold_s']:.3f}); steps/s isolated "
              f"{med['1']['steps_per_s']:.1f} vs {med['0']['steps_per_s']:.1f} (ratio "
              f"{med['1']['steps_per_s'] / med['0']['steps_per_s']:.3f})", flush=True)


if __name__ == "__main__":
    main()
