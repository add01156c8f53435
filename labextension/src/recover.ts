/**
 * The live dashboard on a page that connected while its run goes on: a reload, a second tab
 * on the notebook, the notebook opened again. That page never gets the kernel's outputs of
 * the running cell (they belong to the page that ran it) and cannot load the dashboard's
 * widgets from the kernel until the cell ends: a saved view shows "Loading widget..." and no
 * Stop button. So when the kernel's state says a run is live and this page does not run the
 * cell, it asks the kernel for a view of its own (`KernelChannel.requestDashboard`; the
 * kernel builds new widgets at the next redraw, and the widget manager gets them as any
 * widget the kernel creates), and shows it in place of the saved view, or else in the
 * running cell. When the run ends, the kernel sends the final figure and the summary, which
 * replace that view (and the picture saved under it).
 */

import type * as nbformat from '@jupyterlab/nbformat';
import type { NotebookPanel } from '@jupyterlab/notebook';

import type { KernelChannel } from './comm';
import { WIDGET_VIEW, dashboardRun, liveRun } from './staleoutputs';
import { Bundle, IFinalFigure, IViewReply } from './viewmessages';

/** The live dashboard's saved picture (`nbdist/widgets/run_view.py`, `figure.ts`). */
const LIVE_PICTURE = 'application/vnd.nbdist.live-picture.v1+json';

/** The parts of a cell's outputs this module uses (`IOutputAreaModel`). */
export interface IOutputs {
  readonly length: number;
  get(index: number): { toJSON(): nbformat.IOutput };
  set(index: number, output: nbformat.IOutput): void;
  add(output: nbformat.IOutput): number;
  clear(): void;
  toJSON(): nbformat.IOutput[];
  fromJSON(values: nbformat.IOutput[]): void;
}

/** The parts of a cell this module uses (`ICodeCellModel`). */
export interface ICell {
  readonly type: string;
  readonly id: string;
  trusted: boolean;
  readonly sharedModel: { getSource(): string };
  readonly outputs?: IOutputs;
  readonly executionState?: string;
}

/** A notebook's cells (`CellList`). */
export interface ICells {
  readonly length: number;
  get(index: number): ICell;
}

function codeCells(cells: ICells): ICell[] {
  const found: ICell[] = [];
  for (let c = 0; c < cells.length; c++) {
    const cell = cells.get(c);
    if (cell.type === 'code' && cell.outputs) {
      found.push(cell);
    }
  }
  return found;
}

function display(data: Bundle): nbformat.IDisplayData {
  return { output_type: 'display_data', metadata: {}, data: data as nbformat.IMimeBundle };
}

/** The widget model id an output shows; null for any other output. */
export function modelId(output: nbformat.IOutput): string | null {
  const data = (output as { data?: Record<string, unknown> }).data;
  const view = data?.[WIDGET_VIEW] as { model_id?: unknown } | undefined;
  return typeof view?.model_id === 'string' ? view.model_id : null;
}

/** Whether this page runs a cell now (then the kernel's outputs come here already). */
export function runsCell(cells: ICells): boolean {
  return codeCells(cells).some(cell => cell.executionState === 'running');
}

/** Whether a view of run `run` here shows a widget this page has (`known(model id)`). */
export function showsLiveView(
  cells: ICells,
  run: number,
  known: (modelId: string) => boolean
): boolean {
  for (const cell of codeCells(cells)) {
    const outputs = cell.outputs!;
    for (let i = 0; i < outputs.length; i++) {
      const output = outputs.get(i).toJSON();
      const id = modelId(output);
      if (id !== null && dashboardRun(output) === run && known(id)) {
        return true;
      }
    }
  }
  return false;
}

/**
 * Show the view of `reply` in place of the saved view of its run; else as the only output
 * of the running cell (found by id, else by its code). False when neither is here.
 *
 * A widget is drawn only in a trusted output, as the kernel's outputs of a cell run here are.
 * An untrusted cell (a notebook JupyterLab did not sign) is emptied first and then trusted,
 * as JupyterLab does when it clears a cell: no saved output gains trust.
 */
export function placeView(cells: ICells, reply: IViewReply): boolean {
  if (reply.run === null || reply.bundle === null) {
    return false;
  }
  const view = display(reply.bundle);
  const code = codeCells(cells);
  const only = (cell: ICell) => {
    cell.outputs!.clear();
    cell.trusted = true;
    cell.outputs!.add(view);
    return true;
  };
  for (const cell of code) {
    const outputs = cell.outputs!;
    for (let i = 0; i < outputs.length; i++) {
      if (dashboardRun(outputs.get(i).toJSON()) === reply.run) {
        if (!cell.trusted) {
          return only(cell);
        }
        outputs.set(i, view);
        return true;
      }
    }
  }
  const running =
    code.find(cell => reply.cell.id !== null && cell.id === reply.cell.id) ??
    code.find(cell => reply.cell.code !== null && cell.sharedModel.getSource() === reply.cell.code);
  return running === undefined ? false : only(running);
}

/**
 * The run of `final` ended: its views here give way to the final figure, then the summary;
 * the picture saved under them goes (the figure says it all). Returns how many views.
 */
export function applyFinal(cells: ICells, final: IFinalFigure): number {
  const views = new Set(final.views);
  let replaced = 0;
  for (const cell of codeCells(cells)) {
    const before = cell.outputs!.toJSON();
    if (!before.some(output => views.has(modelId(output) ?? ''))) {
      continue;
    }
    const after: nbformat.IOutput[] = [];
    for (const output of before) {
      const data = (output as { data?: Record<string, unknown> }).data;
      const picture = data?.[LIVE_PICTURE] as { run?: unknown } | undefined;
      if (views.has(modelId(output) ?? '')) {
        after.push(display(final.figure), display(final.summary));
        replaced++;
      } else if (picture?.run !== final.run) {
        after.push(output);
      }
    }
    cell.outputs!.fromJSON(after);
  }
  return replaced;
}

/**
 * Keep `panel` showing its kernel's live dashboard: whenever the kernel's state says a run
 * is live and this page neither runs the cell nor shows a working view of it, ask for a view
 * once per run; apply the final figure when it comes.
 */
export function followLiveRuns(
  panel: NotebookPanel,
  channelFor: () => KernelChannel | null
): void {
  let channel: KernelChannel | null = null;
  let asked = new Set<number>();
  const cells = () => (panel.content.model?.cells as unknown as ICells | undefined) ?? null;

  const check = async () => {
    const current = channel;
    const run = liveRun(current?.state ?? null);
    const kernel = panel.sessionContext.session?.kernel ?? null;
    if (current === null || run === null || asked.has(run) || kernel === null) {
      return;
    }
    asked.add(run);
    await panel.context.ready;
    const list = cells();
    if (list === null || runsCell(list) || showsLiveView(list, run, id => kernel.hasComm(id))) {
      return;
    }
    let reply: IViewReply;
    try {
      reply = await current.requestDashboard();
    } catch (err) {
      asked.delete(run); // asked again at the next state
      console.debug('nbdist: no view of the live dashboard', err);
      return;
    }
    const now = cells();
    if (reply.run !== null && now !== null && !placeView(now, reply)) {
      console.warn(
        `nbdist: the kernel sent a view of Run ${reply.run}, but its cell is not in this notebook.`
      );
    }
  };
  const onState = () => void check();
  const onFinal = (_: KernelChannel, final: IFinalFigure) => {
    const list = cells();
    if (list !== null) {
      applyFinal(list, final);
    }
  };
  const connect = () => {
    const next = panel.isDisposed ? null : channelFor();
    if (next === channel) {
      return;
    }
    channel?.stateChanged.disconnect(onState);
    channel?.finalFigure.disconnect(onFinal);
    channel = next;
    asked = new Set<number>(); // another kernel: its own run ids
    channel?.stateChanged.connect(onState);
    channel?.finalFigure.connect(onFinal);
    void check();
  };
  panel.sessionContext.kernelChanged.connect(connect);
  void panel.sessionContext.ready.then(connect).catch(() => undefined);
  panel.disposed.connect(() => {
    panel.sessionContext.kernelChanged.disconnect(connect);
    channel?.stateChanged.disconnect(onState);
    channel?.finalFigure.disconnect(onFinal);
    channel = null;
  });
  connect();
}
