/**
 * A finished dashboard's own controls, as TensorBoard's scalars page has them: a smoothing
 * slider and the x axis (step, relative time, wall time). The kernel says what they need in
 * the figure's `layout.meta.nbdist` (nbdist/widgets/figure.py, `run_figure`): the smoothing it
 * drew, which trace is each smoothed line's raw copy, and when each step ended. The lines'
 * values are in the figure already, so the notebook holds no second copy of them. The live
 * figure has the same slider (nbdist/widgets/livefigure.js, which cannot import this bundle).
 */

/** `layout.meta.nbdist` of a dashboard figure. */
export type FigureMeta = {
  smoothing: number;
  lines: number[];
  raw: [number, number][];
  clock: { steps: number[]; seconds: number[]; started: number };
};

export type XMode = 'step' | 'time' | 'wall';

export const X_MODES: Record<XMode, string> = {
  step: 'step',
  time: 'relative time',
  wall: 'wall time'
};

/** TensorBoard's smoothing: a debiased exponential moving average, NaN points skipped. */
export function ema(y: ArrayLike<number | null>, weight: number): Float64Array {
  const out = new Float64Array(y.length);
  let last = 0;
  let n = 0;
  for (let i = 0; i < y.length; i++) {
    const v = y[i];
    if (v === null || !Number.isFinite(v)) {
      out[i] = NaN;
      continue;
    }
    n += 1;
    last = last * weight + (1 - weight) * v;
    out[i] = Number((last / (1 - Math.pow(weight, n))).toPrecision(12)); // flat stays flat
  }
  return out;
}

/** Linear interpolation of `x` in the increasing `xs` -> `ys`, clamped at both ends. */
export function interp(x: number, xs: number[], ys: number[]): number {
  if (!xs.length) {
    return NaN;
  }
  if (x <= xs[0]) {
    return ys[0];
  }
  if (x >= xs[xs.length - 1]) {
    return ys[ys.length - 1];
  }
  let lo = 0;
  let hi = xs.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xs[mid] <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const f = (x - xs[lo]) / (xs[hi] - xs[lo]);
  return ys[lo] + f * (ys[hi] - ys[lo]);
}

/** The local clock time of `seconds` since the epoch, as plotly's (zone-less) date axis reads. */
function localDate(seconds: number): string {
  const d = new Date(seconds * 1000);
  const pad = (v: number, n = 2) => String(v).padStart(n, '0');
  return (
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.` +
    pad(d.getMilliseconds(), 3)
  );
}

/** The x values of a trace drawn on steps `steps`, on the `mode` axis. */
export function xValues(
  steps: ArrayLike<number>,
  mode: XMode,
  clock: FigureMeta['clock']
): number[] | string[] {
  const xs = Array.from(steps);
  if (mode === 'step') {
    return xs;
  }
  const seconds = xs.map(s => interp(s, clock.steps, clock.seconds));
  return mode === 'time'
    ? seconds.map(s => Math.round(s * 1000) / 1000)
    : seconds.map(s => localDate(clock.started + s));
}

/** The x axis' relayout for `mode`; `stepAxis`: the kernel's step axis, restored on step. */
export function xAxisUpdate(mode: XMode, stepAxis: Record<string, any>): Record<string, any> {
  const step = mode === 'step';
  return {
    'xaxis.type': mode === 'wall' ? 'date' : 'linear',
    'xaxis.title.text': { step: 'step', time: 'seconds since the run started', wall: 'wall time' }[
      mode
    ],
    'xaxis.autorange': true,
    'xaxis.autorangeoptions': step ? (stepAxis.autorangeoptions ?? null) : null,
    'xaxis.rangemode': step ? (stepAxis.rangemode ?? null) : 'normal',
    'xaxis.tickformat': mode === 'wall' ? null : (stepAxis.tickformat ?? null),
    'xaxis.hoverformat': step ? (stepAxis.hoverformat ?? null) : mode === 'time' ? ',.3~f' : null
  };
}

const TYPED: Record<string, any> = {
  f8: Float64Array,
  f4: Float32Array,
  i4: Int32Array,
  u4: Uint32Array,
  i2: Int16Array,
  u2: Uint16Array,
  i1: Int8Array,
  u1: Uint8Array
};

/** plotly's typed-array JSON (`{dtype, bdata}`) as a typed array; arrays as they are. */
export function values(value: any): ArrayLike<number> {
  if (value && typeof value === 'object' && 'bdata' in value) {
    const bytes = Uint8Array.from(atob(value.bdata), c => c.charCodeAt(0));
    return new (TYPED[value.dtype] ?? Float64Array)(bytes.buffer);
  }
  return Array.isArray(value) || ArrayBuffer.isView(value) ? (value as ArrayLike<number>) : [];
}

type Plotly = {
  restyle: (div: HTMLElement, update: unknown, traces?: number[]) => Promise<unknown>;
  relayout: (div: HTMLElement, update: unknown) => Promise<unknown>;
  addTraces: (div: HTMLElement, traces: unknown) => Promise<unknown>;
};

/**
 * The controls bar of a dashboard figure drawn in `plot` from `figure` (the kernel's), or
 * null when the figure has no `layout.meta.nbdist` (a comparison: it has plotly's own).
 */
export function figureControls(
  plot: HTMLElement & { data?: any[] },
  figure: { data?: any[]; layout?: Record<string, any> },
  plotly: () => Plotly | null
): HTMLElement | null {
  const meta: FigureMeta | undefined = figure.layout?.meta?.nbdist;
  if (!meta || !meta.clock) {
    return null;
  }
  const data = figure.data ?? [];
  const rawOf = new Map<number, number>(meta.raw ?? []);
  const lines = meta.lines ?? [];
  const raw = new Map(lines.map(i => [i, values(data[rawOf.get(i) ?? i]?.y)]));
  const steps = data.map(t => values(t.x));
  const stepAxis = { ...(figure.layout?.xaxis ?? {}) };
  let copies = lines.map(i => rawOf.get(i) ?? -1).filter(i => i >= 0);

  const bar = document.createElement('div');
  bar.className = 'nbdist-figure-controls';
  bar.style.cssText =
    'display:flex;justify-content:flex-end;align-items:center;gap:6px;' +
    'font:12px sans-serif;color:var(--jp-ui-font-color2, #444);padding:2px 8px 0 0';
  const axisLabel = document.createElement('label');
  axisLabel.textContent = 'x axis';
  const select = document.createElement('select');
  select.className = 'nbdist-x-axis';
  for (const [mode, label] of Object.entries(X_MODES)) {
    select.appendChild(new Option(label, mode));
  }
  const label = document.createElement('label');
  label.textContent = 'Smoothing';
  const slider = Object.assign(document.createElement('input'), {
    type: 'range',
    min: '0',
    max: '0.99',
    step: '0.01',
    value: String(meta.smoothing || 0),
    className: 'nbdist-figure-smoothing',
    title: 'Exponential moving average of every line (as in TensorBoard); the raw line stays, faint. 0: off'
  });
  slider.style.width = '140px';
  const shown = document.createElement('span');
  shown.style.cssText = 'min-width:2.5em;font-variant-numeric:tabular-nums';
  shown.textContent = Number(slider.value).toFixed(2);
  const id = `nbdist-${Math.random().toString(36).slice(2)}`;
  select.id = `${id}-x`;
  axisLabel.htmlFor = select.id;
  slider.id = `${id}-s`;
  label.htmlFor = slider.id;
  bar.append(axisLabel, select, label, slider, shown);

  select.addEventListener('change', () => {
    const P = plotly();
    const mode = select.value as XMode;
    if (!P || !Array.isArray(plot.data)) {
      return;
    }
    const all = plot.data.map((_, i) => i);
    const xs = all.map(i => xValues(steps[copyOf(i)] ?? [], mode, meta.clock));
    void P.restyle(plot, { x: xs }, all).then(() => P.relayout(plot, xAxisUpdate(mode, stepAxis)));
  });
  // the kernel trace a trace index shows (a copy added here shows its line's raw values)
  function copyOf(i: number): number {
    const at = copies.indexOf(i);
    return at >= 0 && i >= data.length ? lines[at] : i;
  }
  slider.addEventListener('input', () => {
    const P = plotly();
    const weight = Number(slider.value);
    shown.textContent = weight.toFixed(2);
    if (!P || !Array.isArray(plot.data) || !lines.length) {
      return;
    }
    const ys = lines.map(i => (weight ? ema(raw.get(i) ?? [], weight) : raw.get(i) ?? []));
    void P.restyle(plot, { y: ys }, lines).then(async () => {
      if (weight && !copies.length) {
        // the raw lines, faint, in their line's legend group: hidden with it
        const start = plot.data!.length;
        const faint = lines.map(i => ({
          ...plot.data![i],
          y: Array.from(raw.get(i) ?? []),
          opacity: 0.2,
          hoverinfo: 'skip',
          showlegend: false
        }));
        copies = lines.map((_, k) => start + k);
        await P.addTraces(plot, faint);
      }
    });
  });
  return bar;
}
