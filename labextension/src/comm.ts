/**
 * The frontend end of the "nbdist" comm: one `KernelChannel` per kernel connection keeps the
 * state the kernel sends and asks it for `%distribute status`; `NbdistStateTracker` follows
 * the current notebook's kernel. The kernel side is `nbdist/lab/comm.py`.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { INbdistState, parseMessage } from './state';

/** The comm target nbdist's kernel side opens (and accepts) comms on. */
export const COMM_TARGET = 'nbdist';

/** How long to wait for `%distribute status` (the kernel answers only when idle). */
export const STATUS_TIMEOUT_MS = 120_000;

/** The nbdist comm(s) of one kernel connection and the last state they carried. */
export class KernelChannel implements IDisposable {
  constructor(kernel: Kernel.IKernelConnection) {
    this._kernel = kernel;
    kernel.registerCommTarget(COMM_TARGET, this._onCommOpen);
    kernel.statusChanged.connect(this._onStatus, this);
    void this._reattach();
  }

  /** The kernel's nbdist state; null until nbdist's comm has spoken. */
  get state(): INbdistState | null {
    return this._state;
  }

  /** Emitted with the new state (null when nbdist's comm closes or the kernel restarts). */
  get stateChanged(): ISignal<this, INbdistState | null> {
    return this._stateChanged;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Ask the kernel for the text of `%distribute status`. */
  requestStatus(timeoutMs: number = STATUS_TIMEOUT_MS): Promise<string> {
    const comm = this._comms[this._comms.length - 1];
    if (comm === undefined) {
      return Promise.reject(
        new Error('nbdist is not loaded in this kernel: run %load_ext nbdist.')
      );
    }
    return new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending = this._pending.filter(p => p.resolve !== resolve);
        reject(
          new Error(
            'The kernel did not answer: it answers when idle. ' +
              'Run %distribute status in a cell instead.'
          )
        );
      }, timeoutMs);
      this._pending.push({ resolve, reject, timer });
      comm.send({ type: 'request', what: 'status' });
    });
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._failPending('The kernel connection closed.');
    try {
      this._kernel.removeCommTarget(COMM_TARGET, this._onCommOpen);
    } catch {
      // the kernel connection may already be disposed
    }
    this._kernel.statusChanged.disconnect(this._onStatus, this);
    this._comms = [];
    Signal.clearData(this);
  }

  private _onCommOpen = (
    comm: Kernel.IComm,
    msg: KernelMessage.ICommOpenMsg
  ): void => {
    this._attach(comm);
    this._handle(msg.content.data);
  };

  private _attach(comm: Kernel.IComm): void {
    this._comms.push(comm);
    comm.onMsg = msg => this._handle(msg.content.data);
    comm.onClose = () => {
      this._comms = this._comms.filter(c => c !== comm);
      if (this._comms.length === 0) {
        this._setState(null);
        this._failPending('nbdist closed its channel.');
      }
    };
  }

  /** After a page reload the kernel's comm is unknown here: open one of our own. */
  private async _reattach(): Promise<void> {
    try {
      const reply = await this._kernel.requestCommInfo({
        target_name: COMM_TARGET
      });
      const content = reply.content;
      if (
        this._isDisposed ||
        content.status !== 'ok' ||
        this._comms.length > 0 ||
        Object.keys(content.comms).length === 0
      ) {
        return;
      }
      const comm = this._kernel.createComm(COMM_TARGET);
      this._attach(comm);
      comm.open({ type: 'request', what: 'state' });
    } catch (err) {
      console.debug('nbdist: could not look for an existing nbdist comm', err);
    }
  }

  private _handle(data: unknown): void {
    let msg;
    try {
      msg = parseMessage(data);
    } catch (err) {
      console.warn('nbdist: ignoring a malformed message from the kernel', err);
      return;
    }
    if (msg.type === 'state') {
      this._setState(msg.state);
    } else {
      const pending = this._pending;
      this._pending = [];
      for (const p of pending) {
        clearTimeout(p.timer);
        p.resolve(msg.text);
      }
    }
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._comms = [];
      this._setState(null);
      this._failPending(`The kernel is ${status}.`);
    }
  }

  private _setState(state: INbdistState | null): void {
    if (this._isDisposed || (state === null && this._state === null)) {
      return;
    }
    this._state = state;
    this._stateChanged.emit(state);
  }

  private _failPending(reason: string): void {
    const pending = this._pending;
    this._pending = [];
    for (const p of pending) {
      clearTimeout(p.timer);
      p.reject(new Error(reason));
    }
  }

  private _kernel: Kernel.IKernelConnection;
  private _comms: Kernel.IComm[] = [];
  private _state: INbdistState | null = null;
  private _stateChanged = new Signal<this, INbdistState | null>(this);
  private _pending: Array<{
    resolve: (text: string) => void;
    reject: (err: Error) => void;
    timer: ReturnType<typeof setTimeout>;
  }> = [];
  private _isDisposed = false;
}

/**
 * Follows the current notebook's kernel: a `KernelChannel` for every kernel connection a
 * notebook uses, and the state of the current one.
 */
export class NbdistStateTracker implements IDisposable {
  constructor(notebooks: INotebookTracker) {
    this._notebooks = notebooks;
    notebooks.widgetAdded.connect((_, panel) => this._watch(panel));
    notebooks.currentChanged.connect(this._update, this);
    notebooks.forEach(panel => this._watch(panel));
    this._update();
  }

  /** The channel of the current notebook's kernel, if it has one. */
  get current(): KernelChannel | null {
    return this._current;
  }

  /** The nbdist state of the current notebook's kernel (null: none, or nbdist not loaded). */
  get state(): INbdistState | null {
    return this._current?.state ?? null;
  }

  /** Emitted when the current notebook, its kernel or that kernel's state changes. */
  get changed(): ISignal<this, INbdistState | null> {
    return this._changed;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** The channel for a session's kernel, created on first use. */
  channelFor(sessionContext: ISessionContext): KernelChannel | null {
    const kernel = sessionContext.session?.kernel ?? null;
    if (kernel === null || kernel.isDisposed) {
      return null;
    }
    let channel = this._channels.get(kernel);
    if (channel === undefined) {
      channel = new KernelChannel(kernel);
      this._channels.set(kernel, channel);
      kernel.disposed.connect(() => {
        this._channels.get(kernel)?.dispose();
        this._channels.delete(kernel);
        this._update();
      });
    }
    return channel;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._channels.forEach(channel => channel.dispose());
    this._channels.clear();
    Signal.clearData(this);
  }

  private _watch(panel: NotebookPanel): void {
    const ctx = panel.sessionContext;
    const onKernel = () => {
      this.channelFor(ctx);
      this._update();
    };
    ctx.kernelChanged.connect(onKernel);
    panel.disposed.connect(() => ctx.kernelChanged.disconnect(onKernel));
    void ctx.ready.then(onKernel).catch(() => undefined);
    onKernel();
  }

  private _update(): void {
    if (this._isDisposed) {
      return;
    }
    const panel = this._notebooks.currentWidget;
    const channel = panel ? this.channelFor(panel.sessionContext) : null;
    if (channel !== this._current) {
      this._current?.stateChanged.disconnect(this._emit, this);
      this._current = channel;
      channel?.stateChanged.connect(this._emit, this);
    }
    this._emit();
  }

  private _emit(): void {
    this._changed.emit(this.state);
  }

  private _notebooks: INotebookTracker;
  private _channels = new Map<Kernel.IKernelConnection, KernelChannel>();
  private _current: KernelChannel | null = null;
  private _changed = new Signal<this, INbdistState | null>(this);
  private _isDisposed = false;
}
