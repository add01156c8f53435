/**
 * The kernel's nbdist state as it arrives over the "nbdist" comm: types, validation of
 * incoming messages and the text of the status bar item. No DOM, no JupyterLab imports.
 *
 * The Python side of this contract is `nbdist/lab/state.py` (`LabState`, which builds and
 * serializes the state); `test/fixtures/states.json` holds the states both sides accept and
 * refuse. The check is as strict as the kernel's: the extension ships in the same package as
 * the kernel's nbdist, so a key or a name this page does not know is a bug, not a newer kernel.
 */

import { STRATEGY_NAMES } from './magicline';

/** Statuses of `state.run.status` (`nbdist.telemetry.run.STATUSES`). */
export const RUN_STATUSES = [
  'running',
  'done',
  'interrupted',
  'stopped',
  'failed'
] as const;

export type RunStatus = (typeof RUN_STATUSES)[number];

/** The bottlenecks a verdict names (`nbdist.telemetry.explain.BOTTLENECKS`). */
export const BOTTLENECKS = [
  'input',
  'dispatch',
  'communication',
  'straggler',
  'tiny model',
  'balanced'
] as const;

export type Bottleneck = (typeof BOTTLENECKS)[number];

/** The current (or last) run of the kernel. */
export interface IRunState {
  id: number;
  status: RunStatus;
  step: number;
  /** counted from 1, as the dashboard shows it (0 before the first step) */
  epoch: number;
  total_steps: number | null;
}

/**
 * Why the current (or last) run is as fast as it is: what `%distribute explain` says of it,
 * computed now and then while it trains (`nbdist/lab/verdict.py`).
 */
export interface IVerdict {
  /** the run explained: `run.id` */
  run: number;
  /** the step it had reached */
  step: number;
  bottleneck: Bottleneck;
  /** the first advice, without the numbers behind it; null when there is nothing to fix */
  advice: string | null;
}

/** How the status bar names a bottleneck. */
export const BOTTLENECK_LABELS: { [bottleneck in Bottleneck]: string } = {
  input: 'input-bound',
  dispatch: 'dispatch-bound',
  communication: 'communication-bound',
  straggler: 'straggler-bound',
  'tiny model': 'model too small',
  balanced: 'balanced'
};

/** What the kernel sends in `{"type": "state", "state": STATE}`. */
export interface INbdistState {
  version: string;
  strategy: string | null;
  magic_line: string | null;
  replicas: number;
  devices: string[];
  workers_total: number;
  workers_alive: number;
  dead_workers: number[];
  stragglers: string[];
  run: IRunState | null;
  verdict: IVerdict | null;
}

/** A message from the kernel, once validated. */
export type NbdistMessage =
  | { type: 'state'; state: INbdistState }
  | { type: 'status_text'; text: string };

/** A message or state that does not have the agreed shape. */
export class StateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'StateError';
  }
}

type Dict = { [key: string]: unknown };

function isDict(value: unknown): value is Dict {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  if (value === undefined) {
    return 'nothing';
  }
  try {
    return JSON.stringify(value);
  } catch {
    return String(value);
  }
}

function fail(where: string, expected: string, value: unknown): never {
  throw new StateError(
    `nbdist state: ${where} must be ${expected}, got ${describe(value)}`
  );
}

/** `value` as an object with exactly the keys `keys`; a missing or unknown one fails. */
function exactKeys(where: string, value: unknown, keys: readonly string[]): Dict {
  if (!isDict(value)) {
    fail(where, 'an object', value);
  }
  const missing = keys.filter(k => !(k in value));
  const unknown = Object.keys(value).filter(k => !keys.includes(k));
  if (missing.length > 0 || unknown.length > 0) {
    throw new StateError(
      `nbdist state: ${where} has missing keys [${missing.join(', ')}] and unknown keys ` +
        `[${unknown.join(', ')}]; expected exactly [${keys.join(', ')}]`
    );
  }
  return value;
}

function oneOf<T extends string>(where: string, names: readonly T[], value: unknown): T {
  if (!names.includes(value as T)) {
    fail(where, `one of ${names.join(', ')}`, value);
  }
  return value as T;
}

const STATE_KEYS = [
  'version',
  'strategy',
  'magic_line',
  'replicas',
  'devices',
  'workers_total',
  'workers_alive',
  'dead_workers',
  'stragglers',
  'run',
  'verdict'
] as const;
const RUN_KEYS = ['id', 'status', 'step', 'epoch', 'total_steps'] as const;
const VERDICT_KEYS = ['run', 'step', 'bottleneck', 'advice'] as const;

function count(where: string, value: unknown): number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
    fail(where, 'an integer >= 0', value);
  }
  return value;
}

function stringOrNull(where: string, value: unknown): string | null {
  if (value !== null && typeof value !== 'string') {
    fail(where, 'a string or null', value);
  }
  return value;
}

function stringList(where: string, value: unknown): string[] {
  if (!Array.isArray(value) || !value.every(v => typeof v === 'string')) {
    fail(where, 'a list of strings', value);
  }
  return [...value];
}

function validateRun(value: unknown): IRunState | null {
  if (value === null) {
    return null;
  }
  if (!isDict(value)) {
    fail('run', 'an object or null', value);
  }
  exactKeys('run', value, RUN_KEYS);
  return {
    id: count('run.id', value.id),
    status: oneOf('run.status', RUN_STATUSES, value.status),
    step: count('run.step', value.step),
    epoch: count('run.epoch', value.epoch),
    total_steps:
      value.total_steps === null
        ? null
        : count('run.total_steps', value.total_steps)
  };
}

function validateVerdict(value: unknown): IVerdict | null {
  if (value === null) {
    return null;
  }
  if (!isDict(value)) {
    fail('verdict', 'an object or null', value);
  }
  exactKeys('verdict', value, VERDICT_KEYS);
  return {
    run: count('verdict.run', value.run),
    step: count('verdict.step', value.step),
    bottleneck: oneOf('verdict.bottleneck', BOTTLENECKS, value.bottleneck),
    advice: stringOrNull('verdict.advice', value.advice)
  };
}

/**
 * Check an incoming state and return a clean copy of it. Missing or unknown keys, wrong types
 * and names this page does not know raise a `StateError`.
 */
export function validateState(value: unknown): INbdistState {
  const d = exactKeys('state', value, STATE_KEYS);
  if (typeof d.version !== 'string') {
    fail('version', 'a string', d.version);
  }
  const strategy =
    d.strategy === null ? null : oneOf('strategy', STRATEGY_NAMES, d.strategy);
  const magicLine = stringOrNull('magic_line', d.magic_line);
  if ((strategy === null) !== (magicLine === null)) {
    throw new StateError(
      'nbdist state: strategy and magic_line must both be null or both be set'
    );
  }
  if (magicLine !== null && !/^%distribute\s+\S/.test(magicLine)) {
    fail('magic_line', 'a "%distribute ..." line', magicLine);
  }
  const workersTotal = count('workers_total', d.workers_total);
  const workersAlive = count('workers_alive', d.workers_alive);
  if (workersAlive > workersTotal) {
    fail('workers_alive', `at most workers_total (${workersTotal})`, workersAlive);
  }
  const dead = d.dead_workers;
  if (
    !Array.isArray(dead) ||
    !dead.every(w => typeof w === 'number' && Number.isInteger(w) && w >= 0)
  ) {
    fail('dead_workers', 'a list of integers >= 0', dead);
  }
  return {
    version: d.version,
    strategy,
    magic_line: magicLine,
    replicas: count('replicas', d.replicas),
    devices: stringList('devices', d.devices),
    workers_total: workersTotal,
    workers_alive: workersAlive,
    dead_workers: [...(dead as number[])],
    stragglers: stringList('stragglers', d.stragglers),
    run: validateRun(d.run),
    verdict: validateVerdict(d.verdict)
  };
}

/** Validate the `data` of a comm message (or of the comm's open message). */
export function parseMessage(data: unknown): NbdistMessage {
  if (!isDict(data)) {
    fail('message', 'an object', data);
  }
  if (data.type === 'state') {
    return { type: 'state', state: validateState(data.state) };
  }
  if (data.type === 'status_text') {
    if (typeof data.text !== 'string') {
      fail('status_text.text', 'a string', data.text);
    }
    return { type: 'status_text', text: data.text };
  }
  return fail('message type', '"state" or "status_text"', data.type);
}

/** Whether the kernel has chosen a strategy (so a cell can be distributed with it). */
export function hasStrategy(
  state: INbdistState | null
): state is INbdistState & { strategy: string; magic_line: string } {
  return state !== null && state.strategy !== null && state.magic_line !== null;
}

/** Whether the status bar item should turn red: a dead worker or a straggler. */
export function isAlert(state: INbdistState | null): boolean {
  return (
    state !== null &&
    (state.dead_workers.length > 0 || state.stragglers.length > 0)
  );
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

function formatRun(run: IRunState | null): string | null {
  if (run === null) {
    return null;
  }
  if (run.status === 'running') {
    return run.total_steps === null
      ? `step ${run.step}`
      : `step ${run.step}/${run.total_steps}`;
  }
  if (run.status === 'done') {
    return null;
  }
  return `run ${run.id} ${run.status}`;
}

/** How the status bar names a verdict's bottleneck, e.g. `input-bound`. */
export function verdictLabel(verdict: IVerdict): string {
  return BOTTLENECK_LABELS[verdict.bottleneck];
}

/**
 * The status bar text, e.g. `nbdist: mirrored ×2`, `nbdist: multiworker ×2 · workers 1/2` or
 * `nbdist: mirrored ×4 · step 120/1000 · input-bound`.
 */
export function formatStatus(state: INbdistState): string {
  if (state.strategy === null) {
    return 'nbdist: no strategy';
  }
  const parts = [`nbdist: ${state.strategy} ×${state.replicas}`];
  if (state.workers_total > 0) {
    parts.push(`workers ${state.workers_alive}/${state.workers_total}`);
  }
  if (state.dead_workers.length > 0) {
    parts.push(`${state.dead_workers.length} dead`);
  }
  if (state.stragglers.length === 1) {
    parts.push(`straggler ${state.stragglers[0]}`);
  } else if (state.stragglers.length > 1) {
    parts.push(plural(state.stragglers.length, 'straggler'));
  }
  const run = formatRun(state.run);
  if (run !== null) {
    parts.push(run);
  }
  if (state.verdict !== null) {
    parts.push(verdictLabel(state.verdict));
  }
  return parts.join(' · ');
}

/** The status bar item's tooltip: everything the text leaves out. */
export function formatTooltip(state: INbdistState): string {
  const lines = [`nbdist ${state.version}`];
  if (state.magic_line === null) {
    lines.push('No strategy: run %distribute to choose one.');
  } else {
    lines.push(state.magic_line);
    lines.push(
      `${plural(state.replicas, 'replica')}` +
        (state.devices.length ? ` on ${state.devices.join(', ')}` : '')
    );
  }
  if (state.workers_total > 0) {
    lines.push(`Workers alive: ${state.workers_alive}/${state.workers_total}`);
  }
  if (state.dead_workers.length > 0) {
    lines.push(`Dead workers: ${state.dead_workers.join(', ')}`);
  }
  if (state.stragglers.length > 0) {
    lines.push(`Stragglers: ${state.stragglers.join(', ')}`);
  }
  if (state.run !== null) {
    const r = state.run;
    const total = r.total_steps === null ? '' : `/${r.total_steps}`;
    // `epoch` is counted from 1 (0: no step yet), as the dashboard's header shows it
    const epoch = r.epoch > 0 ? `epoch ${r.epoch}, ` : '';
    lines.push(`Run ${r.id}: ${r.status}, ${epoch}step ${r.step}${total}`);
  }
  if (state.verdict !== null) {
    const v = state.verdict;
    lines.push(`Bottleneck of run ${v.run} at step ${v.step}: ${verdictLabel(v)}`);
    lines.push(v.advice ?? 'Nothing to fix.');
    lines.push('%distribute explain shows where the time goes');
  }
  lines.push('Click for %distribute status');
  return lines.join('\n');
}
