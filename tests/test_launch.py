"""``python -m nbdist.launch``: N processes with their own TF_CONFIG, output prefixed, all
stopped when one fails. The job here is a small script (no TensorFlow): what is tested is the
launcher, the exported scripts' training is tested in test_export.py.

Then the guide's Slurm and Kubernetes recipes, run as written on this machine with stand-ins
for what the schedulers give each process: ``srun`` starting the tasks with SLURM_PROCID (and
``scontrol`` expanding SLURM_JOB_NODELIST), the Indexed Job's pods with JOB_COMPLETION_INDEX
whose headless-Service names resolve to this machine. Each trains an exported script with
Adam as one 2-worker job, which reaches the notebook's losses.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import yaml
from helpers import export_adam_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = textwrap.dedent("""\
    import json, os, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    print("config", json.dumps(config), flush=True)
    with open(os.path.join(sys.argv[1], f"{task['type']}-{task['index']}.pid"), "w") as f:
        f.write(str(os.getpid()))
    if task["index"] == int(sys.argv[2]):
        sys.exit(3)
    time.sleep(float(sys.argv[3]))
    """)


def _launch(tmp_path, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.run([sys.executable, "-m", "nbdist.launch", *args[:-3], str(script),
                           *args[-3:]], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


def test_each_worker_gets_its_task_and_free_ports(tmp_path):
    done = _launch(tmp_path, "--workers", "3", str(tmp_path), "-1", "0")
    assert done.returncode == 0, done.stderr
    configs = {}
    for line in done.stdout.splitlines():
        prefix, _, rest = line.partition("] config ")
        configs[prefix + "]"] = json.loads(rest)
    assert sorted(configs) == ["[worker 0]", "[worker 1]", "[worker 2]"]
    cluster = configs["[worker 0]"]["cluster"]
    assert len(set(cluster["worker"])) == 3 and all(c["cluster"] == cluster
                                                    for c in configs.values())
    assert [configs[f"[worker {i}]"]["task"] for i in range(3)] == [
        {"type": "worker", "index": i} for i in range(3)]


def test_one_failure_stops_the_others_and_fails_the_job(tmp_path):
    started = time.monotonic()
    done = _launch(tmp_path, "--workers", "2", str(tmp_path), "1", "600")
    assert done.returncode == 3
    assert "worker 1" in done.stderr and "exited with 3" in done.stderr
    assert time.monotonic() - started < 60   # worker 0 (asleep for 600 s) was stopped
    survivor = int((tmp_path / "worker-0.pid").read_text())
    assert not psutil.pid_exists(survivor) or \
        psutil.Process(survivor).status() == psutil.STATUS_ZOMBIE


def test_parameter_server_jobs_have_a_chief(tmp_path):
    done = _launch(tmp_path, "--workers", "1", "--ps", "1", str(tmp_path), "-1", "1")
    assert done.returncode == 0, done.stderr
    tasks = sorted(p.name for p in tmp_path.glob("*.pid"))
    assert tasks == ["chief-0.pid", "ps-0.pid", "worker-0.pid"]


def test_ctrl_c_stops_every_process(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "nbdist.launch", "--workers", "2", str(script), str(tmp_path),
         "-1", "600"], env=dict(os.environ, PYTHONPATH=ROOT), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    pid_files = [tmp_path / f"worker-{i}.pid" for i in range(2)]
    deadline = time.monotonic() + 60
    while not all(p.exists() and p.read_text() for p in pid_files):
        assert time.monotonic() < deadline and launcher.poll() is None
        time.sleep(0.1)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130 and "interrupted" in err
    for p in pid_files:
        pid = int(p.read_text())
        assert not psutil.pid_exists(pid) or \
            psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# -- the guide's cluster recipes, with stand-ins for the schedulers -------------------------
SLURM_RECIPE = r"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
srun bash -c '
  hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
  workers=""
  for i in "${!hosts[@]}"; do workers+="\"${hosts[i]}:$((12345 + i))\","; done
  export TF_CONFIG="{\"cluster\": {\"worker\": [${workers%,}]},
                     \"task\": {\"type\": \"worker\", \"index\": $SLURM_PROCID}}"
  exec python train.py --strategy multiworker --checkpoint "$HOME/ckpt/run1" \
       --metrics "$HOME/runs/run1.jsonl"'
"""

KUBERNETES_RECIPE = r"""apiVersion: v1
kind: Service
metadata: {name: train}
spec: {clusterIP: None, selector: {job-name: train}, ports: [{port: 12345}]}
---
apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  completions: 2
  parallelism: 2
  completionMode: Indexed
  template:
    spec:
      subdomain: train
      restartPolicy: Never
      containers:
        - name: worker
          image: YOUR_IMAGE
          ports: [{containerPort: 12345}, {containerPort: 12346}]
          command: ["sh", "-c"]
          args:
            - >-
              export TF_CONFIG="{\"cluster\": {\"worker\": [\"train-0.train:12345\",
              \"train-1.train:12346\"]}, \"task\": {\"type\": \"worker\",
              \"index\": $JOB_COMPLETION_INDEX}}" &&
              exec python train.py --strategy multiworker --checkpoint /shared/ckpt/run1
"""

# srun: SLURM_NTASKS tasks of its command on this machine, each with its task's variables
FAKE_SRUN = """#!/bin/bash
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 SLURM_STEP_NODELIST="$SLURM_JOB_NODELIST" \\
    "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""

# scontrol show hostnames LIST: Slurm's compressed host lists (`node[01-02,05],login1`)
FAKE_SCONTROL = """#!{python}
import re, sys
assert sys.argv[1:3] == ["show", "hostnames"], sys.argv
for part in re.findall(r"[^,\\[]+(?:\\[[^\\]]*\\])?", sys.argv[3]):
    prefix, _, ranges = part.partition("[")
    if not ranges:
        print(prefix)
    for item in ranges.rstrip("]").split(",") if ranges else ():
        first, _, last = item.partition("-")
        for n in range(int(first), int(last or first) + 1):
            print(f"{{prefix}}{{n:0{{len(first)}}d}}")
"""


def test_the_guide_shows_the_recipes_run_here():
    """The Slurm and Kubernetes recipes below are the guide's, character for character."""
    guides = [os.path.join(ROOT, "docs", "guide", "export-and-launch.md"),
              os.path.join(ROOT, "README.md")]
    text = "".join(open(p, encoding="utf-8").read() for p in guides if os.path.exists(p))
    assert SLURM_RECIPE in text and KUBERNETES_RECIPE in text


@pytest.fixture(scope="module")
def adam_job(ip, tmp_path_factory):
    """A directory holding train.py, exported from the kernel, and the notebook's losses."""
    workdir = tmp_path_factory.mktemp("job")
    return workdir, export_adam_step(ip, workdir / "train.py")


def _stand_in_bin(tmp_path) -> str:
    """A directory of commands the recipes call: srun, scontrol, and `python` (this one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(python=sys.executable))
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    return str(bin_dir)


def _two_free_ports() -> int:
    """A port P such that P and P + 1 are free: the recipes' 12345 on this machine, where
    another test may hold that one."""
    for _ in range(50):
        base = _free_port()
        with socket.socket() as s:
            try:
                s.bind(("", base + 1))
                return base
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _recipe_env(tmp_path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([_stand_in_bin(tmp_path), os.environ["PATH"]])
    return dict(os.environ, PATH=path, HOME=str(tmp_path), PYTHONPATH=ROOT,
                TF_CPP_MIN_LOG_LEVEL="2", **extra)


def test_the_slurm_recipe_trains_one_job(adam_job, tmp_path):
    import nbdist

    workdir, notebook = adam_job
    sbatch = tmp_path / "train.sbatch"
    sbatch.write_text(SLURM_RECIPE.replace("12345", str(_two_free_ports())))
    # what Slurm sets for the batch script of a 2-node job: two names for this machine
    env = _recipe_env(tmp_path, SLURM_JOB_ID="4242", SLURM_NTASKS="2", SLURM_NNODES="2",
                      SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="127.0.0.[1-2]",
                      SLURM_NODELIST="127.0.0.[1-2]")
    done = subprocess.run(["bash", str(sbatch)], cwd=workdir, env=env, text=True,
                          capture_output=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = [float(v) for v in re.findall(r"epoch \d/2: loss (\S+)", done.stdout)]
    np.testing.assert_allclose(printed, notebook[[3, 7]], rtol=1e-4)   # worker 0 prints
    job = nbdist.Run.load(str(tmp_path / "runs" / "run1.jsonl"))
    assert (job.workers, job.replicas, job.status) == (2, 1, "done")
    assert sorted(job.metrics.worker.unique()) == [0, 1]
    np.testing.assert_allclose(job.metrics.groupby("step")["loss"].mean(), notebook, rtol=1e-4)
    assert (tmp_path / "ckpt" / "run1" / "checkpoint").exists()


def test_the_kubernetes_recipe_trains_one_job(adam_job, tmp_path):
    workdir, notebook = adam_job
    job = next(d for d in yaml.safe_load_all(KUBERNETES_RECIPE) if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    command = [*pod["containers"][0]["command"], *pod["containers"][0]["args"]]
    name, pods = job["metadata"]["name"], job["spec"]["completions"]
    base = _two_free_ports()
    # the headless Service's names resolve to this machine; /shared is a directory here
    stand_in = [part.replace("/shared/", f"{tmp_path}/shared/").replace("12345", str(base))
                .replace("12346", str(base + 1)) for part in command]
    for index in range(pods):
        stand_in = [part.replace(f"{name}-{index}.{pod['subdomain']}:", "127.0.0.1:")
                    for part in stand_in]
    env = _recipe_env(tmp_path)
    processes = [subprocess.Popen(
        stand_in, cwd=workdir, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(env, JOB_COMPLETION_INDEX=str(index), HOSTNAME=f"{name}-{index}"))
        for index in range(pods)]
    try:
        outputs = [p.communicate(timeout=240)[0] for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert [p.returncode for p in processes] == [0, 0], outputs
    printed = [float(v) for v in re.findall(r"epoch \d/2: loss (\S+)", outputs[0])]
    np.testing.assert_allclose(printed, notebook[[3, 7]], rtol=1e-4)
    assert "epoch" not in outputs[1]   # one job: its chief reports
    assert (tmp_path / "shared" / "ckpt" / "run1" / "checkpoint").exists()
