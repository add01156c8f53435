"""tf_keras beside the installed TensorFlow: ``python -m nbdist.install_tf_keras``.

``%distribute multiworker`` workers run tf_keras as ``tf.keras`` (Keras 3 ``fit`` fails under
MultiWorkerMirroredStrategy in TensorFlow 2.21), and ``model.fit`` under ``parameter_server``
needs tf_keras; tutorials 04 and 05 use both. tf-keras declares a dependency on the full
``tensorflow`` distribution (a 572 MB wheel), which pip would install over ``tensorflow-cpu``
(the same ``tensorflow`` package, twice). A pip extra cannot say "without its dependencies",
so this command installs the tf-keras release of the installed TensorFlow's minor version,
with ``--no-deps`` unless the installed distribution is ``tensorflow`` itself. The README's
install, Binder's ``postBuild`` and the test command run it; ``--check`` only reports.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys

from .errors import ConfigError
from .installed import installed_version, tensorflow_distribution

#: What every message that needs tf_keras tells users to run (then restart the kernel).
INSTALL_HINT = "python3 -m nbdist.install_tf_keras"


def requirement() -> tuple[str, bool]:
    """The tf-keras requirement matching the installed TensorFlow, and whether pip must skip
    its dependencies (any TensorFlow distribution but ``tensorflow`` itself)."""
    found = tensorflow_distribution()
    if found is None:
        raise ConfigError("TensorFlow is not installed: install nbdist with a TensorFlow "
                          "(`pip install 'nbdist[cpu]'` or 'nbdist[gpu]') first.")
    name, version = found
    major, minor = version.split(".")[:2]
    return f"tf-keras=={major}.{minor}.*", name.lower() != "tensorflow"


def matches() -> bool:
    """True if tf_keras is importable and of the installed TensorFlow's minor version."""
    if importlib.util.find_spec("tf_keras") is None:
        return False
    found = tensorflow_distribution()
    have = installed_version("tf-keras").split(".")[:2]
    return found is not None and have == found[1].split(".")[:2]


def require(what: str) -> None:
    """Raise a ConfigError naming ``what`` needs tf_keras and how to install it."""
    if importlib.util.find_spec("tf_keras") is None:
        raise ConfigError(f"{what} needs tf_keras, which is not installed. Run "
                          f"`{INSTALL_HINT}` in a terminal (it installs the tf-keras of your "
                          "TensorFlow's version), then restart the kernel.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nbdist.install_tf_keras", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only report; exit 1 if tf_keras is missing or mismatched")
    args = parser.parse_args(argv)
    req, no_deps = requirement()
    tf_name, tf_version = tensorflow_distribution() or ("tensorflow", "?")
    if matches():
        print(f"nbdist: tf-keras {installed_version('tf-keras')} is installed "
              f"(beside {tf_name} {tf_version}).")
        return 0
    if args.check:
        print(f"nbdist: tf-keras matching {tf_name} {tf_version} is not "
              f"installed: run `{INSTALL_HINT}`.", file=sys.stderr)
        return 1
    cmd = [sys.executable, "-m", "pip", "install", *(["--no-deps"] if no_deps else []), req]
    print("nbdist:", " ".join(cmd[1:]))
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
