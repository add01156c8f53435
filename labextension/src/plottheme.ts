/**
 * How nbdist's figures look in the page's theme, and plotly.js' config for them: pure logic
 * (the renderers are in figure.ts). The live figure does the same in its own module
 * (nbdist/widgets/livefigure.js), which cannot import this bundle.
 */

export type Figure = {
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
  set('modebar.bgcolor', 'rgba(0,0,0,0)');
  set('modebar.color', t.muted);
  set('modebar.activecolor', t.fg);
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
