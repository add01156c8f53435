"""A plotly figure dict drawn as plain SVG: the finished dashboard where no JavaScript runs.

GitHub, nbviewer and nbconvert show a notebook's ``image/svg+xml`` outputs without running
any script, and drawing takes milliseconds with no browser. Only what the dashboard's figure
uses is drawn: scatter traces (lines, markers) on subplot axes (linear or log), subplot titles
from the annotations, the figure title and a legend. numpy only.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

import numpy as np

WIDTH, HEIGHT = 960, 560
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 20, 56, 70       # margins (px) around the subplot grid
_FONT = 'font-family="sans-serif"'


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.4g}"


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    """Tick positions in axis units (log10 of the value on a log axis)."""
    if log:
        decades = [float(e) for e in range(math.floor(lo), math.ceil(hi) + 1) if lo <= e <= hi]
        if len(decades) >= 2:
            return decades
        return [math.log10(v) for v in _ticks(10 ** lo, 10 ** hi, False) if v > 0]
    span = hi - lo or 1.0
    raw = span / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _arrays(trace: dict[str, Any], log: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(trace.get("x", ()), dtype=np.float64)
    y = np.asarray(trace.get("y", ()), dtype=np.float64)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else True)
    return x[ok], (np.log10(y[ok]) if log else y[ok])


class _Axes:
    def __init__(self, layout: dict[str, Any], xname: str, yname: str):
        xa, ya = layout.get(xname, {}), layout.get(yname, {})
        x0, x1 = xa.get("domain", (0, 1))
        y0, y1 = ya.get("domain", (0, 1))
        w, h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
        self.left, self.right = _LEFT + x0 * w, _LEFT + x1 * w
        self.top, self.bottom = _TOP + (1 - y1) * h, _TOP + (1 - y0) * h
        self.log = ya.get("type") == "log"
        self.xtitle = (xa.get("title") or {}).get("text", "")
        self.xr = self.yr = (0.0, 1.0)

    def fit(self, series: list[tuple[np.ndarray, np.ndarray]]) -> None:
        xs = [x for x, _ in series if len(x)]
        ys = [y for _, y in series if len(y)]
        if xs:
            lo, hi = min(float(x.min()) for x in xs), max(float(x.max()) for x in xs)
            self.xr = (lo, hi if hi > lo else lo + 1)
        if ys:
            lo, hi = min(float(y.min()) for y in ys), max(float(y.max()) for y in ys)
            pad = (hi - lo) * 0.05 or (0.5 if self.log else abs(lo) * 0.1 or 1.0)
            self.yr = (lo - pad, hi + pad)

    def px(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (x0, x1), (y0, y1) = self.xr, self.yr
        return (self.left + (x - x0) / (x1 - x0) * (self.right - self.left),
                self.bottom - (y - y0) / (y1 - y0) * (self.bottom - self.top))

    def frame(self) -> list[str]:
        out = [f'<rect x="{self.left:.1f}" y="{self.top:.1f}" width="{self.right - self.left:.1f}"'
               f' height="{self.bottom - self.top:.1f}" fill="none" stroke="#bbb"/>']
        for v in _ticks(*self.yr, self.log):
            _, py = self.px(np.array([self.xr[0]]), np.array([v]))
            label = _fmt(10 ** v if self.log else v)
            out.append(f'<line x1="{self.left:.1f}" x2="{self.right:.1f}" y1="{py[0]:.1f}" '
                       f'y2="{py[0]:.1f}" stroke="#eee"/><text x="{self.left - 4:.1f}" '
                       f'y="{py[0] + 3:.1f}" font-size="10" text-anchor="end" {_FONT}>'
                       f"{label}</text>")
        for v in _ticks(*self.xr, False):
            px, _ = self.px(np.array([v]), np.array([self.yr[0]]))
            out.append(f'<text x="{px[0]:.1f}" y="{self.bottom + 12:.1f}" font-size="10" '
                       f'text-anchor="middle" {_FONT}>{_fmt(v)}</text>')
        if self.xtitle:
            out.append(f'<text x="{(self.left + self.right) / 2:.1f}" y="{self.bottom + 25:.1f}"'
                       f' font-size="11" text-anchor="middle" {_FONT}>'
                       f"{escape(self.xtitle)}</text>")
        return out


def _trace_svg(trace: dict[str, Any], axes: _Axes, x: np.ndarray, y: np.ndarray) -> str:
    if not len(x):
        return ""
    px, py = axes.px(x, y)
    line = trace.get("line") or {}
    color = escape(str(line.get("color") or (trace.get("marker") or {}).get("color") or "#444"))
    name = escape(str(trace.get("name", "")))
    if "lines" in trace.get("mode", "lines"):
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        return (f'<polyline fill="none" stroke="{color}" stroke-width="{line.get("width", 1)}" '
                f'stroke-opacity="{trace.get("opacity", 1)}" points="{points}">'
                f"<title>{name}</title></polyline>")
    return "".join(f'<path d="M{a - 4:.1f},{b - 4:.1f}l8,8m0,-8l-8,8" stroke="{color}" '
                   f'stroke-width="2"><title>{name}</title></path>' for a, b in zip(px, py,
                                                                                  strict=True))


def figure_svg(figure: dict[str, Any]) -> str:
    """The figure (``{"data": [...], "layout": {...}}``, numpy arrays or lists) as SVG text."""
    layout = figure.get("layout", {})
    data = figure.get("data", [])
    axes: dict[tuple[str, str], _Axes] = {}
    for trace in data:
        xa, ya = trace.get("xaxis", "x"), trace.get("yaxis", "y")
        key = (xa, ya)
        if key not in axes:
            axes[key] = _Axes(layout, "xaxis" + xa[1:], "yaxis" + ya[1:])
    arrays = [_arrays(t, axes[(t.get("xaxis", "x"), t.get("yaxis", "y"))].log) for t in data]
    for key, ax in axes.items():
        ax.fit([a for t, a in zip(data, arrays, strict=True)
                if (t.get("xaxis", "x"), t.get("yaxis", "y")) == key])
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'viewBox="0 0 {WIDTH} {HEIGHT}" class="nbdist-static-figure">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']
    title = (layout.get("title") or {}).get("text", "")
    if title:
        out.append(f'<text x="10" y="18" font-size="13" {_FONT}>{escape(title)}</text>')
    for ann in layout.get("annotations", ()):
        x = _LEFT + ann.get("x", 0) * (WIDTH - _LEFT - _RIGHT)
        y = _TOP + (1 - ann.get("y", 1)) * (HEIGHT - _TOP - _BOTTOM) - 6
        out.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="12" text-anchor="middle" '
                   f'{_FONT}>{escape(str(ann.get("text", "")))}</text>')
    for ax in axes.values():
        out += ax.frame()
    for trace, (x, y) in zip(data, arrays, strict=True):
        out.append(_trace_svg(trace, axes[(trace.get("xaxis", "x"), trace.get("yaxis", "y"))],
                              x, y))
    out += _legend([t for t in data if t.get("showlegend", True) and t.get("name")])
    out.append("</svg>")
    return "\n".join(s for s in out if s)


def _legend(traces: list[dict[str, Any]]) -> list[str]:
    out, x, y = [], float(_LEFT), HEIGHT - 16.0
    for trace in traces:
        name = str(trace["name"])
        color = escape(str((trace.get("line") or {}).get("color")
                           or (trace.get("marker") or {}).get("color") or "#444"))
        width = 30 + 6.5 * len(name)
        if x + width > WIDTH - _RIGHT:
            x, y = float(_LEFT), y - 16
        sample = (f'<line x1="{x:.0f}" x2="{x + 20:.0f}" y1="{y - 4:.0f}" y2="{y - 4:.0f}" '
                  f'stroke="{color}" stroke-width="3"/>' if "lines" in trace.get("mode", "lines")
                  else f'<path d="M{x + 6:.0f},{y - 8:.0f}l8,8m0,-8l-8,8" stroke="{color}" '
                       'stroke-width="2"/>')
        out.append(f'{sample}<text x="{x + 24:.0f}" y="{y:.0f}" font-size="11" {_FONT}>'
                   f"{escape(name)}</text>")
        x += width
    return out
