import { describe, expect, it } from 'vitest';

import { applyFinal, placeView, runsCell, showsLiveView } from '../src/recover';
import { staleOutput } from '../src/staleoutputs';

const VIEW = 'application/vnd.jupyter.widget-view+json';
const PICTURE = 'application/vnd.nbdist.live-picture.v1+json';

const view = (run: number, modelId: string) => ({
  output_type: 'display_data',
  metadata: {},
  data: {
    [VIEW]: { model_id: modelId, version_major: 2, version_minor: 1 },
    'text/plain': `nbdist live dashboard of Run ${run} (mirrored): the run was going on...`
  }
});
const picture = (run: number) => ({
  output_type: 'display_data',
  metadata: {},
  data: { [PICTURE]: { run, step: 9 }, 'text/plain': `Run ${run}: the dashboard as of step 9` }
});
const text = (t: string) => ({ output_type: 'stream', name: 'stdout', text: t });

/** A cell's outputs as JupyterLab's output area model holds them. */
class Outputs {
  constructor(public list: any[] = []) {}
  get length() {
    return this.list.length;
  }
  get(i: number) {
    return { toJSON: () => this.list[i] };
  }
  set(i: number, output: any) {
    this.list[i] = output;
  }
  add(output: any) {
    return this.list.push(output);
  }
  clear() {
    this.list = [];
  }
  toJSON() {
    return [...this.list];
  }
  fromJSON(values: any[]) {
    this.list = [...values];
  }
}

const cell = (id: string, source: string, outputs: any[] = [], executionState = 'idle') => ({
  type: 'code',
  id,
  trusted: true,
  sharedModel: { getSource: () => source },
  outputs: new Outputs(outputs),
  executionState
});
const cells = (...list: any[]) => ({ length: list.length, get: (i: number) => list[i] });

const BUNDLE = {
  [VIEW]: { model_id: 'fresh', version_major: 2, version_minor: 1 },
  'text/plain': 'nbdist live dashboard of Run 3 (mirrored): ...'
};
const reply = (cell: { id: string | null; code: string | null }) => ({
  type: 'dashboard' as const,
  token: 't',
  run: 3,
  bundle: BUNDLE,
  cell
});

describe('which page asks for a view', () => {
  it('not the page that runs the cell, nor one whose view of the run works', () => {
    const running = cells(cell('a', 'x'), cell('b', '%%distribute', [], 'running'));
    expect(runsCell(running)).toBe(true);
    const saved = cells(cell('b', '%%distribute', [view(3, 'old')]));
    expect(runsCell(saved)).toBe(false);
    expect(showsLiveView(saved, 3, id => id === 'old')).toBe(true); // its widget is here
    expect(showsLiveView(saved, 3, () => false)).toBe(false); // reloaded: "Loading widget..."
    expect(showsLiveView(saved, 4, () => true)).toBe(false); // another run's view
  });
});

describe('placeView', () => {
  it("replaces the saved view of the run, keeping the cell's other outputs", () => {
    const c = cell('b', '%%distribute', [text('hi\n'), view(3, 'old'), picture(3)]);
    expect(placeView(cells(c), reply({ id: null, code: null }))).toBe(true);
    expect(c.outputs.list.map(o => o.data?.[VIEW]?.model_id ?? o.output_type)).toEqual([
      'stream',
      'fresh',
      'display_data' // the picture, hidden while a live dashboard is next to it
    ]);
  });

  it('empties an untrusted cell before it trusts it with the view', () => {
    const c = { ...cell('b', '%%distribute', [text('saved\n'), view(3, 'old')]), trusted: false };
    expect(placeView(cells(c), reply({ id: null, code: null }))).toBe(true);
    expect(c.trusted).toBe(true);
    expect(c.outputs.list).toEqual([{ output_type: 'display_data', metadata: {}, data: BUNDLE }]);
  });

  it('else fills the running cell, found by id, else by its code', () => {
    const a = cell('a', 'print(1)', [text('1\n')]);
    const b = cell('b', '%%distribute --step', [text('an earlier run\n')]);
    expect(placeView(cells(a, b), reply({ id: 'b', code: null }))).toBe(true);
    expect(b.outputs.list).toEqual([{ output_type: 'display_data', metadata: {}, data: BUNDLE }]);
    const c = cell('other-id', '%%distribute --step');
    expect(placeView(cells(a, c), reply({ id: 'b', code: '%%distribute --step' }))).toBe(true);
    expect(c.outputs.list).toHaveLength(1);
    expect(placeView(cells(a), reply({ id: 'b', code: 'gone' }))).toBe(false);
    expect(a.outputs.list).toEqual([text('1\n')]);
  });
});

describe('applyFinal', () => {
  it('puts the final figure and the summary where the view was, and drops the picture', () => {
    const c = cell('b', '%%distribute', [text('hi\n'), view(3, 'fresh'), picture(3), picture(2)]);
    const other = cell('c', 'x', [view(3, 'old')]);
    const final = {
      type: 'final' as const,
      run: 3,
      views: ['fresh'],
      figure: { 'text/plain': 'Run 3 figure' },
      summary: { 'text/plain': 'Run 3 stopped' }
    };
    expect(applyFinal(cells(c, other), final)).toBe(1);
    expect(c.outputs.list.map(o => o.data?.['text/plain'] ?? o.text)).toEqual([
      'hi\n',
      'Run 3 figure',
      'Run 3 stopped',
      'Run 2: the dashboard as of step 9'
    ]);
    expect(other.outputs.list).toEqual([view(3, 'old')]); // not a view the kernel sent here
  });
});

describe('staleOutput', () => {
  it('says the run ended when the kernel got that far, else that it is another kernel', () => {
    const ended = staleOutput(4, 5).data['text/plain'] as string;
    expect(ended).toContain('the run has ended');
    expect(ended).not.toContain('does not have it');
    const other = staleOutput(4, 1).data['text/plain'] as string;
    expect(other).toContain('this kernel did not run it');
    expect(staleOutput(4).data['text/plain']).toContain('nbdist.runs[3].plot()');
  });
});
