"""Private argparse API: a parser's actions (its flags, with their metavars, choices and help).

argparse has no public accessor for the options a parser was given; IPython's
``magic_arguments`` builds nbdist's parsers, so their actions are where the flags live.
Checked on the argparse of Python 3.10-3.13.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .api import PrivateAPI, lacks

CHECKED = "Python 3.10-3.13"


def parser_options(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's own options by flag (``ArgumentParser._actions``): each flag's action,
    with its ``metavar``, ``nargs``, ``choices`` and ``help``.

    Feature: a misspelt flag, a flag missing its value or a bad choice in a ``%distribute``
    line gets the close match, an example and the flag's help. Checked on Python 3.10-3.13.
    Without it the messages name no close match (an empty dict).
    """
    actions = getattr(parser, "_actions", None)
    if not isinstance(actions, list):
        return {}
    return {flag: action for action in actions for flag in action.option_strings}


def _probe_actions() -> str | None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--x")
    return lacks(parser, "_actions") or (
        None if "--x" in parser_options(parser) else "its actions hold no option strings")


DECLARED = [
    PrivateAPI("argparse", "ArgumentParser._actions", "argparse_parser.parser_options",
               "%distribute lines: close matches, examples and help for mistyped flags",
               f"{CHECKED} (this is {sys.version_info.major}.{sys.version_info.minor})",
               "mistyped flags get argparse's own message without a close match",
               _probe_actions, ("_actions",)),
]
