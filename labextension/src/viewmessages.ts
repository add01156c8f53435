/**
 * The messages that bring a live dashboard to a page that connected while its run goes on
 * (kernel side: `view_message` and `final_message` in `nbdist/widgets/dashboard.py`):
 *
 *     {"type": "dashboard", "token": T, "run": N | null, "bundle": {...}, "cell": {...}}
 *     {"type": "final", "run": N, "views": [model ids], "figure": {...}, "summary": {...}}
 */

/** A display bundle: mime type -> data. */
export type Bundle = Record<string, unknown>;

/** Where the kernel runs the cell: its id as the page that ran it knows it, and its code. */
export interface IRunningCell {
  id: string | null;
  code: string | null;
}

/** The answer to a request for a view; `run` is null when no run is live. */
export interface IViewReply {
  type: 'dashboard';
  token: string;
  run: number | null;
  bundle: Bundle | null;
  cell: IRunningCell;
}

/** What replaces the views `views` (widget model ids) of run `run` when it ends. */
export interface IFinalFigure {
  type: 'final';
  run: number;
  views: string[];
  figure: Bundle;
  summary: Bundle;
}

export type ViewMessage = IViewReply | IFinalFigure;

type Dict = Record<string, unknown>;

function isDict(value: unknown): value is Dict {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function fail(where: string, expected: string): never {
  throw new Error(`nbdist view message: ${where} must be ${expected}`);
}

/** Whether `data` is one of these messages (by its type; `parseViewMessage` checks it). */
export function isViewMessage(data: unknown): boolean {
  return isDict(data) && (data.type === 'dashboard' || data.type === 'final');
}

function optionalString(value: unknown, where: string): string | null {
  if (value === null || value === undefined) {
    return null;
  }
  return typeof value === 'string' ? value : fail(where, 'a string or null');
}

/** Validate a view message; throws on any other shape. */
export function parseViewMessage(data: unknown): ViewMessage {
  if (!isDict(data)) {
    return fail('message', 'an object');
  }
  if (data.type === 'dashboard') {
    if (typeof data.token !== 'string') {
      fail('token', 'a string');
    }
    if (data.run === null) {
      return {
        type: 'dashboard',
        token: data.token,
        run: null,
        bundle: null,
        cell: { id: null, code: null }
      };
    }
    if (typeof data.run !== 'number') {
      fail('run', 'a number or null');
    }
    if (!isDict(data.bundle)) {
      fail('bundle', 'an object');
    }
    const cell = isDict(data.cell) ? data.cell : {};
    return {
      type: 'dashboard',
      token: data.token,
      run: data.run,
      bundle: data.bundle,
      cell: {
        id: optionalString(cell.id, 'cell.id'),
        code: optionalString(cell.code, 'cell.code')
      }
    };
  }
  if (data.type === 'final') {
    if (typeof data.run !== 'number') {
      fail('run', 'a number');
    }
    if (!Array.isArray(data.views) || !data.views.every(v => typeof v === 'string')) {
      fail('views', 'a list of strings');
    }
    if (!isDict(data.figure) || !isDict(data.summary)) {
      fail('figure and summary', 'objects');
    }
    return {
      type: 'final',
      run: data.run,
      views: data.views as string[],
      figure: data.figure,
      summary: data.summary
    };
  }
  return fail('message type', '"dashboard" or "final"');
}
