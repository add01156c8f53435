"""Mistakes new users make, each answered with one paragraph: what is wrong and the one change.
A refused command changes nothing: the session's strategy, its backend and the user's
namespace are as they were (through a real IPython shell)."""

from __future__ import annotations

import pytest
from helpers import run_err

from nbdist.errors import ConfigError
from nbdist.session import current_session


def _state(shell):
    """What a refused command must leave as it was."""
    backend = current_session(shell).backend
    return (backend, backend and backend.spec,
            {k: id(v) for k, v in shell.user_ns.items() if not k.startswith("_")})


def refused(shell, code: str, error=ConfigError) -> str:
    """Run ``code``, which must be refused with ``error`` and change no state; its message."""
    before = _state(shell)
    err = run_err(shell, code)
    assert isinstance(err, error), repr(err)
    assert _state(shell) == before
    message = str(err)
    assert "\n" not in message   # one paragraph
    return message


@pytest.mark.parametrize("code, said", [
    ("%distribute multiworker --worker 2",
     "--worker (no s) picks the worker `%distribute pull NAME --worker i` reads from. To start "
     "2 worker processes: `%distribute multiworker --workers 2`."),
    ("%%distribute --date train_ds\nx = 1",
     "--date is not a flag of a `%%distribute` cell (two %). Did you mean `--data train_ds`? "
     "`%distribute --help` lists every flag."),
    ("%distribute mirrored --devics 2", "Did you mean `--devices 2`?"),
    ("%%distribute --work 2 --step --data ds\nloss = 1.0", "Did you mean `--workers 2`?"),
    ("%%distribute --steps --data ds\nx = 1",
     "--steps needs a value (N) right after it, e.g. `--steps 100`. --steps: step mode: steps "
     "per epoch at most (default: all)."),
    ("%%distribute --step --data\nx = 1",
     "--data needs a value (NAME) right after it, e.g. `--data train_ds`."),
    ("%%distribute --workers two\nx = 1",
     "--workers 'two': --workers takes a whole number, e.g. `--workers 2`."),
    ("%distribute multiworker --keras new",
     "--keras 'new' is not one of its choices: auto, legacy, keras3, e.g. `--keras legacy`."),
    ("%%distribute --checkpoint /tmp/ck ü2 --step --data ds\nx = 1",
     "`ü2` after `--checkpoint /tmp/ck` reads as another argument: a path with spaces must be "
     "quoted, `--checkpoint '/tmp/ck ü2'` (or give a path without spaces)."),
    ("%%distribute --step --data ds --checkpoint /tmp/my ck dir\nx = 1",
     "`ck dir` after `--checkpoint /tmp/my` reads as another argument: a path with spaces must "
     "be quoted, `--checkpoint '/tmp/my ck dir'`"),
    ("%distribute multiworker --cluster ''",
     "--cluster was given an empty value: it names an ipyparallel profile whose engines run "
     "the workers (without --cluster they run on this machine), e.g. `%distribute multiworker "
     "--cluster ssh`, or drop --cluster. The session is unchanged."),
    ("%distribute parameter_server --partitioner ' '",
     "--partitioner was given an empty value"),
    ("%%distribute --tensorboard /proc/nbdist-logs\nx_tb = 1",
     "--tensorboard '/proc/nbdist-logs': nbdist could not write the run's scalars there (/proc "
     "takes no new files: "),
    ("%%distribute --tensorboard ''\nx_tb = 1",
     "--tensorboard '': nbdist could not write the run's scalars there (no directory given), "
     "so the cell did not run. Give a directory you can write to (it is created if missing), "
     "e.g. `--tensorboard logs/run1`."),
])
def test_a_mistaken_line_is_refused_with_the_one_change(ip, code, said):
    assert said in refused(ip, code)
    assert "x_tb" not in ip.user_ns   # the cell did not run


def test_a_quoted_path_and_a_strategy_after_a_path_are_not_mistakes(ip, tmp_path):
    logs = tmp_path / "tb logs"
    ip.run_cell(f"%%distribute --tensorboard '{logs}'\nx_tb_ok = 1\n", store_history=False)
    assert ip.user_ns.pop("x_tb_ok") == 1
    err = run_err(ip, f"%%distribute --checkpoint {tmp_path} mirrored --devices 2\nx = 1")
    assert "kernel's strategy" in str(err)   # the strategy word is the strategy, not the path
