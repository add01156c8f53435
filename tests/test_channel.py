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
    other, other_conn = raw_connect(server)
    other.sendall(frame)
    assert wait_for(lambda: server.dropped["replay"] == 1)
    # A connection's frames are read in order: once other's own hello arrives, the replayed
    # frame before it has been dealt with (dropped, never recorded).
    other.sendall(signed(server.key, {"type": "hello", "worker": 1, "conn": other_conn, "seq": 1}))
    assert wait_for(lambda: len(server.got) == 2)
    assert sorted(m["worker"] for _, m in server.got) == [0, 1] and server.dropped["replay"] == 1
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


# -- what a connection costs the kernel before it says hello ---------------------------------

@pytest.fixture
def make_server():
    """ChannelServer(**options) with a handler recording into ``.got``; closed afterwards."""
    servers = []

    def make(**options):
        got = []
        key = ch.new_key()
        srv = ch.ChannelServer(key, lambda worker, message: got.append((worker, message)),
                               **options)
        srv.got, srv.key = got, key
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.close()


def closed_by_server(sock, timeout=2.0):
    """True if the server closed ``sock`` within ``timeout`` (whatever it sent before)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def threads():
    return psutil.Process().num_threads()


def test_idle_connections_without_the_key_are_closed_at_the_hello_deadline(make_server):
    srv = make_server(hello_deadline=0.5)
    time.sleep(0.1)
    before = threads()
    socks = [socket.create_connection(srv.address) for _ in range(100)]
    socks[0].sendall(b"\x00\x00")   # half a frame header: reading it must not outlast the deadline
    assert wait_for(lambda: srv.dropped["too_many_pending"] == 100 - ch.MAX_PENDING)
    assert threads() <= before + ch.MAX_PENDING + 1
    assert wait_for(lambda: srv.dropped["hello_timeout"] == ch.MAX_PENDING, timeout=3)
    assert wait_for(lambda: threads() <= before + 5, timeout=3)
    assert all(closed_by_server(s) for s in socks)
    assert srv.got == [] and srv.connected() == []
    for s in socks:
        s.close()


def test_frames_do_not_extend_the_hello_deadline(make_server):
    srv = make_server(hello_deadline=0.5)
    sock, conn = raw_connect(srv)
    start, seq = time.monotonic(), 0
    while time.monotonic() - start < 1.5 and srv.dropped["hello_timeout"] == 0:
        seq += 1
        sock.sendall(signed(srv.key, {"type": "rows", "conn": conn, "seq": seq}))   # no hello
        time.sleep(0.1)
    assert srv.dropped["hello_timeout"] == 1 and srv.dropped["no_hello"] >= 3
    assert closed_by_server(sock)
    sock.close()


def test_connections_past_the_pending_bound_are_closed_at_once(make_server):
    srv = make_server(max_pending=4, hello_deadline=30)
    pending = [raw_connect(srv) for _ in range(4)]   # each read its challenge: it is pending
    extra = socket.create_connection(srv.address)
    # refused at once: not left pending until the hello deadline (30 s) closes it
    assert closed_by_server(extra, timeout=10), "the extra connection was kept pending"
    assert srv.dropped == {"too_many_pending": 1}
    sock, conn = pending[0]
    sock.sendall(signed(srv.key, {"type": "hello", "worker": 0, "conn": conn, "seq": 1}))
    assert wait_for(lambda: srv.connected() == [0])
    more, _ = raw_connect(srv)   # the hello freed a pending slot
    assert srv.dropped == {"too_many_pending": 1}
    for s in [more, extra, *(s for s, _ in pending)]:
        s.close()


def test_close_ends_the_pending_connections(make_server):
    srv = make_server(hello_deadline=30)
    time.sleep(0.1)
    before = threads()
    socks = [raw_connect(srv)[0] for _ in range(10)]
    srv.close()
    assert wait_for(lambda: threads() <= before - 1)   # the accept thread ended too
    assert all(closed_by_server(s) for s in socks)
    for s in socks:
        s.close()


@pytest.mark.parametrize("claimed", [9, 2, -1])
def test_hello_from_a_worker_outside_the_cluster_is_dropped(make_server, claimed):
    srv = make_server(workers=2)
    sock, conn = raw_connect(srv)
    sock.sendall(signed(srv.key, {"type": "hello", "worker": claimed, "conn": conn, "seq": 1})
                 + signed(srv.key, {"type": "rows", "conn": conn, "seq": 2}))
    assert closed_by_server(sock)
    assert srv.dropped == {"bad_worker": 1}
    assert srv.got == [] and srv.connected() == [] and srv.received == 0
    sock.close()


def test_a_reconnecting_worker_replaces_its_old_connection(make_server):
    srv = make_server(workers=2)
    old_replies, new_replies = [], []
    old = ch.ChannelClient(srv.address, srv.key, 1, on_message=old_replies.append)
    assert wait_for(lambda: srv.connected() == [1])
    old_sock = srv._peers[1].sock
    new = ch.ChannelClient(srv.address, srv.key, 1, on_message=new_replies.append)
    assert wait_for(lambda: srv.dropped["replaced"] == 1)
    assert wait_for(lambda: old_sock.fileno() == -1)   # its reader ended and closed it
    assert srv.connected() == [1] and srv.send(1, {"type": "stop"})
    assert wait_for(lambda: new_replies) and old_replies == []
    new.send({"type": "rows", "rows": [[1]]})
    assert wait_for(lambda: [m["type"] for _, m in srv.got] == ["hello", "hello", "rows"])
    assert {w for w, _ in srv.got} == {1}
    old.close()
    new.close()


def test_a_worker_still_connects_after_the_abuse(make_server):
    srv = make_server(workers=2, max_pending=4, hello_deadline=0.5)
    idle = [socket.create_connection(srv.address) for _ in range(20)]
    forged, conn = None, None
    while forged is None:   # a keyed hello as worker 9, once a pending slot is free
        sock = socket.create_connection(srv.address)
        payload = ch.read_frame(sock)
        if payload is None:
            sock.close()
            time.sleep(0.05)
            continue
        forged, conn = sock, ch.decode(srv.key, payload)["conn"]
    forged.sendall(signed(srv.key, {"type": "hello", "worker": 9, "conn": conn, "seq": 1}))
    assert closed_by_server(forged)
    assert wait_for(lambda: srv.dropped["hello_timeout"] == 4)   # the first idle ones
    blockers = [raw_connect(srv)[0] for _ in range(4)]   # all pending slots taken
    refused = srv.dropped["too_many_pending"]
    client = ch.ChannelClient(srv.address, srv.key, 1, timeout=5)   # retries until they expire
    assert srv.dropped["too_many_pending"] > refused
    client.send({"type": "rows", "rows": [[7]]})
    assert wait_for(lambda: [(w, m["type"]) for w, m in srv.got] == [(1, "hello"), (1, "rows")])
    assert srv.dropped["bad_worker"] == 1 and srv.connected() == [1]
    client.close()
    for s in [*idle, *blockers, forged]:
        s.close()


def test_a_unix_socket_channel_is_the_users_alone_and_removed_at_close(tmp_path):
    """Workers in a private network namespace reach the kernel by a Unix socket."""
    import os
    import stat

    got = []
    key = ch.new_key()
    path = str(tmp_path / "channel")
    srv = ch.ChannelServer(key, lambda worker, message: got.append((worker, message)), host=path)
    assert srv.address == (path, 0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    client = ch.ChannelClient(srv.address, key, 1)
    client.send({"type": "rows", "rows": [[0, 1.0]]})
    assert wait_for(lambda: len(got) == 2) and got[1][1]["rows"] == [[0, 1.0]]
    with pytest.raises(ch.BadFrame):   # the key is still the boundary
        ch.decode(ch.new_key(), ch.read_frame(ch._connect(srv.address, 5.0)))
    client.close()
    srv.close()
    assert not os.path.exists(path)
