import { describe, expect, it } from 'vitest';

import {
  MagicLineError,
  applyDistributeLine,
  keptArgs,
  pickerCellSource,
  strategyArgs,
  tokenize
} from '../src/magicline';

const MIRRORED = '%distribute mirrored --devices 2';

describe('strategyArgs', () => {
  it('strips %distribute, %%distribute or nothing', () => {
    expect(strategyArgs(MIRRORED)).toBe('mirrored --devices 2');
    expect(strategyArgs('%%distribute mirrored --devices 2')).toBe('mirrored --devices 2');
    expect(strategyArgs('  mirrored   --devices 2 ')).toBe('mirrored --devices 2');
    expect(strategyArgs('%distribute multiworker --workers 2 --cluster "my prof"')).toBe(
      'multiworker --workers 2 --cluster "my prof"'
    );
  });

  it('rejects lines that name no strategy', () => {
    expect(() => strategyArgs('')).toThrow(MagicLineError);
    expect(() => strategyArgs('%distribute')).toThrow(/empty/);
    expect(() => strategyArgs('%time model.fit()')).toThrow(/not a %distribute line/);
    expect(() => strategyArgs('mirorred --devices 2')).toThrow(/strategy name/);
    expect(() => strategyArgs('--devices 2')).toThrow(/strategy name/);
  });
});

describe('tokenize', () => {
  it('groups quoted words and keeps their raw text', () => {
    expect(tokenize(` --data "my ds" --loss 'l o' a\\ b`)).toEqual([
      { value: '--data', raw: '--data' },
      { value: 'my ds', raw: '"my ds"' },
      { value: '--loss', raw: '--loss' },
      { value: 'l o', raw: "'l o'" },
      { value: 'a b', raw: 'a\\ b' }
    ]);
  });

  it('rejects an unclosed quote', () => {
    expect(() => tokenize('--data "ds')).toThrow(/Unclosed " quote/);
  });
});

describe('keptArgs', () => {
  it('drops the strategy name and strategy flags, keeps step flags', () => {
    expect(
      keptArgs(' one_device --devices 1 --step --data ds --epochs 3', 'mirrored --devices 2')
    ).toBe('--step --data ds --epochs 3');
    expect(keptArgs('--devices=4 --step --show-code', 'mirrored')).toBe('--step --show-code');
    expect(
      keptArgs('multiworker --workers 2 --cluster prof --step --data "train ds"', 'mirrored')
    ).toBe('--step --data "train ds"');
  });

  it('drops flags the new strategy line sets even when nbdist adds new ones', () => {
    expect(keptArgs('mirrored --cross-device-ops ring --step', 'mirrored --cross-device-ops nccl'))
      .toBe('--step');
  });
});

describe('applyDistributeLine', () => {
  it('inserts the line at the top of a plain cell', () => {
    const r = applyDistributeLine('model = make_model()\nmodel.fit(ds)', MIRRORED);
    expect(r).toEqual({
      source: '%%distribute mirrored --devices 2\nmodel = make_model()\nmodel.fit(ds)',
      action: 'inserted',
      line: 0
    });
  });

  it('inserts into an empty cell', () => {
    expect(applyDistributeLine('', MIRRORED)).toEqual({
      source: '%%distribute mirrored --devices 2\n',
      action: 'inserted',
      line: 0
    });
  });

  it('adds the strategy to a %%distribute line with only step flags, keeping them', () => {
    const src = '%%distribute --step --data ds --epochs 3\nimages, labels = batch';
    expect(applyDistributeLine(src, MIRRORED)).toEqual({
      source:
        '%%distribute mirrored --devices 2 --step --data ds --epochs 3\nimages, labels = batch',
      action: 'updated',
      line: 0
    });
  });

  it('replaces only the strategy part of an existing %%distribute line', () => {
    const src = '%%distribute one_device --step --data ds --epochs 3 --loss my_loss\nx = 1';
    expect(applyDistributeLine(src, '%distribute multiworker --workers 2').source).toBe(
      '%%distribute multiworker --workers 2 --step --data ds --epochs 3 --loss my_loss\nx = 1'
    );
  });

  it('turns a bare %%distribute into a strategy line', () => {
    const r = applyDistributeLine('%%distribute\nmodel.fit(ds)', MIRRORED);
    expect(r.source).toBe('%%distribute mirrored --devices 2\nmodel.fit(ds)');
    expect(r.action).toBe('updated');
  });

  it('reports an up-to-date line as unchanged', () => {
    const src = '%%distribute mirrored --devices 2 --step --data ds\nx = 1';
    expect(applyDistributeLine(src, MIRRORED)).toEqual({ source: src, action: 'unchanged', line: 0 });
  });

  it('updates a %%distribute line that follows leading blank lines in place', () => {
    const src = '\n  \n%%distribute one_device --step --data ds\nx = 1';
    const r = applyDistributeLine(src, MIRRORED);
    expect(r.source).toBe('\n  \n%%distribute mirrored --devices 2 --step --data ds\nx = 1');
    expect(r.line).toBe(2);
  });

  it('inserts above leading comments and blank lines (a cell magic must come first)', () => {
    const src = '\n# train the model\nmodel.fit(ds)';
    expect(applyDistributeLine(src, MIRRORED).source).toBe(
      '%%distribute mirrored --devices 2\n\n# train the model\nmodel.fit(ds)'
    );
  });

  it('inserts above a leading line magic, which stays in the body', () => {
    const src = '%matplotlib inline\nmodel.fit(ds)';
    expect(applyDistributeLine(src, MIRRORED).source).toBe(
      '%%distribute mirrored --devices 2\n%matplotlib inline\nmodel.fit(ds)'
    );
  });

  it('goes after %%time and %%capture, whose bodies IPython runs as cells', () => {
    expect(applyDistributeLine('%%time\nmodel.fit(ds)', MIRRORED)).toEqual({
      source: '%%time\n%%distribute mirrored --devices 2\nmodel.fit(ds)',
      action: 'inserted',
      line: 1
    });
    expect(
      applyDistributeLine('%%capture out\n%%time\n%%distribute --step --data ds\nx', MIRRORED)
    ).toEqual({
      source: '%%capture out\n%%time\n%%distribute mirrored --devices 2 --step --data ds\nx',
      action: 'updated',
      line: 2
    });
  });

  it('refuses cells whose cell magic makes the body something other than Python', () => {
    expect(() => applyDistributeLine('%%bash\nls', MIRRORED)).toThrow(MagicLineError);
    expect(() => applyDistributeLine('%%writefile a.py\nx = 1', MIRRORED)).toThrow(
      /starts with %%writefile/
    );
    expect(() => applyDistributeLine('%%time\n%%html\n<b>x</b>', MIRRORED)).toThrow(/%%html/);
  });

  it('rejects an unusable strategy line before touching the cell', () => {
    expect(() => applyDistributeLine('x = 1', '%distribute')).toThrow(MagicLineError);
  });
});

describe('pickerCellSource', () => {
  it('loads nbdist first only when the kernel does not have it', () => {
    expect(pickerCellSource(true)).toBe('%distribute');
    expect(pickerCellSource(false)).toBe('%load_ext nbdist\n%distribute');
  });
});
