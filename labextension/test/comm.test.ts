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
  run: null
};

/** A comm as the kernel connection hands it to us: records what we send. */
class FakeComm {
  constructor(readonly targetName: string) {}
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
  createComm(target: string) {
    const comm = new FakeComm(target);
    this.created.push(comm);
    return comm;
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

  it('unregisters its comm target when disposed', () => {
    const { kernel, channel } = setup();
    channel.dispose();
    expect(kernel.targets.has(COMM_TARGET)).toBe(false);
    expect(channel.isDisposed).toBe(true);
  });
});
