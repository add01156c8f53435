"""The authenticated metrics channel between worker processes and the kernel.

Workers send metric rows, heartbeats and stop-protocol messages to the kernel; the kernel sends
control messages (stop, resume, halt) back on the same connection. No pickle anywhere: a frame
is::

    4-byte big-endian length N | 32-byte HMAC-SHA256 tag | N - 32 bytes of UTF-8 JSON (an object)

The tag covers the JSON bytes and is keyed with a random per-session key that reaches the
workers over ipyparallel's own authenticated connection, never on a command line or in the
environment. On accepting a connection the server sends a random challenge; every later message,
both ways, carries that challenge (``"conn"``) and a strictly increasing sequence number
(``"seq"``), so a frame recorded on one connection cannot be replayed on another, or twice.
A worker's first message is ``{"type": "hello", "worker": i}``; the server attributes all later
messages of the connection to worker ``i``.

Frames that are unsigned, wrongly signed, not JSON objects, replayed or sent before ``hello``
are dropped and counted in ``ChannelServer.dropped``; an oversized frame (more than
``MAX_FRAME`` bytes) also closes its connection, as the stream cannot be resynchronised.
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import json
import math
import queue
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

MAX_FRAME = 1 << 20
TAG_BYTES = 32
_HEADER = struct.Struct(">I")


class BadFrame(Exception):
    """A frame that fails verification; ``reason`` is the counter it is dropped under."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def new_key() -> bytes:
    """A fresh random session key."""
    return secrets.token_bytes(32)


def _clean(value: Any) -> Any:
    """NaN/inf are not JSON: send them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def encode(key: bytes, message: dict[str, Any]) -> bytes:
    """One signed frame (header included) carrying ``message``."""
    body = json.dumps(_clean(message), separators=(",", ":"), allow_nan=False).encode()
    tag = hmac.new(key, body, hashlib.sha256).digest()
    return _HEADER.pack(len(body) + TAG_BYTES) + tag + body


def decode(key: bytes, payload: bytes) -> dict[str, Any]:
    """Verify and parse a frame's payload (tag + body); raise BadFrame if it fails."""
    if len(payload) <= TAG_BYTES:
        raise BadFrame("malformed")
    tag, body = payload[:TAG_BYTES], payload[TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, body, hashlib.sha256).digest()):
        raise BadFrame("bad_signature")
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise BadFrame("malformed") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise BadFrame("malformed")
    return message


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> bytes | None:
    """The next payload from ``sock``; None at end of stream; BadFrame("too_large")."""
    header = _read_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise BadFrame("too_large")
    return _read_exact(sock, size)


class _Peer:
    """One end of a connection: checks the challenge and sequence of what it receives."""

    def __init__(self, sock: socket.socket, key: bytes, conn: str):
        self.sock, self.key, self.conn = sock, key, conn
        self.seq_out = 0
        self.seq_in = 0
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        with self.lock:
            self.seq_out += 1
            frame = encode(self.key, {**message, "conn": self.conn, "seq": self.seq_out})
            self.sock.sendall(frame)

    def check(self, payload: bytes) -> dict[str, Any]:
        message = decode(self.key, payload)
        seq = message.get("seq")
        if message.get("conn") != self.conn or not isinstance(seq, int) or seq <= self.seq_in:
            raise BadFrame("replay")
        self.seq_in = seq
        return message


class ChannelServer:
    """The kernel's end: accepts worker connections and hands verified messages to ``handler``.

    ``handler(worker, message)`` runs on the connection's reader thread; keep it short.
    """

    def __init__(self, key: bytes, handler: Callable[[int, dict[str, Any]], None],
                 host: str = "127.0.0.1", port: int = 0):
        self.key, self.handler = key, handler
        self.received = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._peers: dict[int, _Peer] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(0.5)
        self._threads: list[threading.Thread] = []
        self._start(self._accept_loop, "nbdist-channel-accept")

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def _start(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._start(self._serve, "nbdist-channel-reader", sock)

    def _serve(self, sock: socket.socket) -> None:
        peer = _Peer(sock, self.key, secrets.token_hex(16))
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
                    if message["type"] != "hello" or not isinstance(message.get("worker"), int):
                        self._drop("no_hello")
                        continue
                    worker = message["worker"]
                    with self._lock:
                        self._peers[worker] = peer
                with self._lock:
                    self.received += 1
                self.handler(worker, message)
        except OSError:
            return
        finally:
            with self._lock:
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
        self._closed.set()
        self._sock.close()
        with self._lock:
            peers = list(self._peers.values())
        for peer in peers:
            try:
                peer.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class ChannelClient:
    """A worker's end: sends messages from a background thread, receives control messages.

    ``send`` never blocks the training loop: messages wait in a queue (the oldest are dropped
    past ``max_queue``). ``on_message(message)`` runs on the reader thread.
    """

    def __init__(self, address: tuple[str, int], key: bytes, worker: int,
                 on_message: Callable[[dict[str, Any]], None] | None = None,
                 timeout: float = 10.0, max_queue: int = 10000):
        self.worker = worker
        self.on_message = on_message
        self.dropped: collections.Counter[str] = collections.Counter()
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(max_queue)
        sock = socket.create_connection(address, timeout=timeout)
        payload = read_frame(sock)
        if payload is None:
            raise ConnectionError("the nbdist channel closed before its challenge")
        challenge = decode(key, payload)
        if challenge.get("type") != "challenge" or not isinstance(challenge.get("conn"), str):
            raise ConnectionError("the nbdist channel sent no valid challenge")
        sock.settimeout(None)
        self._peer = _Peer(sock, key, challenge["conn"])
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
