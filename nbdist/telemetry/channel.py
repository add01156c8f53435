"""The authenticated metrics channel between worker processes and the kernel.

Workers send metric rows, heartbeats and stop-protocol messages to the kernel; the kernel sends
control messages (stop, resume, halt) back on the same connection, as signed JSON frames (no
pickle anywhere; the format, signing and replay checks are in ``frames``). The session key
reaches the workers over ipyparallel's own authenticated connection, never on a command line
or in the environment. On accepting a connection the server sends a random challenge that
every later message of the connection carries. A worker's first message is ``{"type":
"hello", "worker": i}``; the server attributes all later messages of the connection to worker
``i``.

Frames that are unsigned, wrongly signed, not JSON objects, replayed or sent before ``hello``
are dropped and counted in ``ChannelServer.dropped``; an oversized frame (more than
``MAX_FRAME`` bytes) also closes its connection, as the stream cannot be resynchronised.
The server binds 127.0.0.1 unless told otherwise; a host that is a path (starting with "/")
is a Unix socket, which reaches workers in another network namespace of this machine.

Anyone who can reach the port can open connections, key or not, so the server bounds what they
cost it (each connection has a reader thread). A connection is *pending* until it sends a valid
signed ``hello``; the server closes it, counted in ``dropped``:

* ``hello_timeout``: still pending ``HELLO_DEADLINE_S`` seconds after it was accepted, however
  many frames it sent meanwhile;
* ``too_many_pending``: accepted while ``MAX_PENDING`` connections (or, if larger, the number
  of workers, so that a whole cluster can connect at once) were pending; it is closed before
  its challenge, and ``ChannelClient`` tries again until its ``timeout``;
* ``bad_worker``: its hello names a worker outside ``0 .. workers - 1`` when the server was
  given ``workers``;
* ``replaced``: a later connection said hello as the same worker (a worker that reconnected);
  the newer connection is the worker's from then on.

So a server told ``workers`` holds at most that many authenticated connections plus the pending
ones, and the threads of connections that never authenticate end within the deadline.
A process that has the key can still pose as any worker of the cluster: the key is the
boundary, these limits only keep a process without it from exhausting the kernel.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from .frames import MAX_FRAME, BadFrame, Peer, decode, encode, new_key, read_frame

__all__ = ["HELLO_DEADLINE_S", "MAX_FRAME", "MAX_PENDING", "BadFrame", "ChannelClient",
           "ChannelServer", "decode", "encode", "new_key", "read_frame"]

# A worker says hello right after reading the challenge (one round trip on a loopback or LAN),
# so seconds are generous for a worker and still bound how long an idle connection is kept.
HELLO_DEADLINE_S = 5.0
# Connections that have not said hello yet, each holding a thread; workers connect once each.
MAX_PENDING = 16
_POLL_S = 0.5   # the accept loop's longest sleep: how soon it notices close()
_RETRY_S = 0.2  # a client refused before its challenge (pending connections full) retries


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or on the Unix socket ``host`` (a path)."""
    if not host.startswith("/"):
        return socket.create_server((host, port))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(host)
        os.chmod(host, 0o600)   # the user's own processes only
        sock.listen()
    except BaseException:
        sock.close()
        raise
    return sock


def _connect(address: tuple[str, int], timeout: float) -> socket.socket:
    host = address[0]
    if not host.startswith("/"):
        return socket.create_connection(address, timeout=timeout)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(host)
    except BaseException:
        sock.close()
        raise
    return sock


def _shutdown(sock: socket.socket) -> None:
    """Wake the reader blocked on ``sock`` (it closes the socket itself, so no fd is reused)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class ChannelServer:
    """The kernel's end: accepts worker connections and hands verified messages to ``handler``.

    ``handler(worker, message)`` runs on the connection's reader thread; keep it short.
    ``workers``: the number of workers, whose ids are ``0 .. workers - 1`` (None: any id).
    ``hello_deadline`` and ``max_pending``: see the module's docstring.
    """

    def __init__(self, key: bytes, handler: Callable[[int, dict[str, Any]], None],
                 host: str = "127.0.0.1", port: int = 0, workers: int | None = None,
                 hello_deadline: float = HELLO_DEADLINE_S, max_pending: int = MAX_PENDING):
        self.key, self.handler = key, handler
        self.workers = workers
        self.hello_deadline = hello_deadline
        self.max_pending = max(max_pending, workers or 0)
        self.received = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._peers: dict[int, Peer] = {}
        self._pending: dict[socket.socket, float] = {}   # socket -> its hello deadline
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sock = _listen(host, port)
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop, "nbdist-channel-accept")

    @property
    def address(self) -> tuple[str, int]:
        """(host, port), or (path, 0) for a Unix socket."""
        name = self._sock.getsockname()
        if isinstance(name, str):
            return name, 0
        host, port = name[:2]
        return host, port

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                # Wakes at the next hello deadline, the accept thread doubling as the reaper.
                self._sock.settimeout(self._expire_pending())
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._admit(sock)

    def _expire_pending(self) -> float:
        """Close the pending connections past their deadline; seconds until the next one."""
        now = time.monotonic()
        with self._lock:
            for sock in [s for s, deadline in self._pending.items() if deadline <= now]:
                del self._pending[sock]
                self.dropped["hello_timeout"] += 1
                _shutdown(sock)   # under the lock: its reader cannot have closed it yet
            wait = min(self._pending.values(), default=now + _POLL_S) - now
        return min(max(wait, 0.01), _POLL_S)

    def _admit(self, sock: socket.socket) -> None:
        with self._lock:
            refused = self._closed.is_set() or len(self._pending) >= self.max_pending
            if not refused:
                self._pending[sock] = time.monotonic() + self.hello_deadline
            elif not self._closed.is_set():
                self.dropped["too_many_pending"] += 1
        if refused:
            sock.close()
        else:
            self._start(self._serve, "nbdist-channel-reader", sock)

    def _authenticate(self, sock: socket.socket, peer: Peer, worker: int) -> bool:
        """Make ``peer`` worker ``worker``'s connection; False if it must close instead."""
        with self._lock:
            if sock not in self._pending:   # its deadline passed while it was being read
                return False
            if self.workers is not None and not 0 <= worker < self.workers:
                self.dropped["bad_worker"] += 1
                return False
            del self._pending[sock]
            old = self._peers.get(worker)
            self._peers[worker] = peer
            if old is not None:
                self.dropped["replaced"] += 1
                _shutdown(old.sock)   # under the lock: its reader cannot have closed it yet
        return True

    def _serve(self, sock: socket.socket) -> None:
        peer = Peer(sock, self.key, secrets.token_hex(16))
        worker: int | None = None
        try:
            sock.sendall(encode(self.key, {"type": "challenge", "conn": peer.conn, "seq": 0}))
            while not self._closed.is_set():
                try:
                    payload = read_frame(sock)
                    if payload is None:
                        return
                    message = peer.check(payload)
                except BadFrame as bad:
                    self._drop(bad.reason)
                    if bad.reason == "too_large":
                        return
                    continue
                if worker is None:
                    claimed = message.get("worker")
                    if (message["type"] != "hello" or not isinstance(claimed, int)
                            or isinstance(claimed, bool)):
                        self._drop("no_hello")
                        continue
                    if not self._authenticate(sock, peer, claimed):
                        return
                    worker = claimed
                with self._lock:
                    self.received += 1
                self.handler(worker, message)
        except OSError:
            return
        finally:
            with self._lock:
                self._pending.pop(sock, None)
                if worker is not None and self._peers.get(worker) is peer:
                    del self._peers[worker]
            sock.close()

    def _drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] += 1

    def connected(self) -> list[int]:
        with self._lock:
            return sorted(self._peers)

    def send(self, worker: int, message: dict[str, Any]) -> bool:
        """Send ``message`` to ``worker``; False if it is not connected."""
        with self._lock:
            peer = self._peers.get(worker)
        if peer is None:
            return False
        try:
            peer.send(message)
        except OSError:
            return False
        return True

    def broadcast(self, message: dict[str, Any]) -> list[int]:
        """Send to every connected worker; return those it reached."""
        return [w for w in self.connected() if self.send(w, message)]

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            for sock in [*self._pending, *(peer.sock for peer in self._peers.values())]:
                _shutdown(sock)
        path = self._sock.getsockname() if self._sock.family == socket.AF_UNIX else None
        self._sock.close()
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _challenge(address: tuple[str, int], timeout: float) -> tuple[socket.socket, bytes]:
    """A connection to the server and its challenge frame, within ``timeout`` seconds.

    A server with ``max_pending`` connections pending closes new ones before their challenge:
    try again until the others have said hello or reached their deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        sock = _connect(address, max(deadline - time.monotonic(), 0.1))
        try:
            payload = read_frame(sock)
        except ConnectionResetError:
            payload = None
        except BaseException:
            sock.close()
            raise
        if payload is not None:
            return sock, payload
        sock.close()
        if time.monotonic() + _RETRY_S >= deadline:
            raise ConnectionError("the nbdist channel closed before its challenge (too many "
                                  "connections waiting for their hello?)")
        time.sleep(_RETRY_S)


class ChannelClient:
    """A worker's end: sends messages from a background thread, receives control messages.

    ``send`` never blocks the training loop: messages wait in a queue (a message sent while
    ``max_queue`` wait is dropped, counted as ``queue_full``). ``on_message(message)`` runs
    on the reader thread. ``timeout``: for connecting and receiving the server's challenge.
    """

    def __init__(self, address: tuple[str, int], key: bytes, worker: int,
                 on_message: Callable[[dict[str, Any]], None] | None = None,
                 timeout: float = 10.0, max_queue: int = 10000):
        self.worker = worker
        self.on_message = on_message
        self.dropped: collections.Counter[str] = collections.Counter()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_queue)
        sock, payload = _challenge(address, timeout)
        challenge = decode(key, payload)
        if challenge.get("type") != "challenge" or not isinstance(challenge.get("conn"), str):
            raise ConnectionError("the nbdist channel sent no valid challenge")
        sock.settimeout(None)
        self._peer = Peer(sock, key, challenge["conn"])
        self._peer.send({"type": "hello", "worker": worker})
        self._closed = threading.Event()
        for target, name in ((self._send_loop, "sender"), (self._read_loop, "reader")):
            threading.Thread(target=target, name=f"nbdist-channel-{name}", daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            self.dropped["queue_full"] += 1

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until queued messages are written (or ``timeout``)."""
        done = threading.Event()
        self.send({"type": "_flush", "_event": done})
        done.wait(timeout)

    def _send_loop(self) -> None:
        while True:
            message = self._queue.get()
            if message is None:
                return
            if message.get("type") == "_flush":
                message["_event"].set()
                continue
            try:
                self._peer.send(message)
            except OSError:
                self.dropped["send_failed"] += 1

    def _read_loop(self) -> None:
        while not self._closed.is_set():
            try:
                payload = read_frame(self._peer.sock)
                if payload is None:
                    return
                message = self._peer.check(payload)
            except BadFrame as bad:
                self.dropped[bad.reason] += 1
                if bad.reason == "too_large":
                    return
                continue
            except OSError:
                return
            if self.on_message is not None:
                self.on_message(message)

    def close(self) -> None:
        self.flush(2.0)
        self._closed.set()
        self._queue.put(None)
        try:
            self._peer.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._peer.sock.close()
