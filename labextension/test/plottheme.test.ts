import { describe, expect, it } from 'vitest';

import { plotConfig, themed, themeUpdate, type Theme } from '../src/plottheme';

const DARK: Theme = {
  fg: 'rgba(255, 255, 255, 0.87)',
  muted: 'rgba(255, 255, 255, 0.54)',
  bg: 'rgb(33, 33, 33)',
  grid: 'rgb(66, 66, 66)',
  border: 'rgb(97, 97, 97)',
  button: 'rgb(189, 189, 189)',
  buttonText: 'rgba(0, 0, 0, 0.8)'
};

const FIGURE = {
  data: [
    { name: 'replica 0', line: { color: '#1f77b4' } },
    { name: 'mean of replicas', line: { color: '#111111', width: 2.6 } }
  ],
  layout: {
    title: { text: 'Run 1' },
    xaxis: {},
    yaxis: {},
    annotations: [{ name: 'notes', text: 'n', font: { color: '#666' } }, { text: 'loss' }],
    updatemenus: [{ buttons: [] }]
  }
};

describe('plotConfig', () => {
  it('never offers to send the figure off the machine', () => {
    for (const config of [undefined, {}, { showSendToCloud: true, plotlyServerURL: 'x' }]) {
      const c = plotConfig(config as any);
      expect(c.showSendToCloud).toBe(false);
      expect(c.plotlyServerURL).toBe('');
      expect(c.modeBarButtonsToRemove).toContain('sendChartToCloud');
    }
    expect(plotConfig({ modeBarButtonsToRemove: ['lasso2d'] }).modeBarButtonsToRemove).toEqual(
      expect.arrayContaining(['lasso2d', 'sendChartToCloud'])
    );
  });
});

describe('themed', () => {
  it('draws a dark theme in its own colours, hover box and toggle included', () => {
    const fig = themed(FIGURE, DARK);
    expect(fig.layout?.hoverlabel).toEqual({
      bgcolor: DARK.bg,
      bordercolor: DARK.border,
      font: { color: DARK.fg }
    });
    expect(fig.layout?.updatemenus[0]).toMatchObject({
      bgcolor: DARK.button,
      font: { color: DARK.buttonText }
    });
    expect(fig.layout?.annotations.map((a: any) => a.font.color)).toEqual([DARK.muted, DARK.fg]);
    expect(fig.data?.map(t => t.line.color)).toEqual(['#1f77b4', DARK.fg]);
    expect(FIGURE.data[1].line.color).toBe('#111111'); // a copy
  });

  it('a switch back to light restores what the kernel drew', () => {
    const update = themeUpdate(FIGURE.layout, null);
    expect(update['annotations[0].font.color']).toBe('#666');
    expect(update['hoverlabel.bgcolor']).toBeNull(); // plotly's default again
    expect(Object.keys(update).sort()).toEqual(Object.keys(themeUpdate(FIGURE.layout, DARK)).sort());
    expect(themed(FIGURE, null).data?.[1].line.color).toBe('#111111');
  });
});
