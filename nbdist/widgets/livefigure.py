"""The live dashboard's figure: a small anywidget that draws with plotly.js loaded once per page.

plotly's ``FigureWidget`` is an anywidget whose ~5 MB ES module (plotly.js included) is stored
in the notebook's widget state once per figure. ``LiveFigure``'s module (``livefigure.js``)
is ~3 KB: it takes plotly.js from nbdist's JupyterLab extension (JupyterLab 4, Notebook 7;
loaded once per page) or from plotly's CDN (other widget front ends). Its state is the figure
as first drawn; later data goes in custom messages (float64 arrays as binary buffers), which
a saved notebook does not keep: the final figure is left as a static output when the run ends.

A page that connects while the run goes on (a reload, a second tab) cannot ask for those
messages, so ``follow`` makes another widget that starts from what the figure shows now and
then gets every later message too: one encoding, one more message per view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets

from ..hooks.ipykernel import can_watch_comm, watch_comm
from .figure import plotly_json
from .panels import PLOTLY_CONFIG

__all__ = ["LiveFigure"]


def _cdn() -> str:
    from plotly.offline import get_plotlyjs_version

    return f"https://cdn.plot.ly/plotly-{get_plotlyjs_version()}.min.js"


class LiveFigure(anywidget.AnyWidget):
    """A plotly figure updated by ``add_traces`` and ``restyle`` messages."""

    # The module's text, not its path: for a path anywidget connects every instance to the
    # file's change signal (hot reload) with a strong reference, so no figure was ever freed.
    _esm = Path(__file__).with_name("livefigure.js").read_text(encoding="utf-8")
    # {"data", "layout", "config"}: traces added later come without their data
    figure = traitlets.Dict().tag(sync=True)
    cdn = traitlets.Unicode().tag(sync=True)   # plotly.js when nbdist's extension is absent
    smoothing = traitlets.Float(0.0).tag(sync=True)   # the slider's, set by the front end
    # the front end offers "download the run's data as CSV": the kernel answers while it runs
    can_download = traitlets.Bool(False).tag(sync=True)

    def __init__(self, figure: dict[str, Any]):
        super().__init__(figure={**plotly_json(figure), "config": PLOTLY_CONFIG}, cdn=_cdn())
        # What the front end shows now (numpy arrays as sent): for reading, e.g. in tests.
        self.current: dict[str, Any] = {"data": [dict(t) for t in figure["data"]],
                                        "layout": figure["layout"]}
        self._slider: float | None = None
        self._leader: LiveFigure | None = None      # set on a follower (see ``follow``)
        self._followers: list[LiveFigure] = []
        #: ``() -> (file name, CSV bytes)`` of the run's rows, set by its view: the mode bar's
        #: CSV button asks for them (a follower asks its leader's)
        self.csv: Callable[[], tuple[str, bytes]] | None = None
        self._unwatch = watch_comm(self.comm, self._seen) if can_watch_comm(self.comm) else None
        self.can_download = self._unwatch is not None

    def follow(self) -> LiveFigure:
        """Another widget showing this figure, for a page that connected mid-run: its state
        is the figure as shown now (data included), and every later ``add_traces`` and
        ``restyle`` goes to it too. It shares ``current``; its slider counts as this one's.
        Closing it stops the copies."""
        other = LiveFigure(self.current)
        other.current = self.current
        other._leader = self
        self._followers.append(other)
        return other

    def _seen(self, data: Any) -> None:
        """A message from the front end, seen as it arrives (the kernel is busy running the
        cell and handles it only afterwards): keep the slider's value, answer a CSV request."""
        if not isinstance(data, dict):
            return
        content = data.get("content")
        if data.get("method") == "custom" and isinstance(content, dict) and \
                content.get("type") == "csv":
            self.send_csv()
            return
        if data.get("method") != "update":
            return
        state = data.get("state")
        if isinstance(state, dict) and "smoothing" in state:
            value = state["smoothing"]
            if isinstance(value, (int, float)) and 0 <= value < 1:
                (self._leader or self)._slider = float(value)

    def send_csv(self) -> threading.Thread | None:
        """Send the run's rows as CSV to this view (``{"type": "csv", "name"}`` and the bytes
        as a buffer), from a thread of its own: the request comes on the shell-channel thread,
        which must not wait for a big run's CSV."""
        source = (self._leader or self).csv
        if source is None:
            return None

        def work() -> None:
            try:
                name, body = source()
            except Exception as err:   # said in the browser's console, training goes on
                self.send({"type": "csv_error", "message": f"{type(err).__name__}: {err}"})
                return
            self.send({"type": "csv", "name": name}, [body])

        thread = threading.Thread(target=work, name="nbdist-csv", daemon=True)
        thread.start()
        return thread

    def chosen_smoothing(self) -> float:
        """The smoothing the user set on this figure's slider, even while the cell runs."""
        return self._slider if self._slider is not None else self.smoothing

    def close(self) -> None:
        if self._unwatch is not None:
            unwatch, self._unwatch = self._unwatch, None
            unwatch()
        if self._leader is not None and self in self._leader._followers:
            self._leader._followers.remove(self)
        super().close()

    def add_traces(self, traces: list[dict[str, Any]]) -> None:
        """Append traces (their data comes with later restyles)."""
        shells = plotly_json([{k: v for k, v in t.items() if k not in ("x", "y", "text")}
                              for t in traces])
        self.figure = {**self.figure, "data": [*self.figure["data"], *shells]}
        self.current["data"] += [dict(t) for t in traces]
        msg = {"type": "add_traces", "traces": plotly_json(traces)}
        for fig in (self, *self._followers):
            if fig is not self:
                fig.figure = {**fig.figure, "data": [*fig.figure["data"], *shells]}
            fig.send(msg)

    def restyle(self, restyle: dict[str, list[Any]], indices: list[int]) -> None:
        """Set ``restyle[prop][i]`` on trace ``indices[i]`` in one message: numpy arrays go
        as float64 binary buffers, other values as JSON."""
        buffers: list[bytes] = []
        props: dict[str, list[Any]] = {}
        for prop, values in restyle.items():
            encoded = []
            for i, value in zip(indices, values, strict=True):
                self.current["data"][i][prop] = value
                if isinstance(value, np.ndarray):
                    encoded.append({"buffer": len(buffers)})
                    buffers.append(np.ascontiguousarray(value, dtype=np.float64).tobytes())
                else:
                    encoded.append(value)
            props[prop] = encoded
        msg = {"type": "restyle", "traces": list(indices), "props": props}
        for fig in (self, *self._followers):
            fig.send(msg, buffers)
