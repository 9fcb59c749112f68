"""Inbound relayed streams are bounded (protocol/transports/p2pd/stream_bounds.py, relayed.py): one
deadline per whole stream, at most 2 streams per sender, and a full table displaces the heaviest
sender's oldest stream. The table and the deadline alone, then the slowloris of issue 42 on real
p2pd daemons on 127.0.0.1 (connected directly: the relayed protocol runs the same way)."""
from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from protocol import NodeIdentity, P2pdOptions
from protocol.transports.p2pd import P2pdTransport
from protocol.transports.p2pd.control import ControlConnection, varint
from protocol.transports.p2pd.relayed import MAX_TOPIC_BYTES, frame, stream_open_request
from protocol.transports.p2pd.stream_bounds import StreamDeadline, StreamTable, TableEntry

from tests.support.waiting import wait_until

TOPIC = "swarm-node/test/rollouts/v1"


# --- the table --------------------------------------------------------------------------------------
def entry(sender: str, cuts: list[str]) -> TableEntry:
    return TableEntry(sender, lambda: cuts.append(sender))


def test_a_sender_over_its_cap_loses_its_own_oldest_stream():
    table, cuts = StreamTable(capacity=16, per_sender=2), []
    first, second = entry("m", cuts), entry("m", cuts)
    assert table.admit(first) == [] and table.admit(second) == []
    assert table.admit(entry("m", cuts)) == [first] and first.evicted and not second.evicted
    assert table.senders() == {"m": 2}


def test_a_full_table_displaces_the_heaviest_senders_oldest_never_the_newcomer():
    table, cuts = StreamTable(capacity=4, per_sender=2), []
    early = entry("a", cuts)
    m1, m2 = entry("m", cuts), entry("m", cuts)
    for e in (early, m1, m2, entry("b", cuts)):
        assert table.admit(e) == []
    honest = entry("h", cuts)
    assert table.admit(honest) == [m1]  # m holds the most, though a's stream is older
    assert table.senders() == {"a": 1, "m": 1, "b": 1, "h": 1}
    newest = entry("c", cuts)
    assert table.admit(newest) == [early]  # all equally heavy: the oldest stream goes
    table.release(honest)
    assert len(table) == 3 and table.admit(entry("d", cuts)) == []  # a freed slot is taken, nobody displaced


# --- the deadline -----------------------------------------------------------------------------------
def test_a_stream_must_end_within_grace_plus_bytes_over_min_rate():
    now = [100.0]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = StreamDeadline(ours, grace_s=2.0, min_rate=1000.0, clock=lambda: now[0])
        theirs.sendall(b"x" * 500)
        assert stream.recv(4096) == b"x" * 500
        now[0] += 2.4  # past the grace, within the 0.5 s the 500 bytes earned
        assert stream.remaining() == pytest.approx(0.1)
        now[0] += 0.2
        with pytest.raises(socket.timeout):
            stream.recv(4096)
        assert stream.timed_out


def test_a_read_waits_only_until_the_deadline_and_a_cut_ends_it_at_once():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = StreamDeadline(ours, grace_s=0.3, min_rate=0.0)
        started = time.monotonic()
        with pytest.raises(socket.timeout):
            stream.recv(1)  # nothing sent: the whole stream's deadline, not a fresh per-read one
        assert 0.25 <= time.monotonic() - started < 2 and stream.timed_out
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = StreamDeadline(ours, grace_s=30.0, min_rate=0.0)
        threading.Timer(0.2, stream.cut).start()
        started = time.monotonic()
        assert stream.recv(1) == b"" and time.monotonic() - started < 5  # evicted from another thread


# --- on real daemons --------------------------------------------------------------------------------
def transport(**options) -> P2pdTransport:
    return P2pdTransport(NodeIdentity.generate().private_seed(), P2pdOptions(topics=[TOPIC], **options))


def open_stream(sender: P2pdTransport, receiver: P2pdTransport) -> ControlConnection:
    conn = ControlConnection(sender.daemon.socket_path, 5)
    conn.request(stream_open_request(receiver.peer_id, 5))
    return conn


def ended(sock: socket.socket) -> bool:
    """Whether the far end closed or reset the stream (without blocking)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def trickle(sender: P2pdTransport, receiver: P2pdTransport, stop: threading.Event, every_s: float,
            opened: list[int]) -> None:
    """A slowloris stream: one message whose topic frame never ends, a byte every `every_s`
    (within any per-read deadline); opened again whenever the receiver ends it."""
    while not stop.is_set():
        try:
            with open_stream(sender, receiver) as conn:
                opened.append(1)
                conn.sock.sendall(varint(1) + varint(MAX_TOPIC_BYTES))
                while not stop.wait(every_s) and not ended(conn.sock):
                    conn.sock.sendall(b"x")
        except OSError:
            pass
        stop.wait(0.5)


RECEIVER_TIMEOUT_S = 1.5  # the receiver's control timeout: before issue 42, each read's deadline
TRICKLERS, BATCHES = 16, 24
ATTACK_S = 12 * RECEIVER_TIMEOUT_S  # as long as the attack that kept the honest peer out (0 of 24)


@pytest.fixture
def slowloris_trio():
    """A receives; H (honest) and M (the attacker) dial it."""
    a = transport(control_timeout_s=RECEIVER_TIMEOUT_S)
    peers = []
    try:
        a.start()
        for _ in range(2):
            peers.append(transport(bootstrap=a.listen_addrs()))
            peers[-1].start()
        for p in peers:
            wait_until(lambda: a.peer_id in p.peers(), "the peers to connect to A", 20)
        yield a, *peers
    finally:
        for t in (*peers, a):
            t.close()


@pytest.mark.slow
@pytest.mark.serial
def test_an_honest_peer_is_heard_through_16_trickling_streams_of_another(slowloris_trio):
    a, honest, attacker = slowloris_trio
    stop, opened = threading.Event(), []
    threads = [threading.Thread(target=trickle, args=(attacker, a, stop, RECEIVER_TIMEOUT_S / 3, opened),
                                daemon=True) for _ in range(TRICKLERS)]
    acked, held = 0, []
    try:
        for t in threads:
            t.start()
        wait_until(lambda: len(opened) >= TRICKLERS, "the attacker's streams to open", 15)
        time.sleep(0.5)  # (the receiver takes them in)
        started = time.monotonic()
        for i in range(BATCHES):
            batch = [(TOPIC, f"honest {i}.{k}".encode()) for k in range(2)]
            acked += honest._relayed._send(a.peer_id, batch, honest._shared.generation, "direct")
            held.append(a._relayed._table.senders().get(attacker.peer_id, 0))
            time.sleep(max(0.0, started + (i + 1) * ATTACK_S / BATCHES - time.monotonic()))
        attacked_s = time.monotonic() - started
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    print(f"honest batches acknowledged: {acked}/{BATCHES} over {attacked_s:.1f} s of attack "
          f"({len(opened)} attacker streams opened); receiver: {a.stats()}")
    assert acked >= 0.9 * BATCHES
    got = [m.data for m in a.drain(TOPIC)]
    assert sorted(got) == sorted(set(got)) and len(got) >= 2 * acked  # each acknowledged batch arrived
    assert all(m.startswith(b"honest") for m in got)  # nothing of the attacker's
    stats = a.stats()
    assert max(held) <= 2  # the attacker never held more than its 2 streams
    assert stats["relayed_evicted"] >= TRICKLERS - 2 and stats["direct_received"] == len(got)  # (not relayed-only)


def test_a_trickling_stream_is_cut_at_its_deadline_and_a_steady_one_outlives_the_grace():
    a = transport(relayed_stream_grace_s=1.0, relayed_min_rate=1000.0)
    b = None
    try:
        a.start()
        b = transport(bootstrap=a.listen_addrs())
        b.start()
        wait_until(lambda: a.peer_id in b.peers(), "B to connect to A", 20)
        with open_stream(b, a) as conn:  # a byte every 0.3 s earns 0.3 ms each: cut after about 1 s
            conn.sock.sendall(varint(1) + varint(MAX_TOPIC_BYTES))
            started = time.monotonic()
            while not ended(conn.sock) and time.monotonic() - started < 10:
                conn.sock.sendall(b"x")
                time.sleep(0.3)
            cut_after = time.monotonic() - started
        assert 0.8 <= cut_after < 4, cut_after
        wait_until(lambda: a.stats()["relayed_timed_out"] == 1, "the cut to be counted", 5)
        payload = b"p" * 3000  # its first 2,000 bytes earn 2 s past the 1 s grace
        with open_stream(b, a) as conn:
            conn.sock.sendall(varint(1) + frame(TOPIC.encode()) + varint(len(payload)) + payload[:2000])
            time.sleep(2.0)
            conn.sock.sendall(payload[2000:])
            assert conn.sock.recv(1) == b"\x06"  # acknowledged
        wait_until(lambda: a.stats()["direct_received"] == 1, "the steady stream's message", 5)  # (B: direct)
        assert [m.data for m in a.drain(TOPIC)] == [payload] and a.stats()["relayed_refused"] == 0
    finally:
        if b is not None:
            b.close()
        a.close()
