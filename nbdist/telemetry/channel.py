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
The server binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import collections
import queue
import secrets
import socket
import threading
from collections.abc import Callable
from typing import Any

from .frames import MAX_FRAME, BadFrame, Peer, decode, encode, new_key, read_frame

__all__ = ["MAX_FRAME", "BadFrame", "ChannelClient", "ChannelServer", "decode", "encode",
           "new_key", "read_frame"]


class ChannelServer:
    """The kernel's end: accepts worker connections and hands verified messages to ``handler``.

    ``handler(worker, message)`` runs on the connection's reader thread; keep it short.
    """

    def __init__(self, key: bytes, handler: Callable[[int, dict[str, Any]], None],
                 host: str = "127.0.0.1", port: int = 0):
        self.key, self.handler = key, handler
        self.received = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self._peers: dict[int, Peer] = {}
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
