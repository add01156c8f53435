"""What a declared private API is, and the small probes that tell whether one still exists.

A ``PrivateAPI`` names one private attribute (or non-public module) of a third-party library
that nbdist uses, the hook function that uses it, the feature it serves, the versions it was
checked on and what degrades without it. Its ``probe`` answers, without training anything,
whether the installed library still has it: ``None`` when it does, else why not.

Probes look at classes and their source rather than at live objects where building one would
need a cluster or a training run: an attribute that a class sets in ``__init__`` is found by
reading that ``__init__`` (``used_in``), which is what the library's own code does too.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import NbdistError


class PrivateAPIMissing(NbdistError):
    """A feature needs a private API that the installed library no longer has."""


@dataclass(frozen=True)
class PrivateAPI:
    """One private third-party API nbdist uses (see the module docstring)."""

    library: str       # import name: tensorflow, keras, tf_keras, ipykernel, ipyparallel
    api: str           # what is used, as the library spells it
    hook: str          # the nbdist.hooks function(s) using it, e.g. "tensorflow.call_flat"
    feature: str       # the nbdist feature that needs it
    checked: str       # the library versions it was checked on
    degrades: str      # what happens without it
    probe: Callable[[], str | None] = field(repr=False, compare=False)
    names: tuple[str, ...] = ()   # the private identifiers, for the source scan of nbdist/
    optional: bool = False        # the library is an optional dependency of nbdist

    @property
    def id(self) -> str:
        return f"{self.library}:{self.api}"

    def installed(self) -> bool:
        """Whether the library is importable here (nothing is imported to find out)."""
        return self.library in sys.modules or importlib.util.find_spec(self.library) is not None

    def missing(self) -> str | None:
        """None if the installed library has the API, else why not (never raises)."""
        try:
            return self.probe()
        except Exception as err:  # a moved module, a renamed class: all mean "missing"
            return f"{type(err).__name__}: {err}"

    def explain(self, why: str) -> str:
        """One paragraph: the feature, what is missing, what degrades, the versions checked."""
        return (f"{self.feature}: {self.library} {version_of(self.library)} lacks {self.api} "
                f"({why}). Without it: {self.degrades}. Checked with {self.library} "
                f"{self.checked}; hook nbdist.hooks.{self.hook}.")


def version_of(library: str) -> str:
    """The version of an installed library, as its module reports it ("?" if unknown)."""
    try:
        module = sys.modules.get(library) or importlib.import_module(library)
    except ImportError:
        return "(not installed)"
    return str(getattr(module, "__version__", "?"))


def lacks(obj: Any, *names: str) -> str | None:
    """None if ``obj`` has every attribute in ``names``, else which it lacks."""
    gone = [name for name in names if not hasattr(obj, name)]
    return f"{_name(obj)} has no {', '.join(gone)}" if gone else None


def used_in(obj: Any, *names: str) -> str | None:
    """None if the source of ``obj`` (a class, function or module) uses every name in
    ``names`` as ``.name`` or ``"name"``, else which it does not: for attributes a class only
    creates in ``__init__``, or reads with ``getattr``."""
    source = inspect.getsource(obj)
    gone = [name for name in names
            if not re.search(rf"[.'\"]{re.escape(name)}\b", source)]
    return f"{_name(obj)} no longer uses {', '.join(gone)}" if gone else None


def first_problem(*checks: Callable[[], str | None]) -> str | None:
    """The first non-None answer of ``checks``, run in order (later ones may need earlier)."""
    for check in checks:
        why = check()
        if why is not None:
            return why
    return None


def _name(obj: Any) -> str:
    return (getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
            or type(obj).__qualname__)
