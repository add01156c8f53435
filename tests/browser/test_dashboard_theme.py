"""The dashboard in JupyterLab's light and dark themes, switched while a run goes on: a
finished and a live dashboard on the page follow each switch (hover box, loss toggle, global
loss line readable), the mode bar has no upload control and downloads the run's rows as CSV,
a save mid-run keeps a recent picture, and the browser console stays clean through the run
and its end.
Screenshots: test-artifacts/dashboard-theme-{light,dark,light-again}.png."""

import json
import re
import time
from pathlib import Path

from labhelpers import (
    COUNT_POINTS,
    LAST_CELL_RUNNING,
    MIRRORED_SETUP,
    RUN_ALL_NOWAIT,
    dismiss_news,
    shot,
    step_cell,
    write_notebook,
)

LIVE_STEPS = 100_000      # Stop ends it

CELLS = [*MIRRORED_SETUP, step_cell(60), step_cell(LIVE_STEPS)]
FINISHED, LIVE = len(CELLS) - 2, len(CELLS) - 1
LIVE_PICTURE = "application/vnd.nbdist.live-picture.v1+json"

# The header's step and steps/s.
HEADER = """() => {
    const e = document.querySelector('.nbdist-dashboard .nbdist-header');
    const m = e && e.innerText.match(/step (\\d+)\\/\\d+[^]*?([\\d.]+) steps\\/s/);
    return m ? [Number(m[1]), Number(m[2])] : null;
}"""

# The colours a reader sees on a figure: the hover box (after the caller hovered the loss
# panel), the loss toggle's buttons, the global loss line; each with what is behind it.
COLOURS = """plot => {
    const css = e => getComputedStyle(e);
    const behind = e => {       // the first ancestor with a background of its own
        for (let p = e.parentElement; p; p = p.parentElement) {
            const c = css(p).backgroundColor;
            if (c && c !== 'transparent' && !/rgba\\(.*, 0\\)$/.test(c)) return c;
        }
        return 'rgb(255, 255, 255)';
    };
    const page = behind(plot);
    const box = plot.querySelector('.hoverlayer .legend rect.bg');
    const hover = box && {
        bg: css(box).fill, opacity: css(box).fillOpacity,
        texts: [...plot.querySelectorAll('.hoverlayer .legend text')]
            .filter(t => t.textContent.trim()).map(t => [t.textContent, css(t).fill])};
    const buttons = [...plot.querySelectorAll('.updatemenu-button')].map(b => ({
        label: b.querySelector('.updatemenu-item-text').textContent,
        text: css(b.querySelector('.updatemenu-item-text')).fill,
        bg: css(b.querySelector('.updatemenu-item-rect')).fill}));
    const loss = plot._fullData.filter(t => t.yaxis === 'y' && t.mode === 'lines')
        .sort((a, b) => b.line.width - a.line.width)[0];
    return {page, hover, buttons, loss: loss && [loss.name, loss.line.color],
            theme: document.body.dataset.jpThemeName};
}"""

# The mode bar's buttons (shown while the pointer is over the figure).
MODEBAR = """plot => [...plot.querySelectorAll('.modebar-btn')].map(
    b => b.getAttribute('data-title'))"""


def _rgba(text: str) -> tuple[float, float, float, float]:
    """A CSS colour ("#rrggbb", "rgb(...)", "rgba(...)") as r, g, b (0-255), alpha (0-1)."""
    if text.startswith("#"):
        return (*(int(text[i:i + 2], 16) for i in (1, 3, 5)), 1.0)
    nums = [float(n) for n in re.findall(r"[\d.]+", text)]
    return (*nums[:3], nums[3] if len(nums) > 3 else 1.0)


def _over(top: str, below: str, opacity: float = 1.0) -> str:
    """``top`` drawn with its alpha (times ``opacity``) over the opaque ``below``."""
    r, g, b, a = _rgba(top)
    r0, g0, b0, _ = _rgba(below)
    a *= opacity
    return "rgb({}, {}, {})".format(*(round(c * a + c0 * (1 - a)) for c, c0 in
                                      ((r, r0), (g, g0), (b, b0))))


def contrast(fg: str, bg: str) -> float:
    """WCAG contrast ratio of two opaque colours."""
    def lum(c: str) -> float:
        chans = [v / 255 for v in _rgba(c)[:3]]
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in chans]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(fg), lum(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _readable(page, cell, what: str) -> dict:
    """Hover the loss panel of ``cell``'s figure; check every colour a reader needs. The
    hover box stays (for the screenshot)."""
    page.mouse.move(5, 5)
    plot = cell.locator(".js-plotly-plot").first
    plot.scroll_into_view_if_needed()
    drag = plot.locator(".nsewdrag").first
    box = drag.bounding_box()
    # a redraw of the live figure can drop its hover box: move again until one shows
    deadline = time.monotonic() + 30
    for i in range(1000):
        page.mouse.move(box["x"] + box["width"] * 0.6 + i % 5, box["y"] + box["height"] / 2)
        time.sleep(0.3)
        if plot.evaluate("p => !!p.querySelector('.hoverlayer .legend text')"):
            break
        assert time.monotonic() < deadline, f"no hover box on the {what} figure"
    seen = plot.evaluate(COLOURS)
    print(what, json.dumps(seen))
    hover = seen["hover"]
    bg = _over(hover["bg"], seen["page"], float(hover["opacity"]))
    for text, fill in hover["texts"]:
        ratio = contrast(_over(fill, bg), bg)
        assert ratio >= 4.5, (what, seen["theme"], text, fill, bg, ratio)
    # the loss panel's linear/log and expand buttons, then every other panel's: all readable
    assert [b["label"] for b in seen["buttons"]][:3] == ["loss: linear", "log", "⤢ expand"], \
        seen["buttons"]
    for b in seen["buttons"]:
        back = _over(b["bg"], seen["page"])
        assert contrast(_over(b["text"], back), back) >= 4.5, (what, seen["theme"], b)
    name, colour = seen["loss"]
    # a line is a graphic: 3:1 against the page (WCAG 1.4.11)
    assert contrast(_over(colour, seen["page"]), seen["page"]) >= 3, (what, name, colour)
    return seen


def _theme(page, name: str) -> None:
    light = "true" if "Light" in name else "false"
    page.evaluate(f"() => window.jupyterapp.commands.execute('apputils:change-theme', "
                  f"{{theme: '{name}'}})")
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{light}'",
                           timeout=30_000)
    time.sleep(1.0)     # the figures redraw on the next animation frame


def test_dashboards_follow_the_theme_save_a_recent_picture_and_log_no_error(
        lab_server, lab_page):
    errors: list[str] = []

    def error(text: str) -> None:
        print("console error:", text)
        errors.append(text)

    lab_page.on("console", lambda m: m.type == "error" and error(m.text))
    lab_page.on("pageerror", lambda err: error(str(err)))
    name = write_notebook(lab_server["dir"], "theme.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.set_viewport_size({"width": 1400, "height": 1600})
    dismiss_news(page)
    page.evaluate(RUN_ALL_NOWAIT)
    cells = page.locator(".jp-Notebook .jp-Cell")
    finished, live = cells.nth(FINISHED), cells.nth(LIVE)
    finished.locator(".nbdist-figure .js-plotly-plot").wait_for(timeout=180_000)
    page.wait_for_function(f"() => ({COUNT_POINTS})() > 20", timeout=120_000)
    assert page.evaluate(LAST_CELL_RUNNING)

    # No control sends the figure off the machine; zoom, pan, reset and PNG stay.
    for cell in (live, finished):
        cell.locator(".nsewdrag").first.hover()
        titles = cell.locator(".js-plotly-plot").first.evaluate(MODEBAR)
        print("mode bar:", titles)
        assert not [t for t in titles if "Share" in t or "Cloud" in t or "Studio" in t]
        assert {"Zoom", "Pan", "Reset axes", "Download plot as a PNG"} <= set(titles), titles

    # Saved mid-run (Ctrl+S), the file's picture is a few seconds old at most.
    time.sleep(8)
    step, rate = page.evaluate(HEADER)
    page.keyboard.press("Control+s")
    saved, deadline = None, time.monotonic() + 30
    while saved is None and time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            nb = json.loads((lab_server["dir"] / name).read_text())
        except json.JSONDecodeError:        # read while the server writes it
            continue
        for out in nb["cells"][LIVE]["outputs"]:
            saved = out.get("data", {}).get(LIVE_PICTURE, saved)
    age = (step - saved["step"]) / rate
    print(f"saved at step {step} ({rate} steps/s): the picture of step {saved['step']}, "
          f"{age:.1f} s old")
    assert age <= 10, (step, rate, saved)

    seen = {}
    for theme, shot_name in (("JupyterLab Dark", "dark"), ("JupyterLab Light", "light-again")):
        if not seen:
            seen["light"] = (_readable(page, live, "live"), _readable(page, finished, "final"))
            shot(page, "dashboard-theme-light")
        _theme(page, theme)
        seen[shot_name] = (_readable(page, live, "live"), _readable(page, finished, "final"))
        shot(page, f"dashboard-theme-{shot_name}")
    # a switch redraws in place: back in light, the kernel's look again
    def look(seen):       # the colours (the values move on)
        return [(s["hover"]["bg"], sorted({fill for _, fill in s["hover"]["texts"]}),
                 [(b["text"], b["bg"]) for b in s["buttons"]], s["loss"][1]) for s in seen]
    assert look(seen["light-again"]) == look(seen["light"])
    assert look(seen["dark"])[0] != look(seen["light"])[0]

    # The live figure's CSV button: run.metrics' rows so far, from the kernel mid-run.
    step, _ = page.evaluate(HEADER)
    live.locator(".nsewdrag").first.hover()
    with page.expect_download(timeout=60_000) as download:
        live.locator(".modebar-btn[data-title^=\"Download the run's data as CSV\"]").click()
    lines = Path(download.value.path()).read_text().splitlines()
    print(f"CSV: {download.value.suggested_filename}, {len(lines) - 1} rows at step {step}",
          lines[:2])
    assert download.value.suggested_filename == "nbdist-run-2.csv"
    assert lines[0].startswith("step,epoch,replica,worker,loss,")
    assert len(lines) - 1 >= 2 * step       # a row per replica and step

    page.locator(".nbdist-dashboard button", has_text="Stop").click()
    page.wait_for_function(f"() => !({LAST_CELL_RUNNING})()", timeout=120_000)
    live.locator(".nbdist-figure .js-plotly-plot").wait_for(timeout=60_000)
    time.sleep(2)        # anything the ended live view would still draw
    print("console errors:", errors)
    assert errors == []
