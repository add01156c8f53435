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

import { figureControls } from './figurecontrols';
import {
  type Figure,
  lineColors,
  pageTheme,
  plotConfig,
  themed,
  themeUpdate,
  watchTheme
} from './plottheme';

export const FIGURE_MIME = 'application/vnd.nbdist.figure.v1+json';
export const LIVE_PICTURE_MIME = 'application/vnd.nbdist.live-picture.v1+json';
const SVG = 'image/svg+xml';

type PlotlyModule = {
  react: (div: HTMLElement, data: unknown, layout: unknown, config: unknown) => Promise<unknown>;
  relayout: (div: HTMLElement, update: unknown) => Promise<unknown>;
  restyle: (div: HTMLElement, update: unknown, traces?: number[]) => Promise<unknown>;
  addTraces: (div: HTMLElement, traces: unknown) => Promise<unknown>;
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
      // a dashboard's smoothing slider and x axis menu (a comparison has plotly's own)
      const controls = figureControls(this._plot, this._figure, () =>
        this.isDisposed ? null : this._plotly
      );
      if (controls) {
        this.node.appendChild(controls);
      }
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
