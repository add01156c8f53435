"""``%distribute push`` and ``pull``: values between the kernel and the workers' namespaces,
pickled by ipyparallel."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError


def push_values(client: Any, engine_ids: list[int], values: dict[str, Any]) -> None:
    """Copy ``values`` into every worker's namespace."""
    try:
        client[engine_ids].push(values, block=True)
    except Exception as err:
        raise ConfigError(f"Could not send {sorted(values)} to the workers: {err}. "
                          "Only picklable values can be pushed.") from None


def pull_value(client: Any, engine_ids: list[int], name: str, worker_index: int) -> Any:
    """The value of ``name`` on worker ``worker_index`` (``engine_ids[worker_index]``)."""
    if not 0 <= worker_index < len(engine_ids):
        raise ConfigError(f"--worker {worker_index}: the workers are 0..{len(engine_ids) - 1}.")
    try:
        return client[engine_ids[worker_index]].pull(name, block=True)
    except Exception as err:
        what = getattr(err, "ename", type(err).__name__)
        if what == "NameError":
            raise ConfigError(f"worker {worker_index} has no variable `{name}`.") from None
        raise ConfigError(f"Could not pull `{name}` from worker {worker_index} ({what}: "
                          f"{getattr(err, 'evalue', err)}). Only picklable values can "
                          "be pulled; pull arrays or weights instead.") from None
