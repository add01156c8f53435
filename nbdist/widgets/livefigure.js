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
function makeQueue(div) {
  let Plotly = null, scheduled = false, busy = false;
  let added = [];                 // traces to add, in order
  let pending = new Map();        // trace index -> {prop: value}
  async function flush() {
    scheduled = false;
    if (!Plotly || busy) return;
    busy = true;
    try {
      const traces = added, updates = pending;
      added = [];
      pending = new Map();
      if (traces.length) await Plotly.addTraces(div, traces);
      const n = div.data ? div.data.length : 0;
      const byProps = new Map();      // one restyle per set of properties
      for (const [t, props] of updates) {
        if (t >= n) continue;
        const key = Object.keys(props).sort().join(",");
        if (!byProps.has(key)) byProps.set(key, { traces: [], values: [] });
        byProps.get(key).traces.push(t);
        byProps.get(key).values.push(props);
      }
      for (const { traces: idx, values } of byProps.values()) {
        const update = {};
        for (const prop of Object.keys(values[0])) update[prop] = values.map(v => v[prop]);
        await Plotly.restyle(div, update, idx);
      }
    } catch (err) {
      console.error("nbdist live figure:", err);
    } finally {
      busy = false;
      if (added.length || pending.size) schedule();
    }
  }
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    (globalThis.requestAnimationFrame || (f => setTimeout(f, 16)))(() => void flush());
  }
  return {
    ready(P) { Plotly = P; schedule(); },
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

async function render({ model, el }) {
  const div = document.createElement("div");
  div.className = "nbdist-live-figure";
  div.style.width = "100%";
  el.appendChild(div);
  const queue = makeQueue(div);     // messages that arrive while plotly.js loads wait here
  let Plotly = null;
  const onMessage = (msg, buffers) => queue.push(msg, buffers);
  model.on("msg:custom", onMessage);
  try {
    Plotly = await loadPlotly(model.get("cdn"));
  } catch (err) {
    div.textContent = `nbdist: the live figure needs plotly.js (${err.message}); the ` +
      "final figure is drawn here when the run ends.";
    return () => model.off("msg:custom", onMessage);
  }
  const fig = model.get("figure");
  await Plotly.newPlot(div, fig.data, fig.layout, { responsive: true, displaylogo: false });
  queue.ready(Plotly);
  return () => {
    model.off("msg:custom", onMessage);
    Plotly.purge(div);
  };
}

export default { render };
