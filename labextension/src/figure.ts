/**
 * Renderers of nbdist's own output MIME types (a JupyterLab mime extension; see
 * nbdist/widgets/static.py):
 *
 * - `application/vnd.nbdist.figure.v1+json`: a finished dashboard (or `run.plot()`), plotly's
 *   figure JSON, drawn with the plotly.js this extension ships, at the output's width. Not
 *   plotly's MIME type: plotly's renderer writes a PNG of each figure it draws into the
 *   notebook, a copy of the SVG that the same output already holds for GitHub and nbconvert.
 *   Where plotly.js cannot load, the output's SVG is shown.
 * - `application/vnd.nbdist.live-picture.v1+json`: the picture of a live dashboard as of its
 *   last refresh, kept next to the live widget so a notebook saved mid-run keeps a picture.
 *   Hidden (style/base.css) while the live dashboard is in the same output area.
 */

import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

export const FIGURE_MIME = 'application/vnd.nbdist.figure.v1+json';
export const LIVE_PICTURE_MIME = 'application/vnd.nbdist.live-picture.v1+json';
const SVG = 'image/svg+xml';

type PlotlyModule = {
  react: (div: HTMLElement, data: unknown, layout: unknown, config: unknown) => Promise<unknown>;
  relayout: (div: HTMLElement, update: unknown) => Promise<unknown>;
  restyle: (div: HTMLElement, update: unknown, traces: number[]) => Promise<unknown>;
  purge: (div: HTMLElement) => void;
};

/** The page's plotly.js (installed by the extension's plotly plugin), or a chunk import. */
function loadPlotly(): Promise<PlotlyModule> {
  const g = globalThis as { nbdistPlotly?: () => Promise<unknown> };
  if (typeof g.nbdistPlotly === 'function') {
    return g.nbdistPlotly() as Promise<PlotlyModule>;
  }
  return import('plotly.js-dist-min').then(mod => (mod.default ?? mod) as PlotlyModule);
}

type Figure = {
  data?: Record<string, any>[];
  layout?: Record<string, any>;
  config?: Record<string, any>;
};

/** A dark theme's colours, read from JupyterLab's CSS variables. */
export type Theme = {
  fg: string;
  muted: string;
  bg: string;
  grid: string;
  border: string;
  button: string;
  buttonText: string;
};

const DARK_LINES = new Set(['#111111', '#555555', '#000000', 'black']);

/**
 * The page's theme as the figures draw it: in JupyterLab's dark themes a transparent
 * background and the theme's own colours (CSS variables); null in a light theme (the figure
 * as the kernel drew it). As the live figure does (nbdist/widgets/livefigure.js).
 */
export function pageTheme(body: HTMLElement | null = document.body): Theme | null {
  if (!body || body.dataset.jpThemeLight !== 'false') {
    return null;
  }
  const css = getComputedStyle(body);
  const read = (name: string, fallback: string) =>
    css.getPropertyValue(name).trim() || fallback;
  return {
    fg: read('--jp-ui-font-color1', '#d4d4d4'),
    muted: read('--jp-ui-font-color2', '#a0a0a0'),
    bg: read('--jp-layout-color1', '#212121'),
    grid: read('--jp-border-color2', '#444'),
    border: read('--jp-border-color1', '#616161'),
    // plotly draws the active and hovered button #F4FAFF whatever the theme: light buttons
    button: read('--jp-inverse-layout-color3', '#bdbdbd'),
    buttonText: read('--jp-ui-inverse-font-color1', 'rgba(0,0,0,.8)')
  };
}

function lookup(obj: any, path: string): any {
  return path.split('.').reduce((o, k) => (o === null || o === undefined ? undefined : o[k]), obj);
}

/**
 * `{relayout key: value}` of every themed property of `layout` (the kernel's) in `theme`;
 * with no theme, the kernel's own values (null: plotly's default).
 */
export function themeUpdate(layout: Record<string, any>, theme: Theme | null): Record<string, any> {
  const out: Record<string, any> = {};
  const set = (key: string, themed: string | undefined, path = key) => {
    const own = lookup(layout, path);
    out[key] = theme ? themed : own === undefined ? null : own;
  };
  const t = theme ?? ({} as Partial<Theme>);
  set('paper_bgcolor', 'rgba(0,0,0,0)');
  set('plot_bgcolor', 'rgba(0,0,0,0)');
  for (const key of ['font.color', 'legend.font.color', 'title.font.color']) {
    set(key, t.fg);
  }
  set('hoverlabel.bgcolor', t.bg);
  set('hoverlabel.bordercolor', t.border);
  set('hoverlabel.font.color', t.fg);
  for (const [name, axis] of Object.entries(layout)) {
    if (/^[xy]axis\d*$/.test(name) && axis) {
      for (const prop of ['gridcolor', 'linecolor', 'zerolinecolor']) {
        set(`${name}.${prop}`, t.grid);
      }
    }
  }
  (layout.annotations ?? []).forEach((a: any, i: number) => {
    set(`annotations[${i}].font.color`, a.name === 'notes' ? t.muted : t.fg,
        `annotations.${i}.font.color`);
  });
  (layout.updatemenus ?? []).forEach((_: unknown, i: number) => {
    set(`updatemenus[${i}].bgcolor`, t.button, `updatemenus.${i}.bgcolor`);
    set(`updatemenus[${i}].bordercolor`, t.border, `updatemenus.${i}.bordercolor`);
    set(`updatemenus[${i}].font.color`, t.buttonText, `updatemenus.${i}.font.color`);
  });
  return out;
}

/** `layout` with a relayout `update` applied (the first draw: one draw in the theme). */
export function withUpdate(
  layout: Record<string, any>,
  update: Record<string, any>
): Record<string, any> {
  const out = JSON.parse(JSON.stringify(layout));
  for (const [key, value] of Object.entries(update)) {
    const parts = key.replace(/\[(\d+)\]/g, '.$1').split('.');
    let o = out;
    for (const p of parts.slice(0, -1)) {
      o = o[p] = o[p] && typeof o[p] === 'object' ? o[p] : {};
    }
    if (value === null) {
      delete o[parts[parts.length - 1]];
    } else {
      o[parts[parts.length - 1]] = value;
    }
  }
  return out;
}

/** The indices and colours of the near-black lines, drawn in the theme's text colour. */
export function lineColors(
  data: Record<string, any>[],
  theme: Theme | null
): { traces: number[]; colors: string[] } {
  const traces: number[] = [];
  const colors: string[] = [];
  data.forEach((t, i) => {
    const color = t.line?.color;
    if (color !== undefined && DARK_LINES.has(String(color).toLowerCase())) {
      traces.push(i);
      colors.push(theme ? theme.fg : color);
    }
  });
  return { traces, colors };
}

/** The figure as drawn in `theme` (a copy). */
export function themed(fig: Figure, theme: Theme | null): Figure {
  const { traces, colors } = lineColors(fig.data ?? [], theme);
  const data = (fig.data ?? []).map((t, i) => {
    const at = traces.indexOf(i);
    return at >= 0 ? { ...t, line: { ...t.line, color: colors[at] } } : t;
  });
  const layout = fig.layout ?? {};
  return { data, layout: withUpdate(layout, themeUpdate(layout, theme)) };
}

/**
 * plotly.js' config: the kernel's (nbdist/widgets/panels.py, PLOTLY_CONFIG), and never a
 * control that sends the figure off the machine (plotly.js 4 offers "Share chart..." to
 * Plotly Cloud by default), also for figures saved before the kernel said so.
 */
export function plotConfig(config: Record<string, any> = {}): Record<string, any> {
  const remove = new Set([
    ...(config.modeBarButtonsToRemove ?? []),
    'sendChartToCloud',
    'sendDataToCloud',
    'editInChartStudio'
  ]);
  return {
    displaylogo: false,
    ...config,
    showSendToCloud: false,
    showLink: false,
    showEditInChartStudio: false,
    plotlyServerURL: '',
    modeBarButtonsToRemove: [...remove]
  };
}

/** Calls `onChange` after each theme switch (JupyterLab sets these once its CSS is loaded). */
export function watchTheme(onChange: () => void): () => void {
  const observer = new MutationObserver(() => onChange());
  observer.observe(document.body, {
    attributes: true,
    attributeFilter: ['data-jp-theme-light', 'data-jp-theme-name']
  });
  return () => observer.disconnect();
}

/** The output's SVG as an image filling the output's width (its viewBox keeps the aspect). */
export function svgImage(data: Record<string, unknown>): HTMLImageElement | null {
  const raw = data[SVG];
  const svg = Array.isArray(raw) ? raw.join('') : raw;
  if (typeof svg !== 'string' || !svg) {
    return null;
  }
  const img = document.createElement('img');
  img.src = `data:image/svg+xml,${encodeURIComponent(svg)}`;
  img.style.width = '100%';
  img.style.height = 'auto';
  return img;
}

/** A finished dashboard drawn with plotly.js, following the output's width and the theme. */
export class FigureRenderer extends Widget implements IRenderMime.IRenderer {
  private _plot: HTMLDivElement | null = null;
  private _plotly: PlotlyModule | null = null;
  private _resize: ResizeObserver | null = null;
  private _unwatch: (() => void) | null = null;
  private _figure: Figure = {};
  private _width = 0;

  constructor() {
    super();
    this.addClass('nbdist-figure');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this._figure = model.data[FIGURE_MIME] as Figure;
    const fig = themed(this._figure, pageTheme());
    try {
      this._plotly = await loadPlotly();
    } catch (err) {
      console.warn('nbdist: plotly.js did not load; showing the static figure', err);
      this.node.textContent = '';
      const img = svgImage(model.data as Record<string, unknown>);
      if (img) {
        this.node.appendChild(img);
      }
      return;
    }
    if (this.isDisposed) {
      return;
    }
    if (!this._plot) {
      this._plot = document.createElement('div');
      this._plot.className = 'nbdist-static-plot nbdist-plot';
      this.node.appendChild(this._plot);
      this._resize = new ResizeObserver(() => this._fit());
      this._resize.observe(this.node);
      this._unwatch = watchTheme(() => void this._retheme());
    }
    this._width = Math.floor(this.node.getBoundingClientRect().width);
    // plotly measures its container once (700 px when not attached yet): give it the width
    const layout = { ...(fig.layout ?? {}), width: this._width || undefined };
    await this._plotly.react(this._plot, fig.data ?? [], layout, plotConfig(this._figure.config));
  }

  /** The page's theme changed: the same figure in the new theme, zoom and all kept. */
  private async _retheme(): Promise<void> {
    const plot = this._plot as (HTMLDivElement & { data?: unknown[] }) | null;
    if (!plot || !this._plotly || !Array.isArray(plot.data) || this.isDisposed) {
      return;
    }
    const theme = pageTheme();
    await this._plotly.relayout(plot, themeUpdate(this._figure.layout ?? {}, theme));
    const { traces, colors } = lineColors(this._figure.data ?? [], theme);
    if (traces.length) {
      await this._plotly.restyle(plot, { 'line.color': colors }, traces);
    }
  }

  private _fit(): void {
    const width = Math.floor(this.node.getBoundingClientRect().width);
    if (this._plot && this._plotly && width && Math.abs(width - this._width) > 1) {
      this._width = width;
      void this._plotly.relayout(this._plot, { width });
    }
  }

  dispose(): void {
    this._resize?.disconnect();
    this._unwatch?.();
    if (this._plot && this._plotly) {
      this._plotly.purge(this._plot);
    }
    super.dispose();
  }
}

/** A live dashboard's last picture: its SVG, shown once no live dashboard is next to it. */
export class LivePictureRenderer extends Widget implements IRenderMime.IRenderer {
  constructor() {
    super();
    this.addClass('nbdist-live-picture');
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    this.node.textContent = '';
    const img = svgImage(model.data as Record<string, unknown>);
    if (img) {
      this.node.appendChild(img);
    }
  }
}

const extension: IRenderMime.IExtension = {
  id: 'nbdist:figures',
  description: "Draws nbdist's finished dashboards and live dashboards' last pictures.",
  rendererFactory: {
    safe: true,
    mimeTypes: [FIGURE_MIME, LIVE_PICTURE_MIME],
    createRenderer: options =>
      options.mimeType === LIVE_PICTURE_MIME
        ? new LivePictureRenderer()
        : new FigureRenderer()
  },
  // before plotly's renderer (rank 0) and the image renderers
  rank: -1,
  dataType: 'json'
};

export default extension;
