/**
 * The frontend end of the "nbdist" comm: one `KernelChannel` per kernel connection keeps the
 * state the kernel sends and asks it for `%distribute status`; `NbdistStateTracker` follows
 * the current notebook's kernel. The kernel side is `nbdist/lab/comm.py`.
 *
 * A page loaded while the kernel runs a cell (a reload, a second tab) cannot ask the kernel
 * which comms it has: that request waits until the cell ends. But the kernel's state
 * messages reach every page (IOPub), so the channel takes the comm id from the first one it
 * sees and talks on that comm: the kernel sees a request for the live dashboard as soon as it
 * arrives (`requestDashboard`, `recover.ts`).
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IFinalFigure,
  IViewReply,
  isViewMessage,
  parseViewMessage
} from './viewmessages';
import { INbdistState, parseMessage } from './state';

/** The comm target nbdist's kernel side opens (and accepts) comms on. */
export const COMM_TARGET = 'nbdist';

/** How long to wait for `%distribute status` (the kernel answers only when idle). */
export const STATUS_TIMEOUT_MS = 120_000;

/** How long to wait for a view of the live dashboard (it comes with the run's next step). */
export const VIEW_TIMEOUT_MS = 120_000;

/** The nbdist comm(s) of one kernel connection and the last state they carried. */
export class KernelChannel implements IDisposable {
  constructor(kernel: Kernel.IKernelConnection) {
    this._kernel = kernel;
    kernel.registerCommTarget(COMM_TARGET, this._onCommOpen);
    kernel.statusChanged.connect(this._onStatus, this);
    kernel.iopubMessage.connect(this._onIopub, this);
    void this._reattach();
  }

  /** Emitted when a run whose views were recovered ends: what replaces them. */
  get finalFigure(): ISignal<this, IFinalFigure> {
    return this._finalFigure;
  }

  /**
   * Ask the kernel for a view of its live dashboard (answered at the run's next redraw, even
   * while the cell runs); resolves with the reply, whose `run` is null when nothing is live.
   */
  requestDashboard(timeoutMs: number = VIEW_TIMEOUT_MS): Promise<IViewReply> {
    const comm = this._comms[this._comms.length - 1];
    if (comm === undefined) {
      return Promise.reject(new Error('nbdist is not loaded in this kernel.'));
    }
    const token = `view-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
    return new Promise<IViewReply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this._views.delete(token);
        reject(new Error('The kernel sent no view of its live dashboard.'));
      }, timeoutMs);
      this._views.set(token, { resolve, reject, timer });
      comm.send({ type: 'request', what: 'dashboard', token });
    });
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
    this._failViews('The kernel connection closed.');
    this._kernel.iopubMessage.disconnect(this._onIopub, this);
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

  /**
   * A state message on a comm this page does not know: the kernel's nbdist comm, opened for
   * the page that was here before a reload. Talk on it (never close it: it is every page's).
   */
  private _onIopub(
    _: Kernel.IKernelConnection,
    msg: KernelMessage.IIOPubMessage
  ): void {
    if (this._isDisposed || this._comms.length > 0 || msg.header.msg_type !== 'comm_msg') {
      return;
    }
    const content = (msg as KernelMessage.ICommMsgMsg).content;
    const data = content.data as { type?: unknown } | undefined;
    if (data?.type !== 'state' || this._kernel.hasComm(content.comm_id)) {
      return;
    }
    try {
      parseMessage(data);
    } catch {
      return; // not nbdist's
    }
    this._attach(this._kernel.createComm(COMM_TARGET, content.comm_id));
    this._handle(data);
  }

  private _handle(data: unknown): void {
    if (isViewMessage(data)) {
      this._handleView(data);
      return;
    }
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

  private _handleView(data: unknown): void {
    let msg;
    try {
      msg = parseViewMessage(data);
    } catch (err) {
      console.warn('nbdist: ignoring a malformed message from the kernel', err);
      return;
    }
    if (msg.type === 'final') {
      this._finalFigure.emit(msg);
      return;
    }
    const pending = this._views.get(msg.token);
    if (pending !== undefined) {
      this._views.delete(msg.token);
      clearTimeout(pending.timer);
      pending.resolve(msg);
    }
  }

  private _failViews(reason: string): void {
    const views = [...this._views.values()];
    this._views.clear();
    for (const v of views) {
      clearTimeout(v.timer);
      v.reject(new Error(reason));
    }
  }

  private _onStatus(_: Kernel.IKernelConnection, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._comms = [];
      this._setState(null);
      this._failPending(`The kernel is ${status}.`);
      this._failViews(`The kernel is ${status}.`);
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
  private _views = new Map<
    string,
    {
      resolve: (reply: IViewReply) => void;
      reject: (err: Error) => void;
      timer: ReturnType<typeof setTimeout>;
    }
  >();
  private _finalFigure = new Signal<this, IFinalFigure>(this);
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
