import { describe, expect, it } from 'vitest';

import { ema, interp, xAxisUpdate, xValues } from '../src/figurecontrols';

const CLOCK = { steps: [0, 10, 20], seconds: [1, 2, 12], started: 1_700_000_000 };

describe('ema', () => {
  it('is TensorBoard debiased average and skips missing points', () => {
    expect(Array.from(ema([1, 1, 1], 0.9))).toEqual([1, 1, 1]);
    const out = ema([0, NaN, 2], 0.5);
    expect(out[0]).toBe(0);
    expect(Number.isNaN(out[1])).toBe(true);
    expect(out[2]).toBeCloseTo(4 / 3, 10); // as nbdist.widgets.controls.ema
  });
});

describe('x axis modes', () => {
  it('reads each step time off the clock, between and beyond its points', () => {
    expect(interp(5, CLOCK.steps, CLOCK.seconds)).toBe(1.5);
    expect(interp(-1, CLOCK.steps, CLOCK.seconds)).toBe(1);
    expect(interp(99, CLOCK.steps, CLOCK.seconds)).toBe(12);
    expect(xValues([0, 15], 'step', CLOCK)).toEqual([0, 15]);
    expect(xValues([0, 15], 'time', CLOCK)).toEqual([1, 7]);
    const wall = xValues([0], 'wall', CLOCK) as string[];
    expect(wall[0]).toMatch(/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.000$/);
  });

  it('switches the axis type and puts the step axis back as the kernel drew it', () => {
    const step = { autorangeoptions: { include: [0, 10] }, rangemode: 'nonnegative',
                   tickformat: ',~g', hoverformat: ',.0f' };
    expect(xAxisUpdate('wall', step)['xaxis.type']).toBe('date');
    expect(xAxisUpdate('time', step)['xaxis.autorangeoptions']).toBeNull();
    expect(xAxisUpdate('step', step)['xaxis.autorangeoptions']).toEqual({ include: [0, 10] });
    expect(xAxisUpdate('step', step)['xaxis.title.text']).toBe('step');
  });
});
