"""`%distribute export` in an IPython shell: the script it writes trains as one job without nbdist,
and the lines it refuses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import WITHOUT_NBDIST, export_adam_step, run_cell, tiny_model_and_data, tiny_step
from test_export import ROOT, SEED, _env, _script

import nbdist
from nbdist.errors import ExportError


# -- any optimizer, alone and as one job ----------------------------------------------------
def test_adam_script_trains_without_nbdist_and_as_one_job(ip, tmp_path):
    script = tmp_path / "train.py"
    notebook = export_adam_step(ip, script)
    assert len(notebook) == 8
    # plain `python train.py` (MirroredStrategy on the session's 4 devices), nbdist not importable
    out = _script(["-c", WITHOUT_NBDIST, str(script)], tmp_path)
    printed = [float(v) for v in re.findall(r"epoch \d/2: loss (\S+) \(\d+ steps\)", out)]
    np.testing.assert_allclose(printed, notebook[[3, 7]], rtol=1e-4)
    assert printed[1] < printed[0]

    # no --strategy: the script's default is single-machine; the launcher says what to add
    refused = subprocess.run([sys.executable, "-m", "nbdist.launch", "--workers", "2",
                              str(script)], cwd=tmp_path, env=_env(), text=True,
                             capture_output=True, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert "would train 2 separate single-machine runs, one per process, not one job of 2 " \
           "workers" in refused.stderr
    assert f"--workers 2 {script} --strategy multiworker" in refused.stderr, refused.stderr

    _script(["-m", "nbdist.launch", "--workers", "2", str(script), "--strategy",
             "multiworker", "--metrics", "m.jsonl"], tmp_path)
    job = nbdist.Run.load(str(tmp_path / "m.jsonl"))
    assert (job.workers, job.replicas, job.status) == (2, 1, "done")
    np.testing.assert_allclose(job.metrics.groupby("step")["loss"].mean(), notebook, rtol=1e-4)

    # exported for workers: the launcher runs it as one job with no --strategy
    assert run_cell(ip, f"%distribute export {script} --strategy multiworker --force").success
    from nbdist.launch import job_problem
    assert job_problem(str(script), [], 2, 0) is None
    assert "--strategy parameter_server" in job_problem(str(script), [], 2, 1)


def test_keras3_fit_exported_for_workers_runs_tf_keras(ip, tmp_path, tf_keras, capsys):
    assert run_cell(ip, "import numpy as np\nimport tensorflow as tf").success
    assert run_cell(ip, """\
        x_fit = np.arange(128, dtype='float32').reshape(32, 4) / 128
        ds_fit = tf.data.Dataset.from_tensor_slices((x_fit, x_fit.sum(1, keepdims=True)))
        ds_fit = ds_fit.batch(8)""").success
    fit_cell = ip.execution_count
    assert run_cell(ip, """\
        %%distribute
        model_fit = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        model_fit.compile(optimizer="adam", loss="mse")
        model_fit.fit(ds_fit, epochs=1, verbose=0)
        opt_fit = tf.keras.optimizers.Adam(0.05)""").success
    assert run_cell(ip, """\
        %%distribute --step --data ds_fit
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model_fit(x) - y))
        opt_fit.apply_gradients(zip(tape.gradient(loss, model_fit.trainable_variables),
                                    model_fit.trainable_variables))""").success
    script = tmp_path / "train.py"
    capsys.readouterr()
    assert run_cell(ip, f"%distribute export {script}").success
    said = capsys.readouterr().out
    assert f"In[{fit_cell}] calls `fit`, which Keras 3 cannot run under " \
           "MultiWorkerMirroredStrategy (keras-team/keras#20585): under multiworker and " \
           "parameter_server the script runs tf_keras as tf.keras" in said, said

    out = _script(["-m", "nbdist.launch", "--workers", "2", str(script), "--strategy",
                   "multiworker"], tmp_path)
    loss = float(re.search(r"\[worker 0\] epoch 1/1: loss (\S+) \(4 steps\)", out).group(1))
    assert np.isfinite(loss)

    # where tf_keras is missing the script says so
    hidden = ("import importlib.util as u, runpy, sys\n"
              "find = u.find_spec\n"
              "u.find_spec = lambda name, *a: None if name == 'tf_keras' else find(name, *a)\n"
              "sys.argv = sys.argv[1:]\n"
              "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hidden, str(script), "--strategy",
                           "multiworker"], cwd=tmp_path, env=_env(), text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"In[{fit_cell}] calls `fit`, which Keras 3 cannot run under --strategy " \
           "multiworker (keras-team/keras#20585), and tf_keras, which nbdist's workers run " \
           "instead, is not installed: install it where the job runs (pip install " \
           "'tf-keras==" in done.stderr, done.stderr


# -- refusals, through a real IPython shell -------------------------------------------------
def test_a_needed_cell_with_a_shell_escape_is_named(ip, tmp_path):
    bad = ip.execution_count
    assert run_cell(ip, "scale_ex = 0.5\n!true").success
    tiny_model_and_data(ip)
    assert run_cell(ip, "SCALE = scale_ex").success
    assert run_cell(ip, tiny_step("SCALE")).success
    target = tmp_path / "train.py"
    err = run_cell(ip, f"%distribute export {target}").error_in_exec
    assert isinstance(err, ExportError) and not target.exists()
    assert f"In[{bad}] defines `scale_ex`" in str(err) and "`!true`" in str(err), err

    assert run_cell(ip, "SCALE = 2.0").success         # now nothing needs the `!` cell
    assert run_cell(ip, tiny_step("SCALE")).success
    assert run_cell(ip, f"%distribute export {target}").success
    text = target.read_text()
    assert f"In[{bad}]: defines nothing the training reads; it has IPython syntax" in text
    assert "def step_fn(batch):" in text and "strategy.run(step_fn" in text
    again = run_cell(ip, f"%distribute export {target}").error_in_exec
    assert isinstance(again, ExportError) and "--force" in str(again)
    assert run_cell(ip, f"%distribute export {target} --force").success


def test_a_name_from_nowhere_is_named(ip, tmp_path):
    tiny_model_and_data(ip)
    ip.user_ns["pushed_ex"] = 1.0      # as %distribute push or a cell run without history do
    assert run_cell(ip, tiny_step("pushed_ex")).success
    err = run_cell(ip, f"%distribute export {tmp_path / 't.py'}").error_in_exec
    assert isinstance(err, ExportError) and "`pushed_ex` read by In[" in str(err), err


# -- a dataset function, parameter_server, --checkpoint: one export run three ways ---------
def test_dataset_function_exported_under_parameter_server_and_resumed(ip, tmp_path):
    assert run_cell(ip, "import numpy as np\nimport tensorflow as tf\n" + SEED).success
    assert run_cell(ip, """\
        %%distribute
        model_ex = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        opt_ex = tf.keras.optimizers.SGD(0.1)""").success
    assert run_cell(ip, """\
        def dataset_fn_ex(input_context):
            batch = input_context.get_per_replica_batch_size(8)
            x = np.arange(64 * 4, dtype='float32').reshape(64, 4) / 256
            ds = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))
            return ds.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id).batch(batch)""").success
    assert run_cell(ip, tiny_step("1.0").replace("--data ds_ex", "--data dataset_fn_ex")).success
    script = tmp_path / "train.py"
    assert run_cell(ip, f"%distribute export {script} --strategy parameter_server").success
    assert "strategy.distribute_datasets_from_function(data)" in script.read_text()

    # the job a user submits: a chief, 2 workers and a parameter server
    _script(["-m", "nbdist.launch", "--workers", "2", "--ps", "1", str(script),
             "--epochs", "2", "--metrics", "ps.jsonl"], tmp_path)
    job = nbdist.Run.load(str(tmp_path / "ps.jsonl"))
    assert (job.workers, job.status, len(job.metrics)) == (2, "done", 16)
    assert sorted(job.metrics.worker.unique()) == [0, 1]   # who ran each step
    assert np.isfinite(job.metrics.loss).all()

    # --checkpoint: 1 epoch, then 3 that resume after it end as 3 in one go do (the script
    # seeds the weights: restored weights, not new ones, give the same losses)
    def epochs(*flags: str) -> tuple[str, list[tuple[str, float]]]:
        out = _script([str(script), "--strategy", "mirrored", "--epochs", *flags], tmp_path)
        found = re.findall(r"epoch (\d/\d): loss (\S+) \((\d+) steps\)", out)
        return out, [(f"{e} {n}", float(loss)) for e, loss, n in found]

    _, whole = epochs("3")
    assert len(epochs("1", "--checkpoint", "ck")[1]) == 1
    out, resumed = epochs("3", "--checkpoint", "ck")
    assert "resumed from epoch 1 of 3" in out, out
    assert [e for e, _ in resumed] == [e for e, _ in whole[1:]] == ["2/3 16", "3/3 24"]
    np.testing.assert_allclose([v for _, v in resumed], [v for _, v in whole[1:]], rtol=1e-4)


def test_an_unwritable_or_missing_directory_is_refused_and_the_script_passes_ruff(ip, tmp_path):
    import shutil

    tiny_model_and_data(ip)
    assert run_cell(ip, "import os, textwrap").success     # textwrap: read by no exported cell
    assert run_cell(ip, "SCALE_EX = float(len(os.sep))").success
    assert run_cell(ip, tiny_step("SCALE_EX")).success
    for target, why in [("/proc/nbdist-x.py", "(/proc takes no new files: "),
                        (f"{tmp_path}/no/such/x.py", f"({tmp_path}/no/such does not exist), "
                         f"so nothing was written. Create the directory first (`mkdir -p "
                         f"{tmp_path}/no/such`), or give a .py file in a directory you can "
                         "write to, e.g. `%distribute export train.py`")]:
        err = run_cell(ip, f"%distribute export {target}").error_in_exec
        assert isinstance(err, ExportError) and why in str(err), err
        assert f"nbdist cannot write {target}" in str(err) and not os.path.exists(target)
    assert not (tmp_path / "no").exists()

    script = tmp_path / "train.py"
    assert run_cell(ip, f"%distribute export {script}").success
    ruff = shutil.which("ruff") or pytest.skip("ruff is not installed (pip install ruff)")
    checked = subprocess.run([ruff, "check", "--output-format", "json", str(script)],
                             cwd=ROOT, capture_output=True, text=True)   # the project's rules
    found = json.loads(checked.stdout)
    lines = script.read_text().splitlines()
    typed = {ln.strip() for cell in ip.history_manager.input_hist_raw for ln in cell.splitlines()}
    # what nbdist writes passes; the cells' own style (long lines, zip without strict=) is theirs
    as_typed = [lines[d["location"]["row"] - 1].split("  # noqa")[0].strip() for d in found]
    assert [(d["code"], line) for d, line in zip(found, as_typed, strict=True)
            if line not in typed or d["code"] not in ("E401", "E402", "E501", "B905", "I001")] == []
    assert "import os, textwrap  # noqa: F401, F811" in script.read_text()
    assert subprocess.run([ruff, "check", "--select", "F,E9", str(script)],
                          cwd=ROOT).returncode == 0


@pytest.mark.parametrize("line, said", [
    ("export /tmp/my dir/x.py", "`dir/x.py` reads as another argument after the file name: a "
     "path with spaces must be quoted, `%distribute export '/tmp/my dir/x.py'` (or give a path "
     "without spaces)."),
    ("export --forse x.py", "--forse is not a flag of `%distribute export`. Did you mean "
     "`--force`? Its flags: --strategy, --cell, --force (`%distribute export --help`)."),
    ("export", "`%distribute export` needs the script's file name, e.g. `%distribute export "
     "train.py`."),
    ("export '/tmp/nbdist no such/x.py'", "(/tmp/nbdist no such does not exist), so nothing "
     "was written. Create the directory first (`mkdir -p '/tmp/nbdist no such'`)"),
])
def test_a_mistaken_export_line_gets_the_fix(ip, line, said):
    err = run_cell(ip, f"%distribute {line}").error_in_exec
    assert isinstance(err, ExportError) and said in str(err), err


def test_checkpoint_every_is_said_to_be_left_out_and_the_script_resumes_by_epoch(ip, tmp_path):
    """The script saves after every epoch only: the cell's --checkpoint-every is named in a
    comment where --checkpoint is, and the script runs and resumes with --checkpoint."""
    tiny_model_and_data(ip)
    ckpt = tmp_path / "ck"
    cell = tiny_step().replace("--data ds_ex", f"--data ds_ex --epochs 2 --checkpoint {ckpt} "
                                               "--checkpoint-every 3")
    assert run_cell(ip, cell).success
    script = tmp_path / "train.py"
    assert run_cell(ip, f"%distribute export {script}").success
    text = script.read_text()
    assert ("    # the cell's --checkpoint-every 3 is not carried over: this script saves after "
            "every\n    # epoch and resumes at the start of the next one\n"
            '    parser.add_argument("--checkpoint"') in text
    assert subprocess.run(["ruff", "check", "--select", "F,E9", str(script)],
                          cwd=ROOT).returncode == 0
    _script([str(script), "--epochs", "1", "--checkpoint", "ck"], tmp_path)
    assert "resumed from epoch 1 of 2" in _script([str(script), "--checkpoint", "ck"], tmp_path)
