/**
 * plotly.js for nbdist's live dashboard figure, shipped once in this extension and loaded
 * (a lazy chunk, once per page) when the first dashboard draws. The figure's anywidget module
 * (nbdist/widgets/livefigure.js) calls `globalThis.nbdistPlotly()`; without this extension it
 * falls back to plotly's CDN. So the notebook's widget state holds data only, not plotly.js.
 */

export type PlotlyLoader = () => Promise<unknown>;

let loading: Promise<unknown> | null = null;

/** Load plotly.js once (`load` imports the chunk); later calls share the first promise. */
export function oncePlotly(load: () => Promise<any>): PlotlyLoader {
  return () => {
    if (loading === null) {
      loading = load().then(mod => mod.default ?? mod);
    }
    return loading;
  };
}

/** Make the loader reachable from anywidget modules (they cannot import this bundle). */
export function installPlotlyLoader(
  target: { nbdistPlotly?: PlotlyLoader },
  load: () => Promise<any>
): void {
  if (!target.nbdistPlotly) {
    target.nbdistPlotly = oncePlotly(load);
  }
}

/** Forget the loaded module (tests). */
export function resetPlotlyLoader(): void {
  loading = null;
}
