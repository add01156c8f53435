import { describe, expect, it } from 'vitest';

import { dashboardRun, liveRun, staleOutput } from '../src/staleoutputs';

const view = (text: string | string[]) => ({
  output_type: 'display_data',
  metadata: {},
  data: {
    'application/vnd.jupyter.widget-view+json': { model_id: 'abc', version_major: 2 },
    'text/plain': text
  }
});

describe('dashboardRun', () => {
  it("reads the run id of nbdist's live dashboard views only", () => {
    expect(dashboardRun(view('nbdist live dashboard of Run 3 (mirrored): it needs...'))).toBe(3);
    expect(dashboardRun(view(['nbdist live dashboard of Run 12', ' (multiworker)']))).toBe(12);
    expect(dashboardRun(view('VBox(children=(...))'))).toBeNull(); // someone else's widget
    expect(
      dashboardRun({ output_type: 'display_data', metadata: {}, data: { 'text/plain': 'x' } })
    ).toBeNull();
    expect(dashboardRun({ output_type: 'stream', name: 'stdout', text: 'hi' } as any)).toBeNull();
  });
});

describe('liveRun and staleOutput', () => {
  const state = (status: string) =>
    ({ run: { id: 4, status, step: 1, epoch: 1, total_steps: null } }) as any;

  it('only a running run is live', () => {
    expect(liveRun(state('running'))).toBe(4);
    expect(liveRun(state('done'))).toBeNull();
    expect(liveRun(null)).toBeNull();
  });

  it('says which run it was and how to redraw it, as plain text', () => {
    const out = staleOutput(4);
    expect(Object.keys(out.data)).toEqual(['text/plain']);
    expect(out.data['text/plain']).toContain('Run 4');
    expect(out.data['text/plain']).toContain('nbdist.runs[3].plot()');
  });
});
