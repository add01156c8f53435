"""`%distribute?` and the two parsers: the line magic's flags and the cell magic's are
distinct, so a flag in the wrong magic is refused; a cell whose strategy differs from the
kernel's gives advice that works when followed (through a real IPython shell)."""

import re

import pytest
from helpers import run_err, run_ok, session_cluster
from test_magics import BODY, BUILD, SETUP

import nbdist
from nbdist.errors import ConfigError, StepCodeError
from nbdist.session import current_session


def test_help_is_the_docstring_with_examples(ip):
    """`%distribute?` shows the docstring: both usages, one line per flag with its default,
    examples; as long as IPython's own magics' help (the narrative is in the README)."""
    from nbdist.magics import _cell_args, _line_args

    doc = ip.find_line_magic("distribute").__doc__
    lines = doc.splitlines()
    # IPython 9's %timeit help is 85 lines, %run's 157
    assert 40 <= len(lines) <= 90 and max(map(len, lines)) <= 100, len(lines)
    assert "  %distribute [--devices N]" in doc and "  %%distribute [--devices N]" in doc
    assert "Examples::" in doc and "%%distribute --step --data train_ds" in doc
    for magic in (_line_args, _cell_args):
        flags = [a for a in magic.parser._actions if a.option_strings]
        for action in flags:
            flag = action.option_strings[0]
            line = next(ln for ln in lines if ln.startswith(f"  {flag} "))
            assert "(default" in line or "(required)" in line, line   # one line, with it


@pytest.mark.parametrize("cell, line, words", [
    (False, "mirrored --devices 4 --step", "--step belongs on a `%%distribute` cell"),
    (False, "--data ds", "--data belongs on a `%%distribute` cell"),
    (True, "--worker 1 --step --data ds", "--worker belongs on the `%distribute` line"),
    (True, "--keras legacy", "--keras belongs on the `%distribute` line"),
    (True, "status", "`status` is a line command"),
])
def test_a_flag_in_the_wrong_magic_is_refused_saying_where_it_goes(ip, cell, line, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        if cell:
            ip.run_cell_magic("distribute", line, "x = 1\n")
        else:
            ip.run_line_magic("distribute", line)
    with pytest.raises(ConfigError, match="Did you mean `--workers 2`"):   # no abbreviation
        ip.run_cell_magic("distribute", "--work 2 --step --data ds", "loss = 1.0\n")
    assert current_session().backend.spec.magic_line() == "%distribute mirrored --devices 4"


@pytest.fixture
def shell(ip):
    run_ok(ip, SETUP)
    run_ok(ip, BUILD)
    return ip


def test_inline_strategy_must_agree_and_the_advice_works_when_followed(shell):
    cell = "%%distribute mirrored --devices 2 --step --data ds --steps 1\n" + BODY
    err = run_err(shell, cell)
    assert isinstance(err, ConfigError) and "kernel's strategy" in str(err)
    advice = re.search(r"switch first with `(%distribute [^`]+)`", str(err))
    assert advice and "stop" not in advice.group(1), str(err)
    try:
        run_ok(shell, advice.group(1))                # exactly what the error says, in order
        err = run_err(shell, cell)                    # the model still belongs to the old one
        assert isinstance(err, StepCodeError) and "again in a `%%distribute` cell" in str(err)
        assert "create the model and optimizer again" in str(advice.string)
        run_ok(shell, BUILD)
        run_ok(shell, cell)
        assert nbdist.runs[-1].status == "done" and nbdist.runs[-1].replicas == 2
    finally:
        run_ok(shell, "%distribute mirrored --devices 4")
        run_ok(shell, BUILD)


def test_a_trailing_comment_is_not_taken_for_arguments(ip, capsys):
    """Lines pasted with a `# comment`, as the examples write them: the comment is ignored,
    in the line magic and in the cell magic's header; a `#` inside quotes is kept."""
    ip.run_line_magic("distribute", "mirrored --devices 4    # the CPU split into 4 devices")
    capsys.readouterr()
    ip.run_line_magic("distribute", "status   # strategy, replicas, workers")
    assert "mirrored" in capsys.readouterr().out
    run_ok(ip, "%%distribute   # scope mode\ncommented = 1")
    assert ip.user_ns["commented"] == 1
    from nbdist.magics import without_comment

    assert without_comment('export "a #1.py"  # a script') == 'export "a #1.py"'
    assert without_comment("pull x#y") == "pull x#y"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_flag_prints_the_help_with_the_docs_page_of_each_action(ip, capsys, flag):
    """`%distribute --help` / `-h` (also after a strategy, or on a cell, which then does not
    run) print what `%distribute?` shows: every action, export included, and the docs page
    that explains each; `%distribute export --help` prints the export's own flags."""
    ip.run_line_magic("distribute", f"{flag}   # what can I type?")
    out = capsys.readouterr().out
    assert out.strip() == ip.find_line_magic("distribute").__doc__.strip()
    assert "status, stop, restart, push, pull, inject, export" in out
    for page in ("docs/reference/magics.md", "docs/guide/strategies.md",
                 "docs/guide/scope-mode.md", "docs/guide/step-mode.md",
                 "docs/guide/multiworker.md", "docs/guide/parameter-servers.md",
                 "docs/guide/clusters.md", "docs/guide/export-and-launch.md",
                 "docs/guide/faults.md", "docs/guide/checkpoints.md", "docs/guide/dashboard.md"):
        assert page in out, page
    assert "%distribute export train.py" in out and "(its flags: --help)" in out
    assert "README" not in out

    ip.run_line_magic("distribute", f"mirrored --devices 2 {flag}")
    assert "  %%distribute [--devices N]" in capsys.readouterr().out
    assert current_session().backend.spec.magic_line() == "%distribute mirrored --devices 4"
    ip.run_cell_magic("distribute", flag, "helped = 1\n")
    assert "  %%distribute [--devices N]" in capsys.readouterr().out
    assert "helped" not in ip.user_ns

    ip.run_line_magic("distribute", f"export {flag}")
    out = capsys.readouterr().out
    assert "%distribute export [--strategy NAME] [--cell N] [--force] FILE.py" in out
    for flag_help in ("--strategy NAME  the script's default --strategy",
                      "--cell N         the step cell In[N] to export",
                      "--force          overwrite FILE.py", "docs/guide/export-and-launch.md"):
        assert flag_help in out, flag_help


@pytest.mark.parametrize("line, words", [
    ("multiworker --workers 2 --devices 2", "one device per worker"),
    ("multiworker --workers 2 --cluster no-such-profile", "no IPython profile 'no-such-pro"),
    ("push", "needs variable names"),
    ("pull a b", "takes one name"),
    ("status --worker 1", r"--worker \(no s\) picks the worker"),
    ("mirrored --devices 4 --keras legacy", "applies to `multiworker` only"),
    ("restart", "no worker processes to restart"),
    ("pull x", "start them first"),
])
def test_bad_multiworker_lines_fail_before_any_process_starts(ip, line, words):
    with pytest.raises(ConfigError, match=words):
        ip.run_line_magic("distribute", line)
    assert session_cluster() is None


def test_checkpoint_belongs_on_a_cell(ip):
    """(--checkpoint itself is tested in test_checkpoint.py.)"""
    with pytest.raises(ConfigError, match="--checkpoint belongs on a `%%distribute` cell"):
        ip.run_line_magic("distribute", "--checkpoint /tmp/ckpt")
