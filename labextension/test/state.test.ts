import { readFileSync } from 'fs';
import { join } from 'path';

import { describe, expect, it } from 'vitest';

import {
  BOTTLENECKS,
  BOTTLENECK_LABELS,
  INbdistState,
  RUN_STATUSES,
  StateError,
  formatStatus,
  formatTooltip,
  hasStrategy,
  isAlert,
  parseMessage,
  validateState,
  verdictLabel
} from '../src/state';
import { STRATEGY_NAMES } from '../src/magicline';

const fixtures = JSON.parse(
  readFileSync(join(__dirname, 'fixtures', 'states.json'), 'utf8')
) as {
  run_statuses: string[];
  bottlenecks: string[];
  strategies: string[];
  valid: unknown[];
  invalid: Array<{ why: string; state: unknown }>;
};

const base: INbdistState = {
  version: '0.1.0',
  strategy: 'mirrored',
  magic_line: '%distribute mirrored --devices 2',
  replicas: 2,
  devices: ['CPU:0', 'CPU:1'],
  workers_total: 0,
  workers_alive: 0,
  dead_workers: [],
  stragglers: [],
  run: null,
  verdict: null
};

function state(overrides: Partial<INbdistState>): INbdistState {
  return { ...base, ...overrides };
}

describe('validateState', () => {
  it('knows the same run statuses as the kernel', () => {
    expect([...RUN_STATUSES]).toEqual(fixtures.run_statuses);
  });

  it('knows the same bottlenecks and strategies as the kernel, and a label for each', () => {
    expect([...BOTTLENECKS]).toEqual(fixtures.bottlenecks);
    expect([...STRATEGY_NAMES]).toEqual(fixtures.strategies);
    expect(Object.keys(BOTTLENECK_LABELS)).toEqual(fixtures.bottlenecks);
  });

  it.each(fixtures.valid.map((s, i) => [i, s]))('accepts valid fixture %i', (_, s) => {
    expect(validateState(s)).toEqual(s);
  });

  it.each(fixtures.invalid.map(f => [f.why, f.state]))('rejects: %s', (_, s) => {
    expect(() => validateState(s)).toThrow(StateError);
  });

  it('returns a copy', () => {
    const out = validateState(base);
    expect(out).toEqual(base);
    expect(out.devices).not.toBe(base.devices);
  });

  it('refuses keys and names it does not know, as the kernel does', () => {
    expect(() => validateState({ ...base, gpu_memory: [1, 2] })).toThrow(
      /state has missing keys \[\] and unknown keys \[gpu_memory\]/
    );
    const { verdict: _, ...older } = base;
    expect(() => validateState(older)).toThrow(/missing keys \[verdict\]/);
    const run = { id: 3, status: 'running', step: 1, epoch: 1, total_steps: null };
    const verdict = { run: 3, step: 1, bottleneck: 'memory', advice: null };
    expect(() => validateState({ ...base, run, verdict })).toThrow(
      /verdict.bottleneck must be one of input, dispatch/
    );
    expect(() => validateState({ ...base, strategy: 'mirorred' })).toThrow(
      /strategy must be one of one_device, mirrored/
    );
  });

  it('names the offending key', () => {
    expect(() => validateState({ ...base, workers_alive: 1 })).toThrow(
      /workers_alive must be at most workers_total \(0\), got 1/
    );
    expect(() => validateState({ ...base, replicas: undefined })).toThrow(
      /replicas must be an integer >= 0, got nothing/
    );
  });
});

describe('parseMessage', () => {
  it('parses state and status_text messages', () => {
    expect(parseMessage({ type: 'state', state: base })).toEqual({ type: 'state', state: base });
    expect(parseMessage({ type: 'status_text', text: 'Strategy: mirrored' })).toEqual({
      type: 'status_text',
      text: 'Strategy: mirrored'
    });
  });

  it('rejects malformed messages', () => {
    expect(() => parseMessage(null)).toThrow(StateError);
    expect(() => parseMessage('state')).toThrow(StateError);
    expect(() => parseMessage({ type: 'state' })).toThrow(/state must be an object/);
    expect(() => parseMessage({ type: 'state', state: { ...base, run: 'x' } })).toThrow(
      /run must be an object or null/
    );
    expect(() => parseMessage({ type: 'status_text', text: 3 })).toThrow(/text must be a string/);
    expect(() => parseMessage({ type: 'request', what: 'status' })).toThrow(
      /message type must be "state" or "status_text"/
    );
  });
});

describe('formatStatus', () => {
  it('shows that nbdist is loaded without a strategy', () => {
    expect(formatStatus(validateState(fixtures.valid[0]))).toBe('nbdist: no strategy');
  });

  it('shows strategy and replicas', () => {
    expect(formatStatus(base)).toBe('nbdist: mirrored ×2');
  });

  it('shows workers alive/total when there are workers', () => {
    expect(
      formatStatus(state({ strategy: 'multiworker', workers_total: 2, workers_alive: 2 }))
    ).toBe('nbdist: multiworker ×2 · workers 2/2');
  });

  it('shows the step of a running run, with the total when known', () => {
    const run = { id: 1, status: 'running' as const, step: 37, epoch: 0, total_steps: 100 };
    expect(formatStatus(state({ run }))).toBe('nbdist: mirrored ×2 · step 37/100');
    expect(formatStatus(state({ run: { ...run, total_steps: null } }))).toBe(
      'nbdist: mirrored ×2 · step 37'
    );
  });

  it('shows a failed, interrupted or stopped run, not a finished one', () => {
    const run = { id: 4, status: 'failed' as const, step: 3, epoch: 0, total_steps: null };
    expect(formatStatus(state({ run }))).toBe('nbdist: mirrored ×2 · run 4 failed');
    expect(formatStatus(state({ run: { ...run, status: 'interrupted' } }))).toBe(
      'nbdist: mirrored ×2 · run 4 interrupted'
    );
    expect(formatStatus(state({ run: { ...run, status: 'stopped' } }))).toBe(
      'nbdist: mirrored ×2 · run 4 stopped'
    );
    expect(formatStatus(state({ run: { ...run, status: 'done' } }))).toBe('nbdist: mirrored ×2');
  });

  it('counts dead workers and stragglers', () => {
    expect(formatStatus(validateState(fixtures.valid[2]))).toBe(
      'nbdist: multiworker ×2 · workers 1/2 · 1 dead · straggler worker 0 · run 0 failed'
    );
    expect(formatStatus(state({ stragglers: ['replica 0', 'replica 1'] }))).toBe(
      'nbdist: mirrored ×2 · 2 stragglers'
    );
  });
});

describe('the verdict', () => {
  const run = { id: 3, status: 'running' as const, step: 120, epoch: 1, total_steps: 1000 };
  const verdict = {
    run: 3,
    step: 100,
    bottleneck: 'input' as const,
    advice: 'The step waits for its input: read it ahead (expected +80% steps/s)'
  };

  it('names the bottleneck while the run trains and after it ended', () => {
    const replicas4 = { replicas: 4, run, verdict };
    expect(formatStatus(state(replicas4))).toBe(
      'nbdist: mirrored ×4 · step 120/1000 · input-bound'
    );
    expect(formatStatus(state({ ...replicas4, run: { ...run, status: 'done' } }))).toBe(
      'nbdist: mirrored ×4 · input-bound'
    );
    expect(
      formatStatus(state({ run, verdict: { ...verdict, bottleneck: 'tiny model' } }))
    ).toBe('nbdist: mirrored ×2 · step 120/1000 · model too small');
  });

  it('labels every bottleneck the kernel names', () => {
    for (const bottleneck of BOTTLENECKS) {
      expect(verdictLabel({ ...verdict, bottleneck })).toBe(BOTTLENECK_LABELS[bottleneck]);
    }
  });

  it('puts the first advice in the tooltip', () => {
    const lines = formatTooltip(state({ run, verdict })).split('\n');
    expect(lines.slice(-4)).toEqual([
      'Bottleneck of run 3 at step 100: input-bound',
      verdict.advice,
      '%distribute explain shows where the time goes',
      'Click for %distribute status'
    ]);
    const balanced = { ...verdict, bottleneck: 'balanced' as const, advice: null };
    expect(formatTooltip(state({ run, verdict: balanced }))).toContain(
      'balanced\nNothing to fix.'
    );
  });
});

describe('isAlert and hasStrategy', () => {
  it('alerts on a dead worker or a straggler only', () => {
    expect(isAlert(null)).toBe(false);
    expect(isAlert(base)).toBe(false);
    expect(isAlert(state({ dead_workers: [0], workers_total: 2, workers_alive: 1 }))).toBe(true);
    expect(isAlert(state({ stragglers: ['replica 1'] }))).toBe(true);
  });

  it('knows whether the kernel has a strategy', () => {
    expect(hasStrategy(null)).toBe(false);
    expect(hasStrategy(validateState(fixtures.valid[0]))).toBe(false);
    expect(hasStrategy(base)).toBe(true);
  });
});

describe('formatTooltip', () => {
  it('lists the magic line, devices, dead workers, stragglers and the run', () => {
    const tip = formatTooltip(validateState(fixtures.valid[2]));
    expect(tip.split('\n')).toEqual([
      'nbdist 0.1.0',
      '%distribute multiworker --workers 2',
      '2 replicas',
      'Workers alive: 1/2',
      'Dead workers: 1',
      'Stragglers: worker 0',
      'Run 0: failed, step 5',
      'Click for %distribute status'
    ]);
  });

  it('tells how to choose a strategy when there is none', () => {
    expect(formatTooltip(validateState(fixtures.valid[0]))).toContain(
      'No strategy: run %distribute to choose one.'
    );
  });
});
