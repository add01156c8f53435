"""The README's setup commands: ``python -m nbdist.install_tf_keras`` (tf-keras beside the installed
TensorFlow); ``python -m nbdist.tutorials`` is tests/test_tutorials_command.py's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ROOT

from nbdist import install_tf_keras
from nbdist.errors import ConfigError


@pytest.mark.parametrize("dist, version, req, no_deps", [
    ("tensorflow_cpu", "2.21.0", "tf-keras==2.21.*", True),    # pip would pull `tensorflow`
    ("tensorflow", "2.19.1", "tf-keras==2.19.*", False),       # its dependency is there
    ("tensorflow-intel", "2.18.0", "tf-keras==2.18.*", True),
])
def test_the_tf_keras_of_the_installed_tensorflow(monkeypatch, dist, version, req, no_deps):
    monkeypatch.setattr(install_tf_keras, "tensorflow_distribution", lambda: (dist, version))
    assert install_tf_keras.requirement() == (req, no_deps)


def test_without_tensorflow_it_says_what_to_install_first(monkeypatch):
    monkeypatch.setattr(install_tf_keras, "tensorflow_distribution", lambda: None)
    with pytest.raises(ConfigError, match=r"nbdist\[cpu\]"):
        install_tf_keras.requirement()


def test_check_and_require_name_the_command(monkeypatch, capsys):
    monkeypatch.setattr(install_tf_keras.importlib.util, "find_spec", lambda name: None)
    assert install_tf_keras.main(["--check"]) == 1
    assert "run `python3 -m nbdist.install_tf_keras`" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"Tutorial 04 needs tf_keras.*python3 -m nbdist\."
                                          r"install_tf_keras.*restart the kernel"):
        install_tf_keras.require("Tutorial 04")


def test_installed_here_it_matches_and_installs_nothing():
    """This environment was set up by the README's command, which runs nbdist.install_tf_keras."""
    done = subprocess.run([sys.executable, "-m", "nbdist.install_tf_keras"], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0 and "is installed (beside tensorflow" in done.stdout, done


