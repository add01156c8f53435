/**
 * The status bar item: the current kernel's strategy, replicas, workers and running step,
 * red when a worker is dead or a straggler is flagged; a click shows `%distribute status`.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { KernelChannel } from './comm';
import { INbdistState, formatStatus, formatTooltip, isAlert } from './state';

/** Set on the item when a worker is dead or a straggler is flagged. */
export const ALERT_CLASS = 'nbdist-status-alert';

export class NbdistStatusItem extends Widget {
  constructor(onClick: () => void) {
    super({ node: document.createElement('div') });
    this.addClass('nbdist-status-item');
    this.addClass('jp-StatusBar-TextItem');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this.node.addEventListener('click', onClick);
    this.node.addEventListener('keydown', (event: KeyboardEvent) => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        onClick();
      }
    });
  }

  /** Show a state (null: nothing to show; the status bar hides the item). */
  showState(state: INbdistState | null): void {
    this.toggleClass(ALERT_CLASS, isAlert(state));
    this.node.textContent = state === null ? '' : formatStatus(state);
    this.node.title = state === null ? '' : formatTooltip(state);
  }
}

/**
 * Ask the kernel for `%distribute status` and show it in a dialog. The dialog opens at once
 * and fills in when the kernel answers (it answers only when idle).
 */
export async function showStatusDialog(channel: KernelChannel | null): Promise<void> {
  const body = new Widget({ node: document.createElement('pre') });
  body.addClass('nbdist-status-text');
  if (channel === null) {
    body.node.textContent = 'This notebook has no kernel.';
  } else {
    body.node.textContent = 'Waiting for the kernel (it answers when idle)…';
    channel.requestStatus().then(
      text => {
        body.node.textContent = text;
      },
      (err: Error) => {
        body.node.textContent = err.message;
      }
    );
  }
  await showDialog({
    title: 'nbdist status',
    body,
    buttons: [Dialog.okButton({ label: 'Close' })]
  });
}
