"""What nbdist draws: progress, the dashboard, the strategy picker.

Importing this package registers ``Run.plot`` (``static.plot_figure``) with the Run store, which
imports no view itself; plotly loads only when a figure is drawn.
"""

from __future__ import annotations

from typing import Any

from ..telemetry.run import Run, register_view


def plot(run: Run, **options: Any) -> Any:
    """A static plotly Figure of ``run`` (``run.plot()``; see ``static.plot_figure``)."""
    from .static import plot_figure

    return plot_figure(run, **options)


register_view("plot", plot)
