"""``python -m nbdist.launch``: N processes with their own TF_CONFIG, output prefixed, all
stopped when one fails. The job here is a small script (no TensorFlow): what is tested is the
launcher, the exported scripts' training is tested in test_export.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

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
