"""nbdist: distributed TensorFlow from a notebook.

    %load_ext nbdist
    %distribute mirrored --devices 4
    %%distribute --step --data train_ds

Importing nbdist is cheap: TensorFlow, plotly and the magics load only when used.
"""

from __future__ import annotations

from typing import Any

from .errors import NbdistError
from .spec import STRATEGY_NAMES, RunSpec, StrategySpec
from .telemetry.run import Run, runs

__version__ = "0.1.0"
__all__ = [
    "NbdistError",
    "Run",
    "RunSpec",
    "STRATEGY_NAMES",
    "StrategySpec",
    "load_ipython_extension",
    "runs",
]


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%distribute`` / ``%%distribute`` (called by ``%load_ext nbdist``)."""
    from .magics import DistributeMagics

    ipython.register_magics(DistributeMagics)


def unload_ipython_extension(ipython: Any) -> None:
    from .session import current_session

    current_session(ipython).stop()


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "nbdist"}]
