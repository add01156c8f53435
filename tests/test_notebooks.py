"""The tutorials in notebooks/: committed clean, executed top to bottom in fresh kernels, and
checked for what they claim (the ring all-reduce sums, N replicas equal one device, ...).

Each notebook runs once per test session in its own kernel (nbclient, kernel ``python3``;
00, 04 and 05 in the Binder check's fresh virtualenv when it runs first, see
executed_notebooks.py);
cells tagged ``raises-exception`` may fail, any other error fails the test. The executed
notebooks are written to ``test-artifacts/notebooks/`` for inspection.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from executed_notebooks import EXECUTED

from nbdist.cluster.paramserver.steps import TAKE_EVERY_ROWS, WINDOW_PER_WORKER
from nbdist.words import count

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
FIGURE = "application/vnd.nbdist.figure.v1+json"   # nbdist's figures: dashboards, Run.plot()

def run_notebook(name: str) -> nbformat.NotebookNode:
    """Execute notebooks/<name>.ipynb once (fresh kernel); return the executed notebook (one
    the Binder check executed in its virtualenv, if it did)."""
    if name not in EXECUTED:
        from nbclient import NotebookClient

        # The kernel inherits the environment: find this checkout's nbdist, less C++ noise.
        paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        client = NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=True,
                                resources={"metadata": {"path": str(ARTIFACTS)}})
        try:
            client.execute()
        finally:
            nbformat.write(nb, ARTIFACTS / f"{name}.ipynb")
        EXECUTED[name] = nb
    return EXECUTED[name]


def cell(nb: nbformat.NotebookNode, snippet: str, exact: bool = False) -> nbformat.NotebookNode:
    """The first code cell whose source contains ``snippet`` (or is it, with ``exact``)."""
    for c in nb.cells:
        found = c.source.strip() == snippet if exact else snippet in c.source
        if c.cell_type == "code" and found:
            return c
    raise AssertionError(f"no code cell contains {snippet!r}")


def text(c: nbformat.NotebookNode) -> str:
    """A cell's stdout and text/plain outputs."""
    parts = []
    for out in c.get("outputs", []):
        if out.output_type == "stream" and out.name == "stdout":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def figures(c: nbformat.NotebookNode) -> list[dict]:
    """A cell's figures: plotly's (the tutorials' own) and nbdist's (its Run.plot())."""
    return [out.data[mime] for out in c.get("outputs", []) for mime in (PLOTLY, FIGURE)
            if mime in out.get("data", {})]


def widget_figures(nb: nbformat.NotebookNode) -> list[list[dict]]:
    """The traces of every dashboard's final figure (the static output its widgets leave)."""
    return [out.data[FIGURE]["data"] for c in nb.cells for out in c.get("outputs", [])
            if FIGURE in out.get("data", {}) and "image/svg+xml" in out.data
            and "the dashboard's final figure" in out.data.get("text/plain", "")]


def replica_series(nb: nbformat.NotebookNode) -> list[set[str]]:
    """Per dashboard figure: the names of its per-replica loss traces."""
    return [{t["name"] for t in fig if t.get("name", "").startswith("replica")
             and t.get("yaxis", "y") == "y"} for fig in widget_figures(nb)]


def dashboard_texts(nb: nbformat.NotebookNode) -> list[str]:
    """The text values of the saved widgets (dashboard headers and notes)."""
    state = nb.metadata.get("widgets", {}).get(
        "application/vnd.jupyter.widget-state+json", {}).get("state", {})
    return [m["state"]["value"] for m in state.values()
            if isinstance(m.get("state", {}).get("value"), str)]


def error(c: nbformat.NotebookNode) -> tuple[str, str]:
    errs = [(o.ename, o.evalue) for o in c.get("outputs", []) if o.output_type == "error"]
    assert errs, "the cell was expected to fail"
    return errs[0]


def number(pattern: str, s: str) -> float:
    found = re.search(pattern, s)
    assert found, f"{pattern!r} not in {s!r}"
    return float(found.group(1))


# -- static checks (no kernel) ----------------------------------------------------------------

def test_the_course_is_there():
    assert NAMES[:4] == ["00-quickstart", "01-dataflow-graphs", "02-mirrored-custom-loop",
                         "03-ring-allreduce"]
    assert "04-multi-worker" in NAMES and "06-choosing-a-strategy" in NAMES


@pytest.mark.parametrize("name", NAMES)
def test_committed_clean(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert "widgets" not in nb.metadata
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, f"outputs in {name}"
            python = "\n".join(line for line in c.source.splitlines()
                               if not line.lstrip().startswith("%"))
            ast.parse(python)    # magics aside, every cell is valid Python
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith(f"# {name[:2]}")


def test_the_seeds_ideas_are_taught():
    words = " ".join(c.source for name in NAMES
                     for c in nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4).cells)
    words = " ".join(words.replace("*", "").replace("$", "").split())
    for idea in ("nodes are operations", "edges are tensors", "tf.function", "constant folding",
                 "common subexpression", "XLA", "GradientTape", "in reverse",
                 "Parameter server", "scatter-reduce", "all-gather", "2(N-1)/N",
                 "global batch", "num_replicas_in_sync", "synchronous", "straggler",
                 "TensorBoard", "CentralStorageStrategy", "TPUStrategy",
                 "MultiWorkerMirroredStrategy", "placement", "layers"):
        assert idea.lower() in words.lower(), f"no notebook mentions {idea!r}"


# -- executed -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_runs_top_to_bottom(name):
    """(How long each takes, against a kernel that only sets nbdist up: benchmarks/notebooks.py.)"""
    nb = run_notebook(name)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code")
    # a warning nbdist prints (the dashboard stopped drawing...) is a failure, as in-process
    warned = [f"{c.source.splitlines()[0]!r}: {o.text.strip()[:300]}" for c in nb.cells
              for o in c.get("outputs", []) if o.output_type == "stream"
              and o.name == "stderr" and "Warning: nbdist" in o.text]
    assert not warned, "\n".join(warned)
    # nor a C++ log line of TensorFlow or gRPC (a stopping cluster's go to the worker logs)
    native = [f"{c.source.splitlines()[0]!r}: {line[:200]}" for c in nb.cells
              for o in c.get("outputs", []) if o.output_type == "stream"
              for line in o.text.splitlines() if re.match(r"[EWF]\d{4} \d\d:\d\d:\d\d", line)]
    assert not native, "\n".join(native)


def test_00_quickstart():
    nb = run_notebook("00-quickstart")
    assert "16 steps per epoch" in text(cell(nb, "GLOBAL_BATCH = 64 * REPLICAS"))
    # The step-mode dashboard's saved widget state has one loss series per replica.
    assert {f"replica {r}" for r in range(4)} in replica_series(nb)
    table = text(cell(nb, "per_replica = step_run.metrics"))
    assert all(re.search(rf"^{r}\s", table, re.M) for r in range(4))
    assert figures(cell(nb, "step_run.plot()"))
    # One picture per finished figure: SVG and nbdist's JSON, never plotly's MIME type (its
    # JupyterLab renderer would save a PNG copy); each <= 100 kB, the notebook <= 360 kB (every
    # figure carries each panel's linear/log and expand buttons, and the times of its steps).
    drawn = [o.data for c in nb.cells for o in c.get("outputs", []) if FIGURE in o.get("data", {})]
    assert len(drawn) == 3, [list(d) for d in drawn]      # two dashboards and step_run.plot()
    for data in drawn:
        assert set(data) == {FIGURE, "image/svg+xml", "text/plain"}
        assert len(json.dumps(data)) <= 100_000, {m: len(json.dumps(v)) for m, v in data.items()}
    assert len(nbformat.writes(nb)) <= 360_000
    assert number(r"training accuracy after 3 \+ 2 epochs: ([\d.]+)",
                  text(cell(nb, "training accuracy"))) > 0.6


def test_01_dataflow_graphs():
    nb = run_notebook("01-dataflow-graphs")
    listing = text(cell(nb, "concrete.graph.get_operations()"))
    assert re.search(r"MatMul\s+MatMul\s+in: x:0, w:0\s+out: MatMul:0", listing)
    assert "Python ran 2 times" in text(cell(nb, "python_runs = []"))
    assert "the graph ran 4 times" in text(cell(nb, "python_runs = []"))
    ran = text(cell(nb, "output_partition_graphs=True"))
    after = ran.split("ops ran in", 1)[1]
    assert "2 partitions" in ran and "_Send" in after and "_Recv" in after
    assert " three" not in after and "square_b" not in after     # folded, merged
    assert "ReluGrad" in text(cell(nb, "backward = nbdist.graphview"))
    assert "[0.70710677 0.70710677]" in text(cell(nb, "clip_gradient"))
    step = [f for f in figures(cell(nb, "--graph")) if "compiled step" in f["layout"]["title"]
            ["text"]]
    assert step and "2 collective ops" in step[0]["layout"]["title"]["text"]
    lanes = step[0]["layout"]["yaxis"]["ticktext"]
    assert {"<b>CPU:0</b>", "<b>CPU:1</b>"} <= set(lanes)


def test_02_mirrored_custom_loop():
    nb = run_notebook("02-mirrored-custom-loop")
    split = text(cell(nb, "experimental_distribute_dataset(ds)"))
    assert len(re.findall(r"replica \d: x \(8, 8\) on device:CPU:\d", split)) == 4
    ratios = text(cell(nb, "for scaling in"))
    assert "global batch size: all-reduced gradient = 1.000 x" in ratios
    assert "local batch size: all-reduced gradient = 4.000 x" in ratios
    assert "4 replicas, 48 steps" in text(cell(nb, "losses = run.metrics.pivot"))
    assert {f"replica {r}" for r in range(4)} in replica_series(nb)
    assert "replica_3" in text(cell(nb, "run.to_tensorboard"))
    gap = number(r"4 replicas vs 1 device: largest difference ([\d.e+-]+)",
                 text(cell(nb, "one_device = train_on_one_device(LR)")))
    assert gap < 1e-5
    wrong = text(cell(nb, "vs_4x_lr = "))
    assert number(r"at 4x the learning rate: ([\d.e+-]+)", wrong) < 1e-5
    assert number(r"at the same learning rate: ([\d.e+-]+)", wrong) > 1e-3


def test_03_ring_allreduce():
    nb = run_notebook("03-ring-allreduce")
    assert "every worker holds numpy's sum after 6 rounds" in text(cell(nb, "def ring_allreduce"))
    rounds = figures(cell(nb, "draw_rounds(history, N)"))[0]
    assert sum(t["type"] == "heatmap" for t in rounds["data"]) == 7     # start + 2 x 3 rounds
    assert "sent per worker: [96.0, 96.0, 96.0, 96.0]" in text(cell(nb, "M = gradients[0]"))
    assert "9 runs" in text(cell(nb, "SWEEP = "))
    timing = text(cell(nb, "import pandas as pd"))
    assert re.search(r"replicas\s+2\s+3\s+4", timing)
    assert number(r"bytes / ([\d.]+) GB/s", timing) > 0
    assert len(figures(cell(nb, "model fit"))[0]["data"]) == 7


def test_04_multi_worker():
    nb = run_notebook("04-multi-worker")
    status = text(cell(nb, "%distribute status", exact=True))
    for i in (0, 1):
        assert f'"task": {{"type": "worker", "index": {i}}}' in status
    assert "[worker 1] I am {'type': 'worker', 'index': 1}" in text(cell(nb, "TF_CONFIG"))
    figs = widget_figures(nb)
    assert any({t.get("name") for t in f} >= {"w0/r0", "w1/r0"} for f in figs)   # per worker
    assert "2 workers x 1 replica, 32 steps" in text(cell(nb, "per_worker = run.metrics"))
    flagged = set(re.findall(r"straggler: (worker \d)", " ".join(dashboard_texts(nb))))
    assert flagged == {"worker 1"}                   # the slow one, and only it
    assert number(r"worker 1 computes ([\d.]+)x longer", text(cell(nb, "slow = "))) > 2
    name, message = error(cell(nb, "--epochs 3 --checkpoint"))
    assert name == "WorkerDied" and "%distribute restart" in message
    assert "worker 1" in message and "died after step 40" in message   # %distribute inject
    again = [c for c in nb.cells if c.cell_type == "code" and "--checkpoint" in c.source][1]
    resumed = text(again)                     # the same cell, after `%distribute restart`
    assert re.search(r"\[worker 0\] nbdist: resumed from epoch 2 of 3 in \S+/step", resumed)
    summary = text(cell(nb, "resumed = nbdist.runs[-1]"))
    assert "steps 32..47, epochs [2], status done" in summary
    assert "resumed from epoch 2 of 3" in summary
    assert "checkpoint left behind: []" in summary


def test_05_parameter_server():
    nb = run_notebook("05-parameter-server")
    placed = text(cell(nb, "v.value.device"))
    assert placed.count("on /job:ps/replica:0/task:0/device:CPU:0") == 4
    ran = text(cell(nb, "per_worker = steps.groupby"))
    counts = [int(n) for n in re.findall(r"worker \d ran (\d+)", ran)]
    assert len(counts) == 2 and min(counts) > 0 and sum(counts) == 160, ran
    assert number(r"median ([\d.]+) ms, whole", ran) > 0          # the parameter update
    assert {"w0/r0", "w1/r0"} in [{t["name"] for t in fig if t.get("name", "").startswith("w")
                                   and t.get("yaxis", "y") == "y"} for fig in widget_figures(nb)]
    assert len(figures(cell(nb, "coloured by the worker"))[0]["data"]) == 2
    assert number(r"staleness: mean ([\d.]+) updates", text(cell(nb, "staleness ="))) >= 0
    fitted = text(cell(nb, "fit_run = nbdist.runs[-1]"))
    fit_counts = [int(n) for n in re.findall(r"worker \d ran (\d+)", fitted)]
    assert "fit: 80 steps" in fitted and len(fit_counts) == 2 and min(fit_counts) > 0, fitted
    epochs = [float(v) for v in re.search(r"History\): \[(.*)\]", fitted).group(1).split(",")]
    assert len(epochs) == 5 and epochs[-1] < 0.5 * epochs[0], fitted
    assert number(r"\(([\d.]+)x as many on the fast worker", text(cell(nb, "slow = "))) > 1.2
    survived = text(cell(nb, "survived = "))
    recorded = int(re.search(r"the run finished: done, (\d+) of 300 steps recorded",
                             survived).group(1))
    # the rows worker 1 had not handed over die with it (at most a read's worth), said in a note
    assert 300 - TAKE_EVERY_ROWS - 2 * WINDOW_PER_WORKER <= recorded <= 300, survived
    assert (f"{count(300 - recorded, 'step')} finished on a worker just before it died" in survived
            ) == (recorded < 300), survived
    assert "the workers that ran the steps after it: [0]" in survived
    assert "nbdist: kill worker 1 after step 30." in text(cell(nb, "%distribute inject kill 1"))
    status = text([c for c in nb.cells if c.source.strip() == "%distribute status"][-1])
    assert re.search(r"injected +kill worker 1 after step 30, sent [\d:]+: applied after step "
                     r"30\b", status), status


def test_06_choosing_a_strategy():
    nb = run_notebook("06-choosing-a-strategy")
    picker = cell(nb, "%distribute", exact=True)
    assert "application/vnd.jupyter.widget-view+json" in str(picker.outputs)
    same = text(cell(nb, 'final_weights["central_storage"]'))
    assert "MirroredVariable on device:CPU:0, device:CPU:1" in same
    assert "AggregatingVariable on device:CPU:0" in same
    assert len(re.findall(r"vs one_device: \d\.\de[+-]\d\d", same)) == 3
    graph = [f for f in figures(cell(nb, "--epochs 2 --graph"))
             if "compiled step" in f["layout"]["title"]["text"]]   # not the run's own figure
    assert graph and "0 collective ops" in graph[0]["layout"]["title"]["text"]
    assert "keras_reported_loss" in text(cell(nb, "fit_run = nbdist.runs[-1]"))
    assert error(cell(nb, "%distribute tpu"))[0] == "DeviceError"
    name, message = error(cell(nb, "grpc://127.0.0.1:8470"))
    assert name == "DeviceError" and "within 5 s" in message
    assert "cannot split the CPU into 8" in error(cell(nb, "--devices 8"))[1]
    assert "Did you mean `mirrored`" in error(cell(nb, "%distribute mirored"))[1]
