"""What built the workers' state since they started, in order: the journal ``--elastic``
replays on fresh workers after one died.

The backend adds an entry each time a ``%%distribute`` scope cell ran on every worker without
error, and each time ``%distribute push`` copied values to them (the values as they were
then, pickled in the kernel). Step cells are not entries: what they trained comes back from
the elastic cell's ``--checkpoint``, which holds the objects the cell trains. A cell that
failed is not an entry (its state is whatever the failure left, which no replay gives back).
The journal lives as long as its workers: ``%distribute restart``, ``stop`` or another
strategy line start a new one.

What cannot be replayed is named before an elastic cell runs (``Journal.refusal``): a push of
a value that cannot be copied again, and code that ran on the workers without nbdist
(``%px``/``%%px`` or an ipyparallel view's ``execute`` on a ``--cluster`` profile's engines),
found in the ipyparallel hub's task records (``foreign_code``).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: At most this much of a cell or of foreign code is quoted in a refusal.
_QUOTE = 120


@dataclass(frozen=True)
class Entry:
    """One thing the workers' state was built from."""

    what: str                       # "cell In[4]" / "push lr, data"
    scope_args: tuple[Any, ...] = ()   # a scope cell: ``inengine.cells.run_scope``'s arguments
    pushed: bytes | None = None     # a push: its values, pickled when they were pushed
    refusal: str | None = None      # why it cannot be replayed (None: it can)


class Journal:
    """The entries of one set of workers, oldest first."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.hub_seen: set[str] = set()   # hub task ids known when the workers started

    def add_scope(self, text: str, args: tuple[Any, ...]) -> None:
        self.entries.append(Entry(_cell_name(text), scope_args=args))

    def add_push(self, values: dict[str, Any]) -> None:
        what = f"push {', '.join(values)}"
        try:
            pushed = pickle.dumps(values)
        except Exception as err:   # pickle raises many kinds for what it cannot copy
            self.entries.append(Entry(what, refusal=(
                f"`%distribute {what}` cannot be pushed again: its value cannot be copied "
                f"in the kernel ({type(err).__name__}: {err})")))
            return
        self.entries.append(Entry(what, pushed=pushed))

    def refusal(self, foreign: list[str]) -> str | None:
        """Why these workers' state cannot be rebuilt (None: it can); ``foreign``: code that
        ran on them without nbdist (``foreign_code``)."""
        if foreign:
            code = " ".join(foreign[0].split())
            code = code if len(code) <= _QUOTE else code[:_QUOTE] + "..."
            return (f"code ran on the workers without nbdist (`{code}`, by %px or an "
                    "ipyparallel view), so nbdist cannot run it again on fresh workers")
        for entry in self.entries:
            if entry.refusal is not None:
                return entry.refusal
        return None

    def replay(self, run_scope: Callable[[tuple[Any, ...]], None],
               push: Callable[[dict[str, Any]], None]) -> list[str]:
        """Run every entry again, in order; return what was replayed."""
        done = []
        for entry in self.entries:
            if entry.pushed is not None:
                push(pickle.loads(entry.pushed))   # noqa: S301 - pickled by this kernel
            else:
                run_scope(entry.scope_args)
            done.append(entry.what)
        return done


def _cell_name(text: str) -> str:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"the cell `{first if len(first) <= 60 else first[:60] + '...'}`"


def hub_task_ids(client: Any) -> set[str]:
    """Every task id the ipyparallel hub has recorded (every client's)."""
    return set(client.hub_history())


def foreign_code(client: Any, seen: set[str]) -> list[str]:
    """The code of tasks sent to the engines by ``execute`` (what ``%px`` does; nbdist only
    applies functions), by any client, since ``seen`` was taken, oldest first."""
    new = sorted(hub_task_ids(client) - seen)
    if not new:
        return []
    records = client.db_query({"msg_id": {"$in": new}},
                              keys=["msg_id", "header", "content", "submitted"])
    executed = [r for r in records if (r.get("header") or {}).get("msg_type")
                == "execute_request"]
    executed.sort(key=lambda r: str(r.get("submitted")))
    return [str((r.get("content") or {}).get("code") or "(code not recorded)")
            for r in executed]
