/**
 * A live dashboard saved while its run was going on (JupyterLab autosaves) is a widget view
 * whose model lives only in that kernel. When the run ends with the page open, nbdist replaces
 * it with the final figure; when the page was closed, or the kernel is gone, the saved view
 * would show "Error displaying widget: model not found". On opening a notebook, the views of
 * runs its kernel is not running are replaced with their text: which run it was and why the
 * figure is missing. A view of the run the kernel is running now is left alone: `recover.ts`
 * puts a live view in its place. The kernel's nbdist state decides, which a busy kernel sends
 * too (it answers the question "is nbdist loaded?" only once the cell ends).
 */

import type * as nbformat from '@jupyterlab/nbformat';
import type { NotebookPanel } from '@jupyterlab/notebook';

import { INbdistState } from './state';

export const WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json';
/** How `nbdist/widgets/run_view.py` starts the text of a live dashboard's output. */
export const LIVE_TEXT = 'nbdist live dashboard of Run ';

/** The run id of a live dashboard's output; null for any other output. */
export function dashboardRun(output: nbformat.IOutput): number | null {
  const data = (output as { data?: Record<string, unknown> }).data;
  if (!data || !(WIDGET_VIEW in data)) {
    return null;
  }
  const raw = data['text/plain'];
  const text = Array.isArray(raw) ? raw.join('') : raw;
  if (typeof text !== 'string' || !text.startsWith(LIVE_TEXT)) {
    return null;
  }
  const id = parseInt(text.slice(LIVE_TEXT.length), 10);
  return Number.isNaN(id) ? null : id;
}

/** The run the kernel is running now (null: none, or nbdist is not loaded there). */
export function liveRun(state: INbdistState | null): number | null {
  return state?.run?.status === 'running' ? state.run.id : null;
}

/**
 * What replaces the view of run `id`. `ranSince` is the id of the kernel's latest run (null:
 * none, or nbdist is not loaded): a kernel that got as far as run `id` most likely ran it, and
 * keeps it in `nbdist.runs`; else it was another kernel (or this one before a restart).
 */
export function staleOutput(id: number, ranSince: number | null = null): nbformat.IDisplayData {
  const redraw = `nbdist.runs[${id - 1}].plot()`;
  const why =
    ranSince !== null && ranSince >= id
      ? `; the run has ended since, and its final figure went to the page open then. ${redraw} draws it again.`
      : `; this kernel did not run it (it restarted, or it is another one). In the kernel that ran it, ${redraw} redraws it.`;
  return {
    output_type: 'display_data',
    metadata: {},
    data: {
      'text/plain': `nbdist: the live dashboard of Run ${id} was saved while it ran${why}`
    }
  };
}

/** Replace the views of runs other than `live` in `panel`; returns how many were replaced. */
export function replaceStaleViews(
  panel: NotebookPanel,
  live: number | null,
  ranSince: number | null = null
): number {
  let replaced = 0;
  const cells = panel.content.model?.cells;
  if (!cells) {
    return 0;
  }
  for (let c = 0; c < cells.length; c++) {
    const cell = cells.get(c);
    if (cell.type !== 'code') {
      continue;
    }
    const outputs = (cell as any).outputs;
    for (let i = 0; i < outputs.length; i++) {
      const id = dashboardRun(outputs.get(i).toJSON());
      if (id !== null && id !== live) {
        outputs.set(i, staleOutput(id, ranSince));
        replaced++;
      }
    }
  }
  return replaced;
}

/**
 * Once the notebook and its kernel are ready: ask the kernel whether nbdist is loaded (and
 * which run it is running), then replace the stale views. `state()` is the kernel's nbdist
 * state as the status bar tracker has it; it is polled for up to `waitMs`.
 */
export async function repairStaleDashboards(
  panel: NotebookPanel,
  state: () => INbdistState | null,
  waitMs = 10_000
): Promise<number> {
  await panel.context.ready;
  const hasViews = () => {
    const cells = panel.content.model?.cells;
    for (let c = 0; cells && c < cells.length; c++) {
      const outputs = (cells.get(c) as any).outputs;
      for (let i = 0; outputs && i < outputs.length; i++) {
        if (dashboardRun(outputs.get(i).toJSON()) !== null) {
          return true;
        }
      }
    }
    return false;
  };
  if (!hasViews()) {
    return 0;
  }
  await panel.sessionContext.ready;
  const kernel = panel.sessionContext.session?.kernel ?? null;
  if (kernel === null) {
    return replaceStaleViews(panel, null); // no kernel: no widget model anywhere
  }
  // How many nbdist comms the kernel has: null until it answers (once idle).
  const kernelHas: { comms: number | null } = { comms: null };
  const info = kernel.requestCommInfo({ target_name: 'nbdist' }).then(
    reply => {
      kernelHas.comms =
        reply.content.status === 'ok' ? Object.keys(reply.content.comms).length : -1;
    },
    () => {
      kernelHas.comms = -1;
    }
  );
  const wait = async (until: () => boolean) => {
    const deadline = Date.now() + waitMs;
    while (!until() && Date.now() < deadline) {
      await new Promise(resolve => setTimeout(resolve, 200));
    }
  };
  await wait(() => state() !== null || kernelHas.comms !== null);
  if (state() === null) {
    await info; // busy with no run of nbdist's going on: it answers when idle
    const comms = kernelHas.comms;
    if (comms === 0) {
      return replaceStaleViews(panel, null); // nbdist not loaded: no run of its is live
    }
    if (comms === null || comms < 0) {
      return 0;
    }
    await wait(() => state() !== null);
  }
  const current = state();
  return current === null
    ? 0
    : replaceStaleViews(panel, liveRun(current), current.run?.id ?? null);
}
