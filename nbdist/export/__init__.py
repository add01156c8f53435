"""``%distribute export FILE.py``: the notebook's distributed training as a standalone script.

``history`` reads the cells (IPython's input history and what the session recorded about each
``%%distribute`` cell), ``cellnames`` finds what each defines and reads, ``plan`` picks the cells
the step cell needs, ``script`` writes them into ``template``. The script trains without
nbdist; ``python -m nbdist.launch`` runs it as several workers.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..errors import ExportError
from ..words import count
from ..writable import unwritable_reason


@magic_arguments(name="distribute export")
@argument("export", help=argparse.SUPPRESS)   # the word itself; the usage line shows it
@argument("file", metavar="FILE.py", help="the script to write")
@argument("--strategy", metavar="NAME",
          help="the script's default --strategy (default: the notebook's)")
@argument("--cell", type=int, metavar="N",
          help="the step cell In[N] to export (default: the last that ran)")
@argument("--force", action="store_true", help="overwrite FILE.py (default: refuse)")
def _export_args(line: str) -> None:
    """Write the session's step-cell training, with the cells it needs, as a script."""


def export_help() -> str:
    """``%distribute export --help``: its usage, one line per flag, and where it is explained."""
    return (f"{_export_args.parser.format_help().rstrip()}\n\nThe script, and running it as "
            "several workers (python -m nbdist.launch):\ndocs/guide/export-and-launch.md.")


def export_magic(shell: Any, session: Any, line: str) -> str:
    """``%distribute export FILE.py [--strategy NAME] [--cell N] [--force]``: validate, then
    write the script; returns its path."""
    from .history import notebook_cells
    from .plan import plan_export
    from .script import check_strategy, fit_cells, launch_job, render, tf_keras_requirement

    try:   # a quoted path with spaces is one word (parse_argstring keeps the quotes)
        try:
            words = shlex.split(line)
        except ValueError:   # an unclosed quote: as typed
            words = line.split()
        args = _export_args.parser.parse_args(words)
    except UsageError as err:
        raise ExportError(_usage_advice(str(err), line)) from None
    path = os.path.abspath(os.path.expanduser(args.file))
    if not path.endswith(".py"):
        raise ExportError(f"`%distribute export {args.file}`: give a .py file name, e.g. "
                          "`%distribute export train.py`.")
    why = unwritable_reason(os.path.dirname(path), created=False)
    if why is not None:
        make = (f"create the directory first (`mkdir -p {shlex.quote(os.path.dirname(path))}`), or "
                if why.endswith("does not exist") else "")
        raise ExportError(f"`%distribute export {args.file}`: nbdist cannot write {path} "
                          f"({why}), so nothing was written. {make.capitalize()}"
                          f"{'g' if make else 'G'}ive a .py file in a directory you can write "
                          "to, e.g. `%distribute export train.py` (the notebook's directory).")
    if os.path.exists(path) and not args.force:
        raise ExportError(f"`%distribute export {args.file}`: {path} exists. Add --force to "
                          "overwrite it, or give another file name.")
    check_strategy(args.strategy)
    plan = plan_export(notebook_cells(shell, session), args.cell)
    check_strategy(args.strategy or plan.step.strategy.name, given=args.strategy is not None)
    legacy = plan.step.keras == "legacy" or \
        os.environ.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")
    text = render(plan, path, shell.user_ns, args.strategy, legacy)
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:   # a file the directory refuses (its name, a full disk)
        raise ExportError(f"`%distribute export {args.file}`: nbdist could not write {path} "
                          f"({err.strerror or err}). Give another .py file name, e.g. "
                          "`%distribute export train.py`.") from None
    cells = ", ".join(c.label for c in [*plan.cells, plan.step])
    job = launch_job(args.strategy or plan.step.strategy.name, args.file)
    left_out = count(len(plan.left_out), "cell")
    print(f"nbdist: wrote {path} from {cells} ({left_out} left out: listed in its docstring)."
          f" Run it: python {args.file}; as a local job: python -m "
          f"nbdist.launch {job}{_fit_note(fit_cells(plan), legacy, tf_keras_requirement)}")
    return path


def _usage_advice(message: str, line: str) -> str:
    """argparse's ``message`` about an export ``line``, as the one change."""
    import difflib

    words = line.split()[1:]
    extra = message.partition("unrecognized arguments: ")[2].split()
    flags = [w.split("=")[0] for w in extra if w.startswith("-")]
    from ..hooks.argparse_parser import parser_options

    options = list(parser_options(_export_args.parser))
    if flags:
        close = difflib.get_close_matches(flags[0], options, n=1)
        hint = f" Did you mean `{close[0]}`?" if close else ""
        return (f"{flags[0]} is not a flag of `%distribute export`.{hint} Its flags: "
                f"{', '.join(options)} (`%distribute export --help`).")
    if extra:
        path = " ".join(w for w in words if not w.startswith("-"))
        return (f"`{' '.join(extra)}` reads as another argument after the file name: a path "
                f"with spaces must be quoted, `%distribute export '{path}'` (or give a path "
                "without spaces).")
    if "required" in message:
        return "`%distribute export` needs the script's file name, e.g. `%distribute export " \
               "train.py`."
    return f"{message}. `%distribute export --help` lists its flags, with an example."


def _fit_note(cells: list[Any], legacy: bool, requirement: Any) -> str:
    """What the export says when an exported cell calls Keras 3 ``fit``: under several processes
    the script runs tf_keras (Keras 3 ``fit`` fails there), which must be installed."""
    if legacy or not cells:
        return ""
    import importlib.util

    labels = ", ".join(c.label for c in cells)
    where = ("" if importlib.util.find_spec("tf_keras") is not None else
             f" (install it where the job runs: pip install '{requirement()}')")
    return (f". {labels} {'calls' if len(cells) == 1 else 'call'} `fit`, which Keras 3 cannot "
            "run under MultiWorkerMirroredStrategy (keras-team/keras#20585): under multiworker "
            f"and parameter_server the script runs tf_keras as tf.keras{where}, as nbdist's "
            "workers do")
