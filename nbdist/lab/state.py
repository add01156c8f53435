"""The shape of the state the kernel sends to the JupyterLab extension (see ``lab.comm``)."""

from __future__ import annotations

import json
from typing import Any

from ..telemetry.run import STATUSES as RUN_STATUSES

__all__ = ["RUN_STATUSES", "empty_state", "sendable_state", "validate_state"]

_STATE_KEYS = (
    "version",
    "strategy",
    "magic_line",
    "replicas",
    "devices",
    "workers_total",
    "workers_alive",
    "dead_workers",
    "stragglers",
    "run",
    "verdict",
)
_RUN_KEYS = ("id", "status", "step", "epoch", "total_steps")
_VERDICT_KEYS = ("run", "step", "bottleneck", "advice")


# -- the state shape -------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(where: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ValueError(f"nbdist state: {where} must be an int >= 0, got {value!r}")


def _check_keys(where: str, d: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"nbdist state: {where} must be a dict, got {type(d).__name__}")
    missing = [k for k in keys if k not in d]
    unknown = sorted(str(k) for k in d if k not in keys)
    if missing or unknown:
        raise ValueError(
            f"nbdist state: {where} has missing keys {missing} and unknown keys {unknown}; "
            f"expected exactly {list(keys)}"
        )


def _check_str_list(where: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"nbdist state: {where} must be a list of str, got {value!r}")


def _check_run(run: Any) -> None:
    _check_keys("run", run, _RUN_KEYS)
    _check_count("run.id", run["id"])
    if run["status"] not in RUN_STATUSES:
        raise ValueError(
            f"nbdist state: run.status must be one of {list(RUN_STATUSES)}, got {run['status']!r}"
        )
    _check_count("run.step", run["step"])
    _check_count("run.epoch", run["epoch"])
    if run["total_steps"] is not None:
        _check_count("run.total_steps", run["total_steps"])


def _check_verdict(verdict: Any) -> None:
    from ..telemetry.explain import BOTTLENECKS

    _check_keys("verdict", verdict, _VERDICT_KEYS)
    _check_count("verdict.run", verdict["run"])
    _check_count("verdict.step", verdict["step"])
    if verdict["bottleneck"] not in BOTTLENECKS:
        raise ValueError(f"nbdist state: verdict.bottleneck must be one of {list(BOTTLENECKS)}, "
                         f"got {verdict['bottleneck']!r}")
    if verdict["advice"] is not None and not isinstance(verdict["advice"], str):
        raise ValueError(
            f"nbdist state: verdict.advice must be a str or None, got {verdict['advice']!r}")


def validate_state(d: Any) -> dict[str, Any]:
    """Check that ``d`` is a STATE dict as the JupyterLab extension expects; return it.

    Raises ``ValueError`` naming the first offending key. The check is strict (exact keys,
    ints that are not bools, known strategy names) because the frontend rejects anything else.
    """
    from ..spec import STRATEGY_NAMES

    _check_keys("state", d, _STATE_KEYS)
    if not isinstance(d["version"], str):
        raise ValueError(f"nbdist state: version must be a str, got {d['version']!r}")
    strategy, magic_line = d["strategy"], d["magic_line"]
    if strategy is not None and strategy not in STRATEGY_NAMES:
        raise ValueError(
            f"nbdist state: strategy must be None or one of {list(STRATEGY_NAMES)}, "
            f"got {strategy!r}"
        )
    if (strategy is None) != (magic_line is None):
        raise ValueError(
            "nbdist state: strategy and magic_line must both be None or both be set, got "
            f"strategy={strategy!r}, magic_line={magic_line!r}"
        )
    if magic_line is not None and (
        not isinstance(magic_line, str) or not magic_line.startswith("%distribute ")
    ):
        raise ValueError(
            "nbdist state: magic_line must be a line magic such as "
            f"'%distribute mirrored --devices 2', got {magic_line!r}"
        )
    for key in ("replicas", "workers_total", "workers_alive"):
        _check_count(key, d[key])
    if d["workers_alive"] > d["workers_total"]:
        raise ValueError(
            f"nbdist state: workers_alive ({d['workers_alive']}) exceeds "
            f"workers_total ({d['workers_total']})"
        )
    _check_str_list("devices", d["devices"])
    _check_str_list("stragglers", d["stragglers"])
    dead = d["dead_workers"]
    if not isinstance(dead, list) or not all(_is_int(w) and w >= 0 for w in dead):
        raise ValueError(f"nbdist state: dead_workers must be a list of int >= 0, got {dead!r}")
    if d["run"] is not None:
        _check_run(d["run"])
    if d["verdict"] is not None:
        _check_verdict(d["verdict"])
    return d


def empty_state(version: str | None = None) -> dict[str, Any]:
    """The state of a kernel with nbdist loaded and no strategy chosen yet."""
    if version is None:
        from ..version import __version__ as version
    return {
        "version": version,
        "strategy": None,
        "magic_line": None,
        "replicas": 0,
        "devices": [],
        "workers_total": 0,
        "workers_alive": 0,
        "dead_workers": [],
        "stragglers": [],
        "run": None,
        "verdict": None,
    }


def sendable_state(d: Any) -> dict[str, Any]:
    """``d`` checked by ``validate_state`` and deep-copied (as JSON: what the comm sends), so
    later changes to ``d`` cannot alter a state already compared or sent."""
    copied: dict[str, Any] = json.loads(json.dumps(validate_state(d)))
    return copied
