"""The authenticated metrics channel: signed JSON frames, loopback only, bad frames dropped."""

import hashlib
import hmac
import json
import socket
import struct
import threading
import time

import psutil
import pytest

from nbdist.telemetry import channel as ch


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def server():
    got = []
    key = ch.new_key()
    srv = ch.ChannelServer(key, lambda worker, message: got.append((worker, message)))
    srv.got = got
    srv.key = key
    yield srv
    srv.close()


def raw_connect(server):
    """A socket that passed the challenge; returns (socket, conn id)."""
    sock = socket.create_connection(server.address)
    challenge = ch.decode(server.key, ch.read_frame(sock))
    return sock, challenge["conn"]


def test_roundtrip_both_ways_and_nan_becomes_null(server):
    replies = []
    client = ch.ChannelClient(server.address, server.key, 3, on_message=replies.append)
    client.send({"type": "rows", "rows": [[0, float("nan"), 1.5]]})
    assert wait_for(lambda: len(server.got) == 2)
    (w0, hello), (w1, rows) = server.got
    assert (w0, hello["type"], w1) == (3, "hello", 3)
    assert rows["rows"] == [[0, None, 1.5]]
    assert wait_for(lambda: server.connected() == [3])
    assert server.send(3, {"type": "stop"})
    assert wait_for(lambda: replies and replies[0]["type"] == "stop")
    assert server.dropped == {} and client.dropped == {}
    client.close()


def test_server_binds_loopback_only(server):
    host, port = server.address
    assert host == "127.0.0.1"
    mine = [c for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]
    assert [c.laddr.ip for c in mine] == ["127.0.0.1"]


@pytest.mark.parametrize("payload, reason", [
    (b"\x00" * 32 + b'{"type": "hello", "worker": 0}', "bad_signature"),   # unsigned
    (b"short", "malformed"),
])
def test_unsigned_or_short_frames_are_dropped_and_counted(server, payload, reason):
    sock, _ = raw_connect(server)
    sock.sendall(struct.pack(">I", len(payload)) + payload)
    assert wait_for(lambda: server.dropped[reason] == 1)
    assert server.got == []
    sock.close()


def signed(key, message):
    return ch.encode(key, message)


def test_wrong_key_not_json_replay_and_no_hello_are_dropped(server):
    sock, conn = raw_connect(server)
    sock.sendall(signed(ch.new_key(), {"type": "hello", "worker": 0, "conn": conn, "seq": 1}))
    body = b"not json"
    tag = hmac.new(server.key, body, hashlib.sha256).digest()
    sock.sendall(struct.pack(">I", len(body) + 32) + tag + body)
    sock.sendall(signed(server.key, {"type": "rows", "conn": conn, "seq": 1}))   # no hello
    hello = signed(server.key, {"type": "hello", "worker": 1, "conn": conn, "seq": 2})
    sock.sendall(hello + hello)                                                   # replayed
    sock.sendall(signed(server.key, {"type": "hb", "conn": "other", "seq": 3}))   # other conn
    assert wait_for(lambda: sum(server.dropped.values()) == 5)
    assert server.dropped == {"bad_signature": 1, "malformed": 1, "no_hello": 1, "replay": 2}
    assert [m["type"] for _, m in server.got] == ["hello"]
    sock.close()


def test_frame_recorded_on_one_connection_is_refused_on_another(server):
    sock, conn = raw_connect(server)
    frame = signed(server.key, {"type": "hello", "worker": 0, "conn": conn, "seq": 1})
    sock.sendall(frame)
    other, _ = raw_connect(server)
    other.sendall(frame)
    assert wait_for(lambda: server.dropped["replay"] == 1)
    assert wait_for(lambda: len(server.got) == 1)   # each connection has its own thread
    time.sleep(0.1)
    assert len(server.got) == 1 and server.dropped["replay"] == 1
    sock.close()
    other.close()


def test_oversized_frame_closes_the_connection(server):
    sock, _ = raw_connect(server)
    sock.sendall(struct.pack(">I", ch.MAX_FRAME + 1))
    assert wait_for(lambda: server.dropped["too_large"] == 1)
    sock.settimeout(5)
    assert sock.recv(1) == b""   # closed by the server
    sock.close()


def test_client_rejects_a_forged_control_message(server):
    replies = []
    client = ch.ChannelClient(server.address, server.key, 0, on_message=replies.append)
    assert wait_for(lambda: server.connected() == [0])
    peer = server._peers[0]
    body = json.dumps({"type": "halt", "conn": peer.conn, "seq": 99}).encode()
    peer.sock.sendall(struct.pack(">I", len(body) + 32) + b"\x01" * 32 + body)
    server.send(0, {"type": "stop"})
    assert wait_for(lambda: replies)
    assert [m["type"] for m in replies] == ["stop"] and client.dropped["bad_signature"] == 1
    client.close()


def test_send_never_blocks_the_training_loop():
    key = ch.new_key()
    slow = threading.Event()
    srv = ch.ChannelServer(key, lambda w, m: slow.wait(5))
    client = ch.ChannelClient(srv.address, key, 0, max_queue=10)
    for i in range(1000):   # its time per send against a reading kernel: benchmarks/channel.py
        client.send({"type": "rows", "rows": [[i]]})
    assert client.dropped["queue_full"] > 0
    slow.set()
    client.close()
    srv.close()
