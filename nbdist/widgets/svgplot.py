"""A plotly figure dict drawn as plain SVG: the finished dashboard where no JavaScript runs.

GitHub, nbviewer and nbconvert show a notebook's ``image/svg+xml`` outputs without running
any script, and drawing takes milliseconds with no browser. Only what the dashboard's figure
uses is drawn, in its look (``panels``): scatter traces (lines with their dash, markers) on
panels stacked over one shared x axis (linear or log y), panel titles and notes from the
annotations and the title, axis titles, and a legend on the right. numpy only.
"""

from __future__ import annotations

import base64
import math
import re
import struct
import time
import zlib
from html import escape
from typing import Any

import numpy as np

WIDTH = 960
_FONT = 'font-family="sans-serif"'
_DASH = {"dash": "7,4", "dot": "2,3", "dashdot": "7,3,2,3", "longdash": "12,4"}


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.4g}"


def _clock(ms: float) -> str:
    """A date axis' value (ms, local time as plotly's zone-less dates hold it) as a clock."""
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000.0))


def _nice(span: float, count: int, integer: bool = False) -> float:
    raw = span / count or 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return max(step, 1.0) if integer else step


def _ticks(lo: float, hi: float, log: bool, integer: bool = False) -> list[float]:
    """Tick positions in axis units (log10 of the value on a log axis): decades, or 1-2-5
    within a few decades, never a crowd of minor labels; whole numbers on an integer axis."""
    if log:
        for mantissas in ((1.0,), (1.0, 2.0, 5.0)):
            ticks = [e + math.log10(m) for e in range(math.floor(lo), math.ceil(hi) + 1)
                     for m in mantissas if lo <= e + math.log10(m) <= hi]
            if len(ticks) >= 3 or (mantissas != (1.0,) and len(ticks) >= 2):
                return ticks
        return [math.log10(v) for v in _ticks(10 ** lo, 10 ** hi, False) if v > 0]
    step = _nice(hi - lo or 1.0, 5, integer)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _arrays(trace: dict[str, Any], log: bool) -> tuple[np.ndarray, np.ndarray]:
    if trace.get("type") == "heatmap":      # its extent: steps x rows
        rows = len(trace.get("z") or ())
        x = np.asarray(trace.get("x", ()), dtype=np.float64)
        return (x[[0, -1]], np.array([-0.5, rows - 0.5])) if rows and len(x) else (x[:0], x[:0])
    x = np.asarray(trace.get("x", ()), dtype=np.float64)
    y = np.asarray(trace.get("y", ()), dtype=np.float64)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    ok = np.isfinite(x) & np.isfinite(y) & ((y > 0) if log else True)
    return x[ok], (np.log10(y[ok]) if log else y[ok])


def _rich(text: str) -> str:
    """Annotation text as SVG text content: <b> kept as bold, other tags dropped."""
    parts = re.split(r"(</?b>)", str(text))
    out, bold = [], False
    for part in parts:
        if part in ("<b>", "</b>"):
            bold = part == "<b>"
        elif part:
            plain = escape(re.sub(r"<[^>]+>", "", part))
            out.append(f'<tspan font-weight="bold">{plain}</tspan>' if bold else plain)
    return "".join(out)


class _Frame:
    """Pixel geometry of the figure: margins, plot area, legend column."""

    def __init__(self, layout: dict[str, Any], legend_w: float):
        margin = layout.get("margin", {})
        self.height = float(layout.get("height", 560))
        self.left, self.top = float(margin.get("l", 60)), float(margin.get("t", 60))
        self.bottom = self.height - float(margin.get("b", 50))
        self.right = WIDTH - float(margin.get("r", 12)) - legend_w

    def px(self, xp: float, yp: float) -> tuple[float, float]:    # paper -> pixels
        return (self.left + xp * (self.right - self.left),
                self.bottom - yp * (self.bottom - self.top))


class _Axes:
    def __init__(self, layout: dict[str, Any], yname: str, frame: _Frame, xr: tuple):
        xa, ya = layout.get("xaxis", {}), layout.get(yname, {})
        y0, y1 = ya.get("domain", (0, 1))
        self.left, self.top = frame.px(0, y1)
        self.right, self.bottom = frame.px(1, y0)
        self.log = ya.get("type") == "log"
        self.date = xa.get("type") == "date"     # ms since the epoch, read as a clock
        self.reversed = ya.get("autorange") == "reversed"     # the heatmap: row 0 on top
        axis_id = "y" + yname[5:]
        self.is_bottom = xa.get("anchor", "y") == axis_id
        self.xtitle = (xa.get("title") or {}).get("text", "") if self.is_bottom else ""
        self.ytitle = (ya.get("title") or {}).get("text", "")
        self.xr, self.yr = xr, (0.0, 1.0)

    def fit(self, ys: list[np.ndarray]) -> None:
        ys = [y for y in ys if len(y)]
        if ys:
            lo, hi = min(float(y.min()) for y in ys), max(float(y.max()) for y in ys)
            pad = (hi - lo) * 0.05 or (0.5 if self.log else abs(lo) * 0.1 or 1.0)
            self.yr = (lo - pad, hi + pad)

    def px(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (x0, x1), (y0, y1) = self.xr, self.yr
        up = (y - y0) / (y1 - y0) * (self.bottom - self.top)
        return (self.left + (x - x0) / (x1 - x0) * (self.right - self.left),
                self.top + up if self.reversed else self.bottom - up)

    def frame(self) -> list[str]:
        out = [f'<rect x="{self.left:.1f}" y="{self.top:.1f}" width="{self.right - self.left:.1f}"'
               f' height="{self.bottom - self.top:.1f}" fill="none" stroke="#ccc"/>']
        for v in _ticks(*self.yr, self.log, integer=self.reversed):   # reversed: workers
            _, py = self.px(np.array([self.xr[0]]), np.array([v]))
            label = _fmt(10 ** v if self.log else v)
            out.append(f'<line x1="{self.left:.1f}" x2="{self.right:.1f}" y1="{py[0]:.1f}" '
                       f'y2="{py[0]:.1f}" stroke="#eee"/><text x="{self.left - 4:.1f}" '
                       f'y="{py[0] + 3:.1f}" font-size="10" text-anchor="end" {_FONT}>'
                       f"{label}</text>")
        for v in _ticks(*self.xr, False, integer=True):
            px, _ = self.px(np.array([v]), np.array([self.yr[0]]))
            out.append(f'<line x1="{px[0]:.1f}" x2="{px[0]:.1f}" y1="{self.top:.1f}" '
                       f'y2="{self.bottom:.1f}" stroke="#f2f2f2"/>')
            if self.is_bottom:
                out.append(f'<text x="{px[0]:.1f}" y="{self.bottom + 12:.1f}" font-size="10" '
                           f'text-anchor="middle" {_FONT}>{_clock(v) if self.date else _fmt(v)}'
                           "</text>")
        if self.xtitle:
            out.append(f'<text x="{(self.left + self.right) / 2:.1f}" y="{self.bottom + 27:.1f}"'
                       f' font-size="11" text-anchor="middle" {_FONT}>'
                       f"{escape(self.xtitle)}</text>")
        if self.ytitle:
            mid = (self.top + self.bottom) / 2
            out.append(f'<text x="{self.left - 44:.1f}" y="{mid:.1f}" font-size="11" '
                       f'text-anchor="middle" transform="rotate(-90 {self.left - 44:.1f} '
                       f'{mid:.1f})" {_FONT}>{escape(self.ytitle)}</text>')
        return out


def _stroke(trace: dict[str, Any]) -> tuple[str, str]:
    """(colour, extra stroke attributes: width, dash) of a line trace."""
    line = trace.get("line") or {}
    color = escape(str(line.get("color") or (trace.get("marker") or {}).get("color") or "#444"))
    dash = _DASH.get(str(line.get("dash", "solid")))
    extra = f'stroke-width="{line.get("width", 1)}"' + (
        f' stroke-dasharray="{dash}"' if dash else "")
    return color, extra


_RAMP = np.array([(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)])


def _heatmap_svg(trace: dict[str, Any], axes: _Axes) -> str:
    """Cells coloured low (dark blue) to high (yellow) as one embedded PNG image, one pixel a
    cell stretched to the panel (a rect per cell made 64 workers' figure ~0.5 MB), row 0 at
    the top on a reversed axis (the live heatmap's worker 0), at the bottom otherwise."""
    z = np.array([[np.nan if v is None else v for v in row] for row in trace.get("z") or ()],
                 dtype=np.float64)
    x = np.asarray(trace.get("x", ()), dtype=np.float64)
    if not z.size or not np.isfinite(z).any() or len(x) != z.shape[1]:
        return ""
    lo, hi = np.nanmin(z), np.nanmax(z)
    level = np.nan_to_num((z - lo) / ((hi - lo) or 1.0) * (len(_RAMP) - 1))
    i = np.minimum(level.astype(np.int64), len(_RAMP) - 2)
    rgb = _RAMP[i] + (_RAMP[i + 1] - _RAMP[i]) * (level - i)[..., None]
    alpha = np.where(np.isfinite(z), 255, 0)[..., None]
    pixels = np.concatenate([np.round(rgb), alpha], axis=2).astype(np.uint8)
    step = (x[-1] - x[0]) / (len(x) - 1) if len(x) > 1 else 1.0
    (left, right), (top, bottom) = axes.px(np.array([x[0] - step / 2, x[-1] + step / 2]),
                                          np.array([-0.5, z.shape[0] - 0.5]))
    if top > bottom:                      # row 0 at the bottom: the image's first row last
        pixels, top, bottom = pixels[::-1], bottom, top
    data = base64.b64encode(_png(pixels)).decode("ascii")
    return (f'<image x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" '
            f'height="{bottom - top:.1f}" preserveAspectRatio="none" '
            f'image-rendering="optimizeSpeed" style="image-rendering:pixelated" '
            f'href="data:image/png;base64,{data}"><title>'
            f'{escape(str(trace.get("name", "")))}</title></image>')


def _png(pixels: np.ndarray) -> bytes:
    """``pixels`` (rows x columns x RGBA, uint8) as a PNG file."""
    height, width = pixels.shape[:2]
    raw = b"".join(b"\x00" + row.tobytes() for row in pixels)

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + tag + body
                + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6,
                                                                0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _trace_svg(trace: dict[str, Any], axes: _Axes, x: np.ndarray, y: np.ndarray,
               below: tuple[np.ndarray, np.ndarray]) -> str:
    if trace.get("type") == "heatmap":
        return _heatmap_svg(trace, axes)
    if not len(x):
        return ""
    px, py = axes.px(x, y)
    color, extra = _stroke(trace)
    name = escape(str(trace.get("name", "")))
    if trace.get("fill") == "tonexty" and len(below[0]):     # a band: filled down to `below`
        bx, by = axes.px(*below)
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in
                          zip([*px, *bx[::-1]], [*py, *by[::-1]], strict=True))
        return (f'<polygon fill="{escape(str(trace.get("fillcolor", color)))}" stroke="none" '
                f'points="{points}"><title>{name}</title></polygon>')
    if "lines" in trace.get("mode", "lines"):
        points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
        return (f'<polyline fill="none" stroke="{color}" {extra} stroke-linejoin="round" '
                f'stroke-opacity="{trace.get("opacity", 1)}" points="{points}">'
                f"<title>{name}</title></polyline>")
    return "".join(f'<path d="M{a - 4:.1f},{b - 4:.1f}l8,8m0,-8l-8,8" stroke="{color}" '
                   f'stroke-width="2"><title>{name}</title></path>' for a, b in zip(px, py,
                                                                                  strict=True))


def figure_svg(figure: dict[str, Any]) -> str:
    """The figure (``{"data": [...], "layout": {...}}``, numpy arrays or lists) as SVG text."""
    layout = figure.get("layout", {})
    data = figure.get("data", [])
    shown = sorted((t for t in data if t.get("showlegend", True) and t.get("name")
                    and len(t.get("y", ()))), key=lambda t: t.get("legendrank", 1000))
    legend_w = 40 + 6.2 * max((len(str(t["name"])) for t in shown), default=0)
    frame = _Frame(layout, legend_w if shown else 0)
    ynames = {t.get("yaxis", "y") for t in data}
    logs = {y: layout.get("yaxis" + y[1:], {}).get("type") == "log" for y in ynames}
    arrays = [_arrays(t, logs[t.get("yaxis", "y")]) for t in data]
    xs = [x for x, _ in arrays if len(x)]
    date = layout.get("xaxis", {}).get("type") == "date"     # ms: the span drawn, no 0
    lo = min([*([] if date and xs else [0.0]), *(float(x.min()) for x in xs)])
    hi = max([*([] if date and xs else [10.0]), *(float(x.max()) for x in xs)])  # steps 0-10
    axes = {y: _Axes(layout, "yaxis" + y[1:], frame, (lo, hi)) for y in sorted(ynames)}
    for y, ax in axes.items():
        ax.fit([a[1] for t, a in zip(data, arrays, strict=True) if t.get("yaxis", "y") == y])
    height = frame.height
    # The page's width, not a fixed one: drawn in WIDTH units, the viewBox scales it and keeps
    # its aspect (an <img> of it, as nbconvert and GitHub show SVG, also fills the page).
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" '
           f'viewBox="0 0 {WIDTH} {height:.0f}" class="nbdist-static-figure">',
           f'<rect width="{WIDTH}" height="{height:.0f}" fill="white"/>']
    title = (layout.get("title") or {}).get("text", "")
    if title:
        out.append(f'<text x="6" y="18" font-size="14" fill="#222" {_FONT}>{_rich(title)}</text>')
    for ann in layout.get("annotations", ()):
        x, y = frame.px(ann.get("x", 0), ann.get("y", 1))
        anchor = {"left": "start", "right": "end"}.get(ann.get("xanchor"), "middle")
        y += (-5 if ann.get("yanchor", "bottom") == "bottom" else 12) - ann.get("yshift", 0)
        font = ann.get("font") or {}
        size, color = font.get("size", 12), font.get("color", "#222")
        lines = str(ann.get("text", "")).split("<br>")
        for i, line in enumerate(lines):
            out.append(f'<text x="{x:.1f}" y="{y - (len(lines) - 1 - i) * (size + 3):.1f}" '
                       f'font-size="{size}" fill="{color}" text-anchor="{anchor}" {_FONT}>'
                       f"{_rich(line)}</text>")
    for ax in axes.values():
        out += ax.frame()
    below = (np.empty(0), np.empty(0))
    for trace, (x, y) in zip(data, arrays, strict=True):
        out.append(_trace_svg(trace, axes[trace.get("yaxis", "y")], x, y, below))
        below = (x, y)
    out += _legend(shown, frame.right + 14, frame.top + 8)
    out.append("</svg>")
    return "\n".join(s for s in out if s)


def _legend(traces: list[dict[str, Any]], x: float, y: float) -> list[str]:
    out = []
    for trace in traces:
        color, extra = _stroke(trace)
        sample = (f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="26" height="10" '
                  f'fill="{escape(str(trace["fillcolor"]))}"/>' if trace.get("fillcolor") else
                  f'<line x1="{x:.0f}" x2="{x + 26:.0f}" y1="{y - 4:.0f}" y2="{y - 4:.0f}" '
                  f'stroke="{color}" {extra}/>' if "lines" in trace.get("mode", "lines")
                  else f'<path d="M{x + 9:.0f},{y - 8:.0f}l8,8m0,-8l-8,8" stroke="{color}" '
                       'stroke-width="2"/>')
        out.append(f'{sample}<text x="{x + 32:.0f}" y="{y:.0f}" font-size="11" {_FONT}>'
                   f"{escape(str(trace['name']))}</text>")
        y += 17
    return out
