import { Signal } from '@lumino/signaling';
import { afterEach, describe, expect, it, vi } from 'vitest';

import { COMM_TARGET, KernelChannel } from '../src/comm';
import { INbdistState } from '../src/state';

const STATE: INbdistState = {
  version: '0.1.0',
  strategy: 'mirrored',
  magic_line: '%distribute mirrored --devices 2',
  replicas: 2,
  devices: [],
  workers_total: 0,
  workers_alive: 0,
  dead_workers: [],
  stragglers: [],
  run: null,
  verdict: null
};

/** A comm as the kernel connection hands it to us: records what we send. */
class FakeComm {
  constructor(
    readonly targetName: string,
    readonly commId: string = ''
  ) {}
  sent: unknown[] = [];
  opened: unknown[] = [];
  onMsg: (msg: any) => void = () => undefined;
  onClose: (msg: any) => void = () => undefined;
  send(data: unknown) {
    this.sent.push(data);
  }
  open(data: unknown) {
    this.opened.push(data);
  }
  /** The kernel sends a comm_msg. */
  receive(data: unknown) {
    this.onMsg({ content: { data } });
  }
}

/** The parts of Kernel.IKernelConnection that KernelChannel uses. */
class FakeKernel {
  targets = new Map<string, (comm: any, msg: any) => void>();
  statusChanged = new Signal<this, string>(this);
  iopubMessage = new Signal<this, any>(this);
  existingComms: Record<string, { target_name: string }> = {};
  created: FakeComm[] = [];
  registerCommTarget(name: string, cb: (comm: any, msg: any) => void) {
    this.targets.set(name, cb);
  }
  removeCommTarget(name: string, cb: unknown) {
    if (this.targets.get(name) === cb) {
      this.targets.delete(name);
    }
  }
  async requestCommInfo(content: { target_name: string }) {
    expect(content.target_name).toBe(COMM_TARGET);
    return { content: { status: 'ok', comms: this.existingComms } };
  }
  createComm(target: string, commId = 'new') {
    const comm = new FakeComm(target, commId);
    this.created.push(comm);
    return comm;
  }
  hasComm(commId: string) {
    return this.created.some(c => c.commId === commId);
  }
  /** A comm_msg on IOPub, as every page connected to the kernel receives it. */
  broadcast(commId: string, data: unknown) {
    this.iopubMessage.emit({
      header: { msg_type: 'comm_msg' },
      content: { comm_id: commId, data }
    });
  }
  /** The kernel opens a comm (LabChannel.open in nbdist/lab/comm.py). */
  kernelOpens(data: unknown): FakeComm {
    const comm = new FakeComm(COMM_TARGET);
    this.targets.get(COMM_TARGET)!(comm, { content: { data, target_name: COMM_TARGET } });
    return comm;
  }
}

function setup() {
  const kernel = new FakeKernel();
  const channel = new KernelChannel(kernel as any);
  const seen: Array<INbdistState | null> = [];
  channel.stateChanged.connect((_, s) => seen.push(s));
  return { kernel, channel, seen };
}

const flush = () => new Promise(resolve => setTimeout(resolve, 0));

afterEach(() => {
  vi.useRealTimers();
  vi.restoreAllMocks();
});

describe('KernelChannel', () => {
  it('registers the nbdist comm target and takes the state of the open message', () => {
    const { kernel, channel, seen } = setup();
    expect(kernel.targets.has(COMM_TARGET)).toBe(true);
    expect(channel.state).toBeNull();
    kernel.kernelOpens({ type: 'state', state: STATE });
    expect(channel.state).toEqual(STATE);
    expect(seen).toEqual([STATE]);
  });

  it('follows state messages and ignores malformed ones', () => {
    const { kernel, channel, seen } = setup();
    const warn = vi.spyOn(console, 'warn').mockImplementation(() => undefined);
    const comm = kernel.kernelOpens({ type: 'state', state: STATE });
    const next = { ...STATE, run: { id: 1, status: 'running', step: 3, epoch: 0, total_steps: 9 } };
    comm.receive({ type: 'state', state: next });
    comm.receive({ type: 'state', state: { ...STATE, replicas: 'two' } });
    comm.receive({ type: 'bogus' });
    expect(channel.state).toEqual(next);
    expect(seen).toHaveLength(2);
    expect(warn).toHaveBeenCalledTimes(2);
  });

  it('asks for %distribute status and resolves with the reply', async () => {
    const { kernel, channel } = setup();
    const comm = kernel.kernelOpens({ type: 'state', state: STATE });
    const reply = channel.requestStatus();
    expect(comm.sent).toEqual([{ type: 'request', what: 'status' }]);
    comm.receive({ type: 'status_text', text: 'Strategy: mirrored (2 replicas)' });
    await expect(reply).resolves.toBe('Strategy: mirrored (2 replicas)');
  });

  it('rejects a status request when nbdist is not loaded, or the kernel never answers', async () => {
    const { kernel, channel } = setup();
    await expect(channel.requestStatus()).rejects.toThrow(/not loaded/);
    vi.useFakeTimers();
    kernel.kernelOpens({ type: 'state', state: STATE });
    const reply = channel.requestStatus(1000);
    vi.advanceTimersByTime(1001);
    await expect(reply).rejects.toThrow(/did not answer/);
  });

  it('forgets the state when the comm closes or the kernel restarts', async () => {
    const { kernel, channel, seen } = setup();
    const comm = kernel.kernelOpens({ type: 'state', state: STATE });
    comm.onClose({});
    expect(channel.state).toBeNull();
    kernel.kernelOpens({ type: 'state', state: STATE });
    const reply = channel.requestStatus();
    kernel.statusChanged.emit('restarting');
    expect(channel.state).toBeNull();
    await expect(reply).rejects.toThrow(/restarting/);
    expect(seen).toEqual([STATE, null, STATE, null]);
  });

  it('after a page reload, opens its own comm when the kernel already has an nbdist comm', async () => {
    const kernel = new FakeKernel();
    kernel.existingComms = { abc: { target_name: COMM_TARGET } };
    const channel = new KernelChannel(kernel as any);
    await flush();
    expect(kernel.created).toHaveLength(1);
    const comm = kernel.created[0];
    expect(comm.targetName).toBe(COMM_TARGET);
    expect(comm.opened).toEqual([{ type: 'request', what: 'state' }]);
    comm.receive({ type: 'state', state: STATE });
    expect(channel.state).toEqual(STATE);
  });

  it('opens no comm of its own when the kernel has none (nbdist not loaded)', async () => {
    const { kernel } = setup();
    await flush();
    expect(kernel.created).toHaveLength(0);
  });

  it("while the kernel is busy, talks on the kernel's comm it hears state messages on", async () => {
    const { kernel, channel, seen } = setup();
    kernel.broadcast('widget-1', { method: 'update', state: {} }); // not nbdist's
    kernel.broadcast('other', { type: 'state', state: { bogus: true } });
    expect(kernel.created).toHaveLength(0);
    kernel.broadcast('kernel-comm', { type: 'state', state: STATE });
    expect(kernel.created.map(c => c.commId)).toEqual(['kernel-comm']);
    expect(kernel.created[0].opened).toEqual([]); // the kernel's comm: never opened again
    expect(channel.state).toEqual(STATE);
    expect(seen).toEqual([STATE]);
    kernel.broadcast('kernel-comm', { type: 'state', state: STATE }); // now handled by the comm
    expect(kernel.created).toHaveLength(1);
  });

  it('asks for a view of the live dashboard and resolves with the reply for its token', async () => {
    const { kernel, channel } = setup();
    kernel.broadcast('kernel-comm', { type: 'state', state: STATE });
    const comm = kernel.created[0];
    const reply = channel.requestDashboard();
    const sent = comm.sent[0] as { type: string; what: string; token: string };
    expect(sent).toMatchObject({ type: 'request', what: 'dashboard' });
    comm.receive({ type: 'dashboard', token: 'someone-else', run: null });
    const bundle = { 'text/plain': 'nbdist live dashboard of Run 2 (mirrored)' };
    comm.receive({ type: 'dashboard', token: sent.token, run: 2, bundle, cell: { id: 'c1' } });
    await expect(reply).resolves.toEqual({
      type: 'dashboard',
      token: sent.token,
      run: 2,
      bundle,
      cell: { id: 'c1', code: null }
    });
  });

  it('passes on the final figure of a run and gives up on a view that never comes', async () => {
    const { kernel, channel } = setup();
    const comm = kernel.kernelOpens({ type: 'state', state: STATE });
    const finals: unknown[] = [];
    channel.finalFigure.connect((_, f) => finals.push(f));
    const final = { type: 'final', run: 2, views: ['m1'], figure: { a: 1 }, summary: { b: 2 } };
    comm.receive(final);
    expect(finals).toEqual([final]);
    vi.useFakeTimers();
    const reply = channel.requestDashboard(1000);
    vi.advanceTimersByTime(1001);
    await expect(reply).rejects.toThrow(/no view/);
  });

  it('unregisters its comm target when disposed', () => {
    const { kernel, channel } = setup();
    channel.dispose();
    expect(kernel.targets.has(COMM_TARGET)).toBe(false);
    expect(channel.isDisposed).toBe(true);
  });
});
