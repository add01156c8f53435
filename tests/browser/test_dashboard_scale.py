"""The dashboard of 64 workers x 8 replicas in JupyterLab: synthetic rows from 64 simulated
workers (no TensorFlow) are appended to a Run in the kernel while the cell's main thread feeds
the dashboard, as a runner does. Above 16 series it draws median lines with 10-90% and min-max
bands, a worker x step heatmap, names the straggler and says why in one line. The cell keeps
the run live until the test has looked at it (a page slower than the run's 15 s used to find
only the finished run's static figure)."""

import time

from labhelpers import RUN_ALL_NOWAIT, dismiss_news, shot, shot_of, write_notebook

SEEN = "scale-seen.flag"   # the test has looked at the live dashboard: the run may finish
CELLS = ["""import os, threading, time
from nbdist.telemetry.run import Run, RunWriter
from nbdist.widgets.dashboard import Dashboard

W, R, RATE, STEPS = 64, 8, 20, 300      # ~15 s: time to look at it while it runs
run = Run(id=1, mode="step", strategy="multiworker", replicas=R, workers=W, total_steps=STEPS)
dash = Dashboard(get_ipython())

def produce():
    t0 = time.perf_counter()
    for step in range(STEPS):
        time.sleep(max(0.0, t0 + step / RATE - time.perf_counter()))
        for w in range(W):
            slow = [(w, r) == (37, 5) for r in range(R)]   # every other replica waits for it
            compute = [2.0 + (6.0 if s else 0.0) + 0.05 * (w % 7) + 0.1 * r
                       for r, s in enumerate(slow)]
            RunWriter(run).record_step(step, 0, worker=w, step_ms=12.0, data_ms=0.2,
                                       loss=[2.0 / (1 + 0.05 * step) + 0.02 * ((w * R + r) % 23)
                                  for r in range(R)],
                                       grad_norm=[1.0 + 0.01 * ((w + r) % 11) for r in range(R)],
                                       allreduce_ms=[1.5 + 0.01 * w] * R,
                                       wait_ms=[0.0 if s else 6.0 for s in slow],
                                       compute_ms=compute)

thread = threading.Thread(target=produce)
thread.start()
seen = 0
while thread.is_alive() or seen < run.n_rows:
    if run.n_rows != seen:
        seen = run.n_rows
        dash.on_step(run)
    time.sleep(0.005)
deadline = time.monotonic() + 120   # however slow the page was to show it
while not os.path.exists("scale-seen.flag") and time.monotonic() < deadline:
    time.sleep(0.05)
RunWriter(run).finish("done")
dash.close()"""]

FIGURE = """() => {
    const plot = document.querySelector('.nbdist-dashboard .nbdist-live-figure');
    if (!plot || !plot.data) return null;
    const drawn = sel => [...plot.querySelectorAll(sel)].filter(
        e => (e.getAttribute('d') || e.getAttribute('href') || '').length > 20).length;
    const heat = plot.data.find(t => t.type === 'heatmap');
    return {
        names: plot.data.map(t => t.name),
        heatRows: heat && heat.z ? heat.z.length : 0,
        heatCols: heat && heat.z && heat.z.length ? heat.z[0].length : 0,
        fills: drawn('.scatterlayer .trace path.js-fill'),
        heatImages: plot.querySelectorAll('.heatmaplayer image').length,
        text: [...plot.querySelectorAll('.annotation-text')].map(e => e.textContent),
        notes: document.querySelector('.nbdist-dashboard .nbdist-notes')?.innerText || '',
    };
}"""

OUTPUT_TEXT = """() => [...document.querySelectorAll('.jp-OutputArea-output')]
    .map(e => e.innerText.slice(0, 2000)).join('\\n---\\n')"""


def wait_for_live_figure(page, timeout: float = 90.0) -> dict:
    """The live figure once it shows the heatmap, both bands and the straggler; on a timeout
    the error shows what the page had (the figure, the cell's output)."""
    deadline = time.monotonic() + timeout
    fig = None
    while time.monotonic() < deadline:
        fig = page.evaluate(FIGURE)
        if fig and fig["heatCols"] >= 5 and fig["fills"] >= 8 and "worker 37" in fig["notes"]:
            return fig
        page.wait_for_timeout(250)
    output = page.evaluate(OUTPUT_TEXT)
    raise AssertionError(f"no live 64-worker figure after {timeout:.0f} s: figure {fig}, "
                         f"cell output {output!r}")


def test_64_workers_draw_bands_a_heatmap_and_say_so(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "scale.ipynb", CELLS)
    page = lab_page.open_notebook(name)
    page.evaluate(RUN_ALL_NOWAIT)
    fig = wait_for_live_figure(page)
    print("scale figure:", {k: fig[k] for k in ("heatRows", "heatCols", "fills", "notes")})
    assert {"median of replicas", "10-90% of replicas", "min-max of replicas"} <= set(
        fig["names"]), fig["names"]
    assert not any(n.startswith("w0/") for n in fig["names"])     # no line per replica
    assert fig["heatRows"] == 64 and fig["heatImages"] == 1, fig
    assert fig["fills"] >= 2 * 4        # two bands in each of loss, grad norm, all-reduce, time
    assert any("64 workers x 8 replicas: showing median, 10-90% and min-max bands; "
               "run.plot(per_replica=True) draws every line" in t for t in fig["text"]), fig
    assert "straggler: worker 37" in fig["notes"], fig["notes"]   # the one the others wait for
    dismiss_news(page)
    shot_of(page.locator(".nbdist-dashboard").first, "dashboard-64x8-live")
    page.locator(".nbdist-live-figure .heatmaplayer").first.scroll_into_view_if_needed()
    shot(page, "dashboard-64x8-heatmap")
    (lab_server["dir"] / SEEN).touch()
    # the finished run: the same views as a static figure in the cell's output
    page.wait_for_selector(".nbdist-static-figure, .js-plotly-plot:not(.nbdist-live-figure)",
                           timeout=60_000)
