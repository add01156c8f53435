// nbdist's live figure (an anywidget view; see livefigure.py). plotly.js is not in this
// module: it is loaded once per page, from nbdist's JupyterLab extension when it is there
// (JupyterLab 4, Notebook 7: `globalThis.nbdistPlotly`), else from plotly's CDN (VS Code,
// Colab...). So the saved widget state holds this small module and the figure's data only.

function loadPlotly(cdn) {
  const g = globalThis;
  if (g.Plotly && g.Plotly.newPlot) return Promise.resolve(g.Plotly);
  if (typeof g.nbdistPlotly === "function") return g.nbdistPlotly();
  if (!g.__nbdistPlotlyCdn) {
    g.__nbdistPlotlyCdn = new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = cdn;
      script.onload = () => resolve(g.Plotly);
      script.onerror = () => reject(new Error(`could not load plotly.js from ${cdn}`));
      document.head.appendChild(script);
    });
  }
  return g.__nbdistPlotlyCdn;
}

// The page's theme, followed live. JupyterLab's dark themes (and VS Code's) draw the figure
// on a transparent background in the theme's own colours (its CSS variables); light pages
// show the figure as the kernel sent it. `themeUpdate` says every themed property as a
// relayout (back to the kernel's values in a light theme), so a switch redraws in place.
export function pageTheme(doc = globalThis.document) {
  const body = doc && doc.body;
  if (!body) return null;
  const dark = body.dataset.jpThemeLight === "false" || body.classList.contains("vscode-dark");
  if (!dark) return null;
  const css = globalThis.getComputedStyle ? globalThis.getComputedStyle(body) : null;
  const read = (name, fallback) => (css && css.getPropertyValue(name).trim()) || fallback;
  return {
    fg: read("--jp-ui-font-color1", "#d4d4d4"), muted: read("--jp-ui-font-color2", "#a0a0a0"),
    bg: read("--jp-layout-color1", "#212121"), grid: read("--jp-border-color2", "#444"),
    border: read("--jp-border-color1", "#616161"),
    // plotly draws the active and hovered button #F4FAFF whatever the theme: the buttons
    // stay light, labelled in the theme's inverse (dark) text colour
    button: read("--jp-inverse-layout-color3", "#bdbdbd"),
    buttonText: read("--jp-ui-inverse-font-color1", "rgba(0,0,0,.8)"),
  };
}

const DARK_LINES = new Set(["#111111", "#555555", "#000000", "black"]);

// a trace's line colour in `theme`, from the kernel's colour `color`
function lineColor(color, theme) {
  return theme && DARK_LINES.has(String(color).toLowerCase()) ? theme.fg : color;
}

export function themedTraces(traces, theme) {
  return traces.map(t => {
    const color = t.line && lineColor(t.line.color, theme);
    return color && color !== t.line.color ? { ...t, line: { ...t.line, color } } : t;
  });
}

// The figure's theme: the page's, followed across theme switches. It remembers the kernel's
// layout and line colours, so a switch back to a light theme restores them.
function makeThemer(div, layout) {
  let Plotly = null, theme = pageTheme();
  const colors = [];              // the kernel's line colour of each kernel trace
  return {
    ready(P) { Plotly = P; },
    // kernel traces as drawn in the current theme
    traces(traces) {
      for (const t of traces) colors.push(t.line ? t.line.color : undefined);
      return themedTraces(traces, theme);
    },
    layout() { return withUpdate(layout, themeUpdate(layout, theme)); },
    async apply() {
      theme = pageTheme();
      await Plotly.relayout(div, themeUpdate(layout, theme));
      const idx = [], values = [];
      colors.forEach((c, i) => {
        if (c !== undefined && DARK_LINES.has(String(c).toLowerCase())) {
          idx.push(i);
          values.push(lineColor(c, theme));
        }
      });
      if (idx.length) await Plotly.restyle(div, { "line.color": values }, idx);
    },
  };
}

function lookup(obj, path) {
  return path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);
}

// {relayout key: value} of every themed property of `layout` (the kernel's), in `theme`
// (null: the kernel's own values; null values reset to plotly's defaults).
export function themeUpdate(layout, theme) {
  const out = {};
  const set = (key, themed, path = key) => {
    const own = lookup(layout, path);
    out[key] = theme ? themed : (own === undefined ? null : own);
  };
  const t = theme || {};
  set("paper_bgcolor", "rgba(0,0,0,0)");
  set("plot_bgcolor", "rgba(0,0,0,0)");
  set("font.color", t.fg);
  set("legend.font.color", t.fg);
  set("title.font.color", t.fg);
  set("hoverlabel.bgcolor", t.bg);
  set("hoverlabel.bordercolor", t.border);
  set("hoverlabel.font.color", t.fg);
  set("modebar.bgcolor", "rgba(0,0,0,0)");
  set("modebar.color", t.muted);
  set("modebar.activecolor", t.fg);
  for (const [name, axis] of Object.entries(layout)) {
    if (!/^[xy]axis\d*$/.test(name) || !axis) continue;
    for (const prop of ["gridcolor", "linecolor", "zerolinecolor"]) {
      set(`${name}.${prop}`, t.grid);
    }
  }
  (layout.annotations || []).forEach((a, i) => {       // the notes line is muted
    set(`annotations[${i}].font.color`, a.name === "notes" ? t.muted : t.fg,
        `annotations.${i}.font.color`);
  });
  (layout.updatemenus || []).forEach((_, i) => {
    set(`updatemenus[${i}].bgcolor`, t.button, `updatemenus.${i}.bgcolor`);
    set(`updatemenus[${i}].bordercolor`, t.border, `updatemenus.${i}.bordercolor`);
    set(`updatemenus[${i}].font.color`, t.buttonText, `updatemenus.${i}.font.color`);
  });
  return out;
}

// `layout` with a relayout `update` applied (for the first draw: one draw, no flash).
export function withUpdate(layout, update) {
  const out = JSON.parse(JSON.stringify(layout));
  for (const [key, value] of Object.entries(update)) {
    const parts = key.replace(/\[(\d+)\]/g, ".$1").split(".");
    let o = out;
    for (const p of parts.slice(0, -1)) o = o[p] = o[p] && typeof o[p] === "object" ? o[p] : {};
    if (value === null) delete o[parts[parts.length - 1]];
    else o[parts[parts.length - 1]] = value;
  }
  return out;
}

// Calls `onChange` after each theme switch of the page (JupyterLab sets these attributes once
// the new theme's CSS is loaded); returns the function that stops watching.
export function watchTheme(onChange, doc = globalThis.document) {
  if (!doc || !doc.body || typeof MutationObserver === "undefined") return () => {};
  const observer = new MutationObserver(() => onChange());
  observer.observe(doc.body, { attributes: true, attributeFilter: [
    "data-jp-theme-light", "data-jp-theme-name", "class"] });
  return () => observer.disconnect();
}

// No control of the figure sends its data off the machine (plotly.js 4 offers "Share
// chart..." to Plotly Cloud by default); the kernel's config (panels.PLOTLY_CONFIG) comes first.
const LOCAL_ONLY = { showSendToCloud: false, plotlyServerURL: "" };

export function plotConfig(config) {
  const remove = new Set([...((config || {}).modeBarButtonsToRemove || []),
                          "sendChartToCloud", "sendDataToCloud", "editInChartStudio"]);
  return { displaylogo: false, ...(config || {}), ...LOCAL_ONLY,
           modeBarButtonsToRemove: [...remove] };
}

// A restyle value: {buffer: i} is the i-th binary buffer (float64), anything else is JSON.
function decode(value, buffers) {
  if (value && typeof value === "object" && "buffer" in value) {
    const view = buffers[value.buffer];
    const bytes = view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength);
    return new Float64Array(bytes);
  }
  return value;
}

// Messages are coalesced: a restyle carries each trace's whole series, so only the latest
// value per (trace, property) is drawn, once per animation frame. Drawing every message as it
// comes would queue work faster than a busy page draws it and starve its clicks (Stop).
function makeQueue(div, smoother, themer) {
  let Plotly = null, scheduled = false, busy = false;
  let added = [];                 // traces to add, in order
  let weight = null;              // a new smoothing weight to apply
  let pending = new Map();        // trace index -> {prop: value}
  let retheme = false;            // the page's theme changed
  async function flush() {
    scheduled = false;
    if (!Plotly || busy) return;
    busy = true;
    try {
      const traces = added, updates = pending, smoothing = weight, theme = retheme;
      added = [];
      pending = new Map();
      weight = null;
      retheme = false;
      if (theme) {
        await themer.apply();
        await smoother.restyled();      // the faint copies take the lines' new colours
      }
      if (traces.length) await smoother.added(themer.traces(traces));
      const n = smoother.base;
      const byProps = new Map();      // one restyle per set of properties
      for (const [t, props] of updates) {
        if (t >= n) continue;
        const key = Object.keys(props).sort().join(",");
        if (!byProps.has(key)) byProps.set(key, { traces: [], values: [] });
        byProps.get(key).traces.push(t);
        byProps.get(key).values.push(smoother.smooth(t, props));
      }
      for (const { traces: idx, values } of byProps.values()) {
        const update = {};
        for (const prop of Object.keys(values[0])) update[prop] = values.map(v => v[prop]);
        await Plotly.restyle(div, update, idx);
      }
      if (updates.size) await smoother.changed(updates);
      if (smoothing !== null) await smoother.set(smoothing);
      await readableLogTicks();
    } catch (err) {
      console.error("nbdist live figure:", err);
    } finally {
      busy = false;
      if (added.length || pending.size || weight !== null || retheme) schedule();
    }
  }
  // Log axes: 1-2-5 in each decade, or decades only once an axis spans more than 2.5 of
  // them (panels.log_dtick): never a crowd of labels. plotly writes autoranges to layout.
  async function readableLogTicks() {
    const update = {};
    for (const [name, axis] of Object.entries(div.layout || {})) {
      if (!name.startsWith("yaxis") || axis.type !== "log" || !axis.range) continue;
      const dtick = Math.abs(axis.range[1] - axis.range[0]) > 2.5 ? 1 : "D2";
      if (axis.dtick !== dtick) update[`${name}.dtick`] = dtick;
    }
    if (Object.keys(update).length) await Plotly.relayout(div, update);
  }
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    (globalThis.requestAnimationFrame || (f => setTimeout(f, 16)))(() => void flush());
  }
  return {
    ready(P) { Plotly = P; schedule(); },
    smooth(w) { weight = w; schedule(); },
    retheme() { retheme = true; schedule(); },
    push(msg, buffers) {
      if (msg.type === "add_traces") {
        added.push(...msg.traces);
      } else if (msg.type === "restyle") {
        msg.traces.forEach((t, i) => {
          const props = pending.get(t) || {};
          for (const [prop, values] of Object.entries(msg.props)) {
            props[prop] = decode(values[i], buffers);
          }
          pending.set(t, props);
        });
      }
      schedule();
    },
  };
}

// TensorBoard's smoothing: a debiased exponential moving average, NaN points skipped.
export function ema(y, weight) {
  const out = new Float64Array(y.length);
  let last = 0, n = 0;
  for (let i = 0; i < y.length; i++) {
    const v = y[i];
    if (v === null || !Number.isFinite(v)) { out[i] = NaN; continue; }
    n += 1;
    last = last * weight + (1 - weight) * v;
    out[i] = Number((last / (1 - Math.pow(weight, n))).toPrecision(12));  // a flat line stays flat
  }
  return out;
}

// plotly's typed-array JSON ({dtype, bdata: base64}) as a typed array; other values as they are.
const TYPED = { f8: Float64Array, f4: Float32Array, i4: Int32Array, u4: Uint32Array,
                i2: Int16Array, u2: Uint16Array, i1: Int8Array, u1: Uint8Array };
function typed(value) {
  if (!value || typeof value !== "object" || !("bdata" in value)) return value;
  const bytes = Uint8Array.from(atob(value.bdata), c => c.charCodeAt(0));
  return new (TYPED[value.dtype] || Float64Array)(bytes.buffer);
}

// Smoothing: the kernel's traces keep indices [0, base) and, for lines, show the smoothed
// values; each line's raw values are drawn faint after them (no legend, no hover). Off at 0.
function makeSmoother(div) {
  let Plotly = null, weight = 0;
  const raw = [];                 // per kernel trace: {x, y, line}
  const copies = [];              // copies[j] = index of the kernel trace drawn raw at base + j
  const base = () => raw.length;
  function keep(traces) {
    for (const t of traces) raw.push({ x: typed(t.x) || [], y: typed(t.y) || [],
                                       line: t.mode === "lines" });
  }
  async function sync() {
    if (copies.length) await Plotly.deleteTraces(div, copies.map((_, j) => base() + j));
    copies.length = 0;
    const lines = [];
    raw.forEach((r, i) => { if (r.line) lines.push(i); });
    if (!lines.length) return;
    await Plotly.restyle(div, { y: lines.map(i => weight ? ema(raw[i].y, weight) : raw[i].y) },
                         lines);
    if (!weight) return;
    const faint = lines.map(i => {
      const t = div.data[i];
      copies.push(i);
      return { type: "scatter", mode: "lines", name: t.name, legendgroup: t.legendgroup,
               showlegend: false, hoverinfo: "skip", xaxis: t.xaxis, yaxis: t.yaxis,
               line: t.line, opacity: 0.2, x: raw[i].x, y: raw[i].y };
    });
    await Plotly.addTraces(div, faint);
  }
  return {
    ready(P, traces) { Plotly = P; keep(traces); },
    get base() { return base(); },
    async set(w) { weight = w; await sync(); },
    async restyled() { if (weight) await sync(); },
    // new kernel traces go before the raw copies
    async added(traces) {
      const at = traces.map((_, j) => base() + j);
      keep(traces);
      await Plotly.addTraces(div, traces, at);
      if (weight) await sync();
    },
    // a kernel update of trace i: remember the raw values, draw them smoothed
    smooth(i, props) {
      if (i >= raw.length) return props;
      if ("x" in props) raw[i].x = props.x;
      if ("y" in props) raw[i].y = props.y;
      return weight && raw[i].line && "y" in props ? { ...props, y: ema(props.y, weight) } : props;
    },
    async changed(indices) {
      const js = [], ys = [], xs = [];
      copies.forEach((i, j) => {
        if (!indices.has(i)) return;
        js.push(base() + j);
        xs.push(raw[i].x);
        ys.push(raw[i].y);
      });
      if (js.length) await Plotly.restyle(div, { x: xs, y: ys }, js);
    },
  };
}

const SMOOTHING_KEY = "nbdist.dashboard.smoothing";

function smoothingControl(onChange) {
  const bar = document.createElement("div");
  bar.className = "nbdist-figure-controls";
  bar.style.cssText = "display:flex;justify-content:flex-end;align-items:center;gap:6px;" +
    "font:12px sans-serif;color:var(--jp-ui-font-color2, #444);padding:2px 8px 0 0";
  const label = document.createElement("label");
  label.textContent = "Smoothing";
  const slider = document.createElement("input");
  Object.assign(slider, { type: "range", min: "0", max: "0.99", step: "0.01",
                          className: "nbdist-smoothing",
                          title: "Exponential moving average of every line (as in " +
                                 "TensorBoard); the raw line stays, faint. 0: off" });
  slider.style.width = "140px";
  const value = document.createElement("span");
  value.style.cssText = "min-width:2.5em;font-variant-numeric:tabular-nums";
  let saved = 0;
  try { saved = Number(globalThis.localStorage?.getItem(SMOOTHING_KEY)) || 0; } catch (e) { }
  slider.value = String(saved);
  value.textContent = saved.toFixed(2);
  label.htmlFor = slider.id = `nbdist-smoothing-${Math.random().toString(36).slice(2)}`;
  slider.addEventListener("input", () => {
    const w = Number(slider.value);
    value.textContent = w.toFixed(2);
    try { globalThis.localStorage?.setItem(SMOOTHING_KEY, String(w)); } catch (e) { }
    onChange(w);
  });
  bar.append(label, slider, value);
  return { bar, initial: saved };
}

// Save `data` (a binary buffer from the kernel) as the file `name`, in the browser.
function download(name, data) {
  const url = URL.createObjectURL(new Blob([data], { type: "text/csv" }));
  const link = Object.assign(document.createElement("a"), { href: url, download: name });
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

// plotly.js' drawing calls on `div`, doing nothing once the view is gone: a message, a
// resize or a theme switch that comes after `purge` must not draw into a purged div (plotly
// throws reading its traces).
function guarded(Plotly, div, isOpen) {
  const out = {};
  for (const name of ["restyle", "relayout", "addTraces", "deleteTraces"]) {
    out[name] = (...args) => (isOpen() && Array.isArray(div.data)
      ? Plotly[name](...args) : Promise.resolve());
  }
  return out;
}

async function render({ model, el }) {
  const div = document.createElement("div");
  div.className = "nbdist-live-figure nbdist-plot";
  div.style.width = "100%";
  const fig = model.get("figure");
  const smoother = makeSmoother(div);
  const themer = makeThemer(div, fig.layout);
  // the kernel keeps the slider's value: the figure left in the notebook when the run ends
  // is drawn with the same smoothing
  const smooth = w => {
    queue.smooth(w);
    model.set("smoothing", w);
    model.save_changes();
  };
  const control = smoothingControl(smooth);
  el.append(control.bar, div);
  // messages that arrive while plotly.js loads wait
  const queue = makeQueue(div, smoother, themer);
  let open = true;
  const onMessage = (msg, buffers) => {
    if (msg.type === "csv") download(msg.name, buffers[0]);
    else if (msg.type === "csv_error") console.warn("nbdist: no CSV of the run:", msg.message);
    else queue.push(msg, buffers);
  };
  model.on("msg:custom", onMessage);
  let Plotly = null;
  try {
    Plotly = await loadPlotly(model.get("cdn"));
  } catch (err) {
    div.textContent = `nbdist: the live figure needs plotly.js (${err.message}); the ` +
      "final figure is drawn here when the run ends.";
    return () => model.off("msg:custom", onMessage);
  }
  // The output area's width, followed: plotly measures once (700 px when the view is not
  // attached yet) and then only on window resizes, while the output area also changes with
  // side panels. The height stays the figure's (it depends on the panels drawn).
  const width = () => Math.floor(div.getBoundingClientRect().width);
  const config = plotConfig(fig.config);
  if (model.get("can_download")) {      // the kernel answers while the run goes on
    config.modeBarButtonsToAdd = [{
      name: "nbdistCsv", title: "Download the run's data as CSV (run.metrics, every row)",
      icon: Plotly.Icons && Plotly.Icons.disk, click: () => model.send({ type: "csv" }) }];
  }
  await Plotly.newPlot(div, themer.traces(fig.data),
                       { ...themer.layout(), width: width() || undefined }, config);
  const drawing = guarded(Plotly, div, () => open);
  let last = width();
  const resize = new ResizeObserver(() => {
    const w = width();
    if (w && Math.abs(w - last) > 1) {
      last = w;
      void drawing.relayout(div, { width: w });
    }
  });
  resize.observe(div);
  const unwatch = watchTheme(() => queue.retheme());
  themer.ready(drawing);
  smoother.ready(drawing, fig.data);
  queue.ready(drawing);
  if (control.initial) smooth(control.initial);
  return () => {
    open = false;
    unwatch();
    resize.disconnect();
    model.off("msg:custom", onMessage);
    Plotly.purge(div);
  };
}

export default { render };
