/**
 * Adding or updating the `%%distribute` line of a cell's source. Pure string logic.
 *
 * The kernel's strategy line (`%distribute mirrored --devices 2`) becomes the cell's first
 * line (`%%distribute mirrored --devices 2`); the step-mode flags of an existing
 * `%%distribute` line (`--step --data ds --epochs 3`) are kept, its strategy part replaced.
 */

/** Strategy names, as in `nbdist/spec.py` STRATEGY_NAMES. */
export const STRATEGY_NAMES: readonly string[] = [
  'one_device',
  'mirrored',
  'central_storage',
  'multiworker',
  'parameter_server',
  'tpu'
];

/** Flags that choose the strategy and its placement; each takes one value. */
export const STRATEGY_FLAGS: readonly string[] = [
  '--devices',
  '--workers',
  '--ps',
  '--cluster',
  '--tpu'
];

/** Step-mode flags that take a value (the others, `--step`, `--show-code`, take none). */
export const VALUE_FLAGS: readonly string[] = [
  '--data',
  '--epochs',
  '--steps',
  '--loss',
  '--grads'
];

/**
 * Cell magics whose body IPython runs as a cell again, so `%%distribute` can follow them
 * (`%%time` then `%%distribute ...`). Any other cell magic (`%%bash`, `%%writefile`) makes
 * the cell something other than Python.
 */
export const WRAPPER_MAGICS: readonly string[] = ['time', 'capture'];

/** The cell cannot carry a `%%distribute` line, or the strategy line is unusable. */
export class MagicLineError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MagicLineError';
  }
}

/** One shell-like word of a magic's arguments, with its raw text (quotes kept). */
export interface IToken {
  /** The word without its quotes. */
  value: string;
  /** The word exactly as written. */
  raw: string;
}

/** Split magic arguments into words the way a shell would (quotes group, backslash escapes). */
export function tokenize(args: string): IToken[] {
  const tokens: IToken[] = [];
  let i = 0;
  while (i < args.length) {
    while (i < args.length && /\s/.test(args[i])) {
      i++;
    }
    if (i >= args.length) {
      break;
    }
    const start = i;
    let value = '';
    let quote: string | null = null;
    while (i < args.length && (quote !== null || !/\s/.test(args[i]))) {
      const ch = args[i];
      if (quote !== null) {
        if (ch === quote) {
          quote = null;
        } else if (ch === '\\' && quote === '"' && i + 1 < args.length) {
          value += args[++i];
        } else {
          value += ch;
        }
      } else if (ch === '"' || ch === "'") {
        quote = ch;
      } else if (ch === '\\' && i + 1 < args.length) {
        value += args[++i];
      } else {
        value += ch;
      }
      i++;
    }
    if (quote !== null) {
      throw new MagicLineError(
        `Unclosed ${quote} quote in "${args.trim()}": close it and try again.`
      );
    }
    tokens.push({ value, raw: args.slice(start, i) });
  }
  return tokens;
}

/**
 * The strategy arguments of a strategy line: `%distribute mirrored --devices 2`,
 * `%%distribute mirrored --devices 2` and `mirrored --devices 2` all give
 * `mirrored --devices 2`. Raises when nothing names a strategy.
 */
export function strategyArgs(line: string): string {
  let text = line.trim();
  const magic = /^%{1,2}(\S+)/.exec(text);
  if (magic !== null) {
    if (magic[1] !== 'distribute') {
      throw new MagicLineError(
        `"${text}" is not a %distribute line: give a strategy such as "mirrored --devices 2".`
      );
    }
    text = text.slice(magic[0].length).trim();
  }
  const tokens = tokenize(text);
  if (tokens.length === 0) {
    throw new MagicLineError(
      'The strategy line is empty: give a strategy such as "mirrored --devices 2".'
    );
  }
  if (!STRATEGY_NAMES.includes(tokens[0].value)) {
    throw new MagicLineError(
      `"${text}" does not start with a strategy name; choose one of ` +
        `${STRATEGY_NAMES.join(', ')} (for example "mirrored --devices 2").`
    );
  }
  return tokens.map(t => t.raw).join(' ');
}

function flagName(token: string): string {
  const eq = token.indexOf('=');
  return eq === -1 ? token : token.slice(0, eq);
}

/**
 * The arguments of an existing `%%distribute` line without its strategy part: the strategy
 * name, the strategy flags (and any flag the new strategy line sets) and their values.
 */
export function keptArgs(existingArgs: string, newStrategyArgs: string): string {
  const replaced = new Set<string>(STRATEGY_FLAGS);
  for (const t of tokenize(newStrategyArgs)) {
    if (t.value.startsWith('--')) {
      replaced.add(flagName(t.value));
    }
  }
  const tokens = tokenize(existingArgs);
  const kept: string[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const word = tokens[i].value;
    const next = tokens[i + 1];
    const nextIsValue = next !== undefined && !next.value.startsWith('--');
    if (word.startsWith('--')) {
      const name = flagName(word);
      const takesValue = !word.includes('=') && nextIsValue;
      if (replaced.has(name)) {
        i += takesValue ? 1 : 0;
        continue;
      }
      kept.push(tokens[i].raw);
      if (VALUE_FLAGS.includes(name) && takesValue) {
        kept.push(next.raw);
        i++;
      }
    } else if (!STRATEGY_NAMES.includes(word)) {
      kept.push(tokens[i].raw);
    }
  }
  return kept.join(' ');
}

/** What `applyDistributeLine` did. */
export interface IMagicLineResult {
  source: string;
  action: 'inserted' | 'updated' | 'unchanged';
  /** The zero-based line that holds the `%%distribute` line now. */
  line: number;
}

const CELL_MAGIC = /^%%(\S+)(.*)$/;

/**
 * Add or update the `%%distribute` line of a code cell's source with a strategy line.
 *
 * - A `%%distribute` line (after leading blank lines and `%%time` / `%%capture`) is updated:
 *   its strategy part is replaced and its other flags kept.
 * - Otherwise the line is inserted at the top (after `%%time` / `%%capture`, whose body
 *   IPython runs as a cell), above any comment or line magic, which stay in the body.
 * - Any other cell magic (`%%bash`, `%%writefile` ...) raises: that body is not Python.
 */
export function applyDistributeLine(
  source: string,
  strategyLine: string
): IMagicLineResult {
  const args = strategyArgs(strategyLine);
  const lines = source.split('\n');
  let i = 0;
  while (i < lines.length && lines[i].trim() === '') {
    i++;
  }
  let insertAt = 0;
  while (i < lines.length) {
    const m = CELL_MAGIC.exec(lines[i].trim());
    if (m === null) {
      break;
    }
    const name = m[1];
    if (name === 'distribute') {
      const rest = keptArgs(m[2], args);
      const line = `%%distribute ${args}${rest ? ' ' + rest : ''}`;
      if (line === lines[i]) {
        return { source, action: 'unchanged', line: i };
      }
      lines[i] = line;
      return { source: lines.join('\n'), action: 'updated', line: i };
    }
    if (!WRAPPER_MAGICS.includes(name)) {
      throw new MagicLineError(
        `This cell starts with %%${name}, so its body is not Python and cannot be ` +
          `distributed. Move the code to its own cell, or put %%distribute first.`
      );
    }
    i++;
    insertAt = i;
  }
  const line = `%%distribute ${args}`;
  if (source === '') {
    return { source: line + '\n', action: 'inserted', line: 0 };
  }
  lines.splice(insertAt, 0, line);
  return { source: lines.join('\n'), action: 'inserted', line: insertAt };
}

/**
 * The source of the cell inserted to open the strategy picker: `%distribute` alone, after
 * `%load_ext nbdist` when nbdist is not loaded in the kernel yet.
 */
export function pickerCellSource(nbdistLoaded: boolean): string {
  return nbdistLoaded ? '%distribute' : '%load_ext nbdist\n%distribute';
}
