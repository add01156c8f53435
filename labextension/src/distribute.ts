/**
 * The Distribute-cell command: put the kernel's strategy on the active code cell's
 * `%%distribute` line, or, with no strategy yet, open the strategy picker above it.
 */

import { NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import {
  MagicLineError,
  applyDistributeLine,
  pickerCellSource
} from './magicline';
import { INbdistState, hasStrategy } from './state';

export const COMMAND_ID = 'nbdist:distribute-cell';

/** What the command did, for callers and tests. */
export type DistributeOutcome =
  | 'inserted'
  | 'updated'
  | 'unchanged'
  | 'picker'
  | 'no-cell';

/**
 * Run the command on a notebook panel.
 *
 * @param state - the kernel's nbdist state (null: nbdist not loaded in that kernel).
 * @param defaultStrategyLine - used instead of the picker when the kernel has no strategy.
 * @throws MagicLineError when the cell (not code, or not Python) or the strategy line cannot
 *   be used.
 */
export async function distributeActiveCell(
  panel: NotebookPanel,
  state: INbdistState | null,
  defaultStrategyLine: string
): Promise<DistributeOutcome> {
  const notebook = panel.content;
  const cell = notebook.activeCell;
  if (cell === null || notebook.model === null) {
    return 'no-cell';
  }
  const line = hasStrategy(state)
    ? state.magic_line
    : defaultStrategyLine.trim() || null;
  if (line !== null) {
    if (cell.model.type !== 'code') {
      throw new MagicLineError(
        `The active cell is a ${cell.model.type} cell: select a code cell to distribute it.`
      );
    }
    const shared = cell.model.sharedModel;
    const result = applyDistributeLine(shared.getSource(), line);
    if (result.action !== 'unchanged') {
      shared.setSource(result.source);
    }
    return result.action;
  }
  const index = notebook.activeCellIndex;
  notebook.model.sharedModel.insertCell(index, {
    cell_type: 'code',
    source: pickerCellSource(state !== null)
  });
  notebook.deselectAll();
  notebook.activeCellIndex = index;
  await NotebookActions.run(notebook, panel.sessionContext);
  return 'picker';
}
