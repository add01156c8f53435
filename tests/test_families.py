"""A strategy family is one descriptor: a toy family registered here, and nowhere else, is
chosen with `%distribute toy`, shows in status and the picker, trains a step cell and is
exported as a script that trains under it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_cell, tiny_model_and_data, tiny_step

import nbdist
from nbdist.backends.local import LocalBackend
from nbdist.errors import ConfigError, ExportError
from nbdist.families import (
    KERNEL,
    STRATEGY_NAMES,
    Family,
    ScriptPieces,
    family,
    register_family,
    unregister_family,
)
from nbdist.hardware import Hardware
from nbdist.session import current_session
from nbdist.spec import StrategySpec
from nbdist.widgets.picker import Picker, table_html, table_text

ROOT = Path(__file__).resolve().parent.parent
CPU_ONLY = Hardware(cpu_cores=2, ipyparallel=True)


class ToyBackend(LocalBackend):
    """The toy family's backend: the kernel's own, counting what the factory made."""

    made = 0

    @classmethod
    def create(cls, spec, runs, shell, keras=None):
        cls.made += 1
        return super().create(spec, runs, shell, keras)


TOY = Family(
    "toy", "tf.distribute.OneDeviceStrategy",
    "One device, for show", "None (a single replica)", "Proving a family is one descriptor",
    KERNEL, f"{__name__}:ToyBackend",
    "nbdist.strategies:build_one_device", "nbdist.strategies:one_device_code",
    flags=("devices",), max_devices=1, kernel_devices=True,
    flag_errors=(("devices", "toy plays on one device; drop --devices {devices}."),),
    script=ScriptPieces("return tf.distribute.OneDeviceStrategy(local_devices(devices)[0])"),
)


@pytest.fixture
def toy(ip):
    register_family(TOY)
    try:
        yield ip
    finally:
        ip.run_line_magic("distribute", "stop")
        unregister_family("toy")
        ip.run_line_magic("distribute", "mirrored --devices 4")
    assert "toy" not in STRATEGY_NAMES


def test_a_registered_family_runs_through_the_magic_status_picker_and_export(
        toy, tmp_path, capsys):
    ip = toy
    session = current_session(ip)
    assert "toy" in STRATEGY_NAMES and family("toy") is TOY

    # the words users type: the spec's rules come from the descriptor
    with pytest.raises(ConfigError, match="Did you mean `toy`"):
        StrategySpec("toi")
    with pytest.raises(ConfigError, match="toy plays on one device; drop --devices 2"):
        StrategySpec("toy", devices=2)
    with pytest.raises(ConfigError, match="which `toy` does not use"):
        StrategySpec("toy", workers=2)

    # %distribute toy: the factory makes the descriptor's backend; status reads it
    made = ToyBackend.made
    assert run_cell(ip, "%distribute toy").success
    assert isinstance(session.backend, ToyBackend) and ToyBackend.made == made + 1
    capsys.readouterr()
    ip.run_line_magic("distribute", "status")
    out = capsys.readouterr().out
    assert "strategy   toy (tf.distribute.OneDeviceStrategy)" in out, out
    assert "magic      %distribute toy" in out
    assert 'strategy = tf.distribute.OneDeviceStrategy("/device:CPU:0")' in out

    # the picker: its row in the table, its button, its line and code, Apply
    assert "Proving a family is one descriptor" in table_html(CPU_ONLY)
    assert "toy" in table_text(CPU_ONLY)
    view = Picker(session, CPU_ONLY)
    assert view.buttons["toy"].value                    # the kernel's strategy is picked
    assert "%distribute toy<" in view.line.value and "OneDeviceStrategy" in view.code.value
    assert all(getattr(view, f).disabled for f in ("devices", "workers", "ps", "cluster", "tpu"))
    view.apply.click()
    assert "✓ toy with 1 replica on" in view.message.value

    # a step cell trains under it, and is exported as a script that trains under it
    tiny_model_and_data(ip)
    assert run_cell(ip, tiny_step()).success
    run = nbdist.runs[-1]
    assert (run.strategy, run.status, run.steps_done) == ("toy", "done", 4)

    script = tmp_path / "train.py"
    capsys.readouterr()
    assert run_cell(ip, f"%distribute export {script}").success
    assert "--strategy multiworker" in capsys.readouterr().out   # toy runs as one process
    text = script.read_text()
    assert '"toy")' in text and 'if name == "toy":' in text and 'DEFAULT_STRATEGY = "toy"' in text
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, str(script), "--steps", "2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "epoch 1/1: loss" in done.stdout and "(2 steps)" in done.stdout, done.stdout

    # a family that declares it cannot be exported is named in the refusal
    register_family(dataclasses.replace(TOY, script=None, no_script="a toy stays in the kernel"),
                    replace=True)
    err = run_cell(ip, f"%distribute export {tmp_path / 'again.py'}").error_in_exec
    assert isinstance(err, ExportError), err
    assert "The step cell ran under `toy`, which the script cannot make (a toy stays in the " \
           "kernel)" in str(err)
    assert not (tmp_path / "again.py").exists()
