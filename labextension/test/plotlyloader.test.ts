import { afterEach, describe, expect, it, vi } from 'vitest';

import { installPlotlyLoader, resetPlotlyLoader } from '../src/plotlyloader';

afterEach(() => resetPlotlyLoader());

describe('installPlotlyLoader', () => {
  it('loads plotly.js once however many figures ask', async () => {
    const Plotly = { newPlot: () => undefined };
    const load = vi.fn(async () => ({ default: Plotly }));
    const page: { nbdistPlotly?: () => Promise<unknown> } = {};
    installPlotlyLoader(page, load);
    const got = await Promise.all([page.nbdistPlotly!(), page.nbdistPlotly!()]);
    expect(got).toEqual([Plotly, Plotly]);
    expect(await page.nbdistPlotly!()).toBe(Plotly);
    expect(load).toHaveBeenCalledTimes(1);
  });

  it('keeps a loader already installed on the page', () => {
    const mine = async () => 'mine';
    const page = { nbdistPlotly: mine };
    installPlotlyLoader(page, async () => ({}));
    expect(page.nbdistPlotly).toBe(mine);
  });
});
