"""Signed frames of the metrics channel: format, signing, replay checks (it opens no socket).

A frame is::

    4-byte big-endian length N | 32-byte HMAC-SHA256 tag | N - 32 bytes of UTF-8 JSON (an object)

The tag covers the JSON bytes and is keyed with a random per-session key (``new_key``). Every
message of a connection, both ways, carries the connection's challenge (``"conn"``) and a
strictly increasing sequence number (``"seq"``), checked by ``Peer``: a frame recorded on one
connection cannot be replayed on another, or twice. A frame that fails raises ``BadFrame``
with the counter it is dropped under.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import socket
import struct
import threading
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


class Peer:
    """One end of a connection: checks the challenge and sequence of what it receives."""

    def __init__(self, sock: socket.socket, key: bytes, conn: str):
        self.sock, self.key, self.conn = sock, key, conn
        self.seq_out = 0
        self.seq_in = 0
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        """Sign ``message`` with this connection's challenge and next sequence number."""
        with self.lock:
            self.seq_out += 1
            frame = encode(self.key, {**message, "conn": self.conn, "seq": self.seq_out})
            self.sock.sendall(frame)

    def check(self, payload: bytes) -> dict[str, Any]:
        """The verified message in ``payload``; BadFrame if it fails, or is a replay."""
        message = decode(self.key, payload)
        seq = message.get("seq")
        if message.get("conn") != self.conn or not isinstance(seq, int) or seq <= self.seq_in:
            raise BadFrame("replay")
        self.seq_in = seq
        return message
