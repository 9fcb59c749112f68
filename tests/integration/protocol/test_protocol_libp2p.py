"""Libp2pTransport over real py-libp2p hosts on 127.0.0.1 (each test bounded by explicit timeouts)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("libp2p")
pytest.importorskip("trio")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: E402
    Ed25519PrivateKey as CryptoEd25519PrivateKey,
)
from libp2p.crypto.ed25519 import Ed25519PrivateKey  # noqa: E402
from libp2p.peer.id import ID  # noqa: E402

from protocol.transports.base import Transport  # noqa: E402
from protocol.transports.libp2p import (  # noqa: E402
    Libp2pOptions,
    Libp2pTransport,
    TransportStartError,
    peer_id_from_seed,
)
from tests.support.waiting import wait_until  # noqa: E402

TOPIC = "swarm/test/rollouts"


def _collect(t: Libp2pTransport, topic: str, n: int, timeout: float) -> list:
    got: list = []
    wait_until(lambda: got.extend(t.drain(topic)) or len(got) >= n, f"{n} messages on {topic}", timeout, step=0.005)
    return got


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def make() -> Iterator[Callable[..., Libp2pTransport]]:
    """Factory for started transports; every one is closed at the end of the test."""
    made: list[Libp2pTransport] = []

    def _make(seed: bytes | None = None, start: bool = True, **kw: object) -> Libp2pTransport:
        kw.setdefault("topics", [TOPIC])
        kw.setdefault("start_timeout", 10.0)
        t = Libp2pTransport(seed or os.urandom(32), Libp2pOptions(**kw))  # type: ignore[arg-type]
        made.append(t)
        if start:
            t.start()
        return t

    yield _make
    for t in made:
        t.close()


def _connected(a: Libp2pTransport, b: Libp2pTransport, timeout: float = 5.0) -> None:
    wait_until(lambda: b.peer_id in a.peers() and a.peer_id in b.peers(),
               f"{a.peer_id[-6:]} <-> {b.peer_id[-6:]} connected", timeout, step=0.01)


def test_peer_id_is_the_signer_identity(make) -> None:
    crypto_key = CryptoEd25519PrivateKey.generate()
    seed = crypto_key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )
    lp_key = Ed25519PrivateKey.from_bytes(seed)
    expected = ID.from_pubkey(lp_key.get_public_key()).to_base58()
    assert expected.startswith("12D3KooW")
    assert peer_id_from_seed(seed) == expected
    # a signature from the cryptography key verifies under the libp2p public key
    assert lp_key.get_public_key().verify(b"rollout", crypto_key.sign(b"rollout"))

    t = make(seed)
    assert isinstance(t, Transport)
    assert t.peer_id == expected
    addrs = t.listen_addrs()
    assert addrs and all(a.endswith(f"/p2p/{expected}") for a in addrs)
    assert all("/tcp/0/" not in a for a in addrs), addrs  # real port, not the wildcard 0
    with pytest.raises(ValueError):
        Libp2pTransport(b"short", Libp2pOptions(topics=[TOPIC]))


def test_two_hosts_connect_and_deliver(make) -> None:
    a = make()
    t0 = time.monotonic()
    b = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    connect_s = time.monotonic() - t0
    assert connect_s < 5.0

    sent = time.time()
    a.publish(TOPIC, b"hello from A")
    got = _collect(b, TOPIC, 1, timeout=5.0)
    assert [m.data for m in got] == [b"hello from A"]
    assert got[0].from_peer == a.peer_id
    assert sent <= got[0].received_at <= time.time()
    time.sleep(0.2)
    assert a.drain(TOPIC) == []  # our own message never comes back to us
    assert b.drain("some/other/topic") == []
    assert a.stats()["published"] == 1 and b.stats()["received"] == 1
    # the swarm reports the connection a moment before host.connect() returns to B's dial loop
    wait_until(lambda: b.stats()["connects"] == 1, "B's dial loop to record the connect", 2.0, step=0.01)
    assert b.stats()["dial_failures"] == 0


def test_mesh_peers_and_connection_muxers_are_read_only_views(make) -> None:
    """mesh_peers: whom GossipSub grafted for a topic (the other host once the heartbeat ran), []
    before start, for a topic not joined, and after close; connection_muxers: the live connection's
    negotiated muxer. Neither changes what the host does."""
    a = make()
    idle = make(start=False)
    assert idle.mesh_peers(TOPIC) == [] and idle.connection_muxers() == {}
    b = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    wait_until(lambda: a.mesh_peers(TOPIC) == [b.peer_id] and b.mesh_peers(TOPIC) == [a.peer_id],
               "A and B in each other's mesh", 10.0, step=0.01)
    assert a.mesh_peers("some/other/topic") == []
    muxers = a.connection_muxers()
    assert sum(muxers.values()) >= 1 and all("yamux" in m or "mplex" in m for m in muxers), muxers
    a.publish(TOPIC, b"still delivered")
    assert [m.data for m in _collect(b, TOPIC, 1, timeout=5.0)] == [b"still delivered"]
    a.close()
    assert a.mesh_peers(TOPIC) == [] and a.connection_muxers() == {}


def test_three_hosts_in_a_line_all_receive(make) -> None:
    a = make()
    b = make(bootstrap=a.listen_addrs())
    c = make(bootstrap=b.listen_addrs())  # line: A - B - C (A and C never dial each other)
    _connected(a, b)
    _connected(b, c)
    nodes = {"A": a, "B": b, "C": c}
    for name, t in nodes.items():
        t.publish(TOPIC, f"from {name}".encode())
    for name, t in nodes.items():
        others = {f"from {o}".encode() for o in nodes if o != name}
        got = _collect(t, TOPIC, 2, timeout=8.0)
        assert {m.data for m in got} == others, name
        assert {m.from_peer for m in got} == {nodes[o].peer_id for o in nodes if o != name}


def test_burst_of_50_all_arrive(make) -> None:
    a = make()
    b = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    payloads = {f"burst-{i:03d}".encode() + os.urandom(200) for i in range(50)}
    for p in payloads:  # far above GossipSub's default 10 msg/s per peer per topic
        a.publish(TOPIC, p)
    got = _collect(b, TOPIC, 50, timeout=10.0)
    assert {m.data for m in got} == payloads  # order is not assumed
    assert len(got) == 50
    assert b.stats()["dropped_inbound"] == 0 and a.stats()["dropped_outbound"] == 0


def test_one_megabyte_message_arrives(make) -> None:
    a = make()
    b = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    big = os.urandom(1_000_000)
    b.publish(TOPIC, big)  # the dialing side publishes this time
    got = _collect(a, TOPIC, 1, timeout=10.0)
    assert len(got) == 1 and got[0].data == big and got[0].from_peer == b.peer_id
    # over max_msg_bytes: dropped and counted at publish, never raised
    small = make(max_msg_bytes=1000)
    small.publish(TOPIC, b"x" * 1001)
    assert small.stats()["dropped_outbound_oversize"] == 1


@pytest.mark.slow
@pytest.mark.serial
def test_bootstrap_down_at_start_then_up_then_drop_and_back(make) -> None:
    port = _free_port()
    seed_a = os.urandom(32)
    addr_a = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id_from_seed(seed_a)}"
    t0 = time.monotonic()
    b = make(bootstrap=[addr_a], backoff_initial=0.1, backoff_max=0.5, dial_timeout=2.0)
    assert time.monotonic() - t0 < 5.0  # start() does not wait for peers
    assert b.peers() == []
    b.publish(TOPIC, b"into the void")  # no peer: goes nowhere, must not fail
    wait_until(lambda: b.stats()["reconnects"] >= 3, "repeated reconnect attempts", 10.0, step=0.01)
    assert b.stats()["dial_failures"] >= 3

    a = make(seed_a, listen=[f"/ip4/127.0.0.1/tcp/{port}"])
    assert a.listen_addrs() == [addr_a]
    _connected(a, b, timeout=8.0)
    b.publish(TOPIC, b"hello A")
    got: set[bytes] = set()
    wait_until(lambda: got.update(m.data for m in a.drain(TOPIC)) or b"hello A" in got, "hello A", 5.0, step=0.01)
    # py-libp2p replays its recent-message cache (a few heartbeats) to a newly joined peer, so
    # the message published while nobody was there may arrive too
    assert got <= {b"hello A", b"into the void"}

    # the bootstrap peer goes away and comes back on the same address: B re-dials it
    a.close()
    wait_until(lambda: a.peer_id not in b.peers(), "B notices A is gone", 5.0, step=0.01)
    failures = b.stats()["dial_failures"]
    wait_until(lambda: b.stats()["dial_failures"] > failures, "B retrying", 5.0, step=0.01)
    a2 = make(seed_a, listen=[f"/ip4/127.0.0.1/tcp/{port}"])
    _connected(a2, b, timeout=8.0)
    a2.publish(TOPIC, b"back again")
    assert [m.data for m in _collect(b, TOPIC, 1, timeout=5.0)] == [b"back again"]
    # B's own loop usually re-dials first; libp2p's auto-connector may win the race (also fine)
    assert b.stats()["connects"] >= 1


def test_close_is_prompt_and_idempotent(make) -> None:
    a = make()
    b = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    t0 = time.monotonic()
    b.close()
    a.close()
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    a.close()
    b.close()
    assert time.monotonic() - t0 < 0.5
    a.publish(TOPIC, b"after close")  # dropped and counted, no exception
    assert a.stats()["dropped_outbound"] == 1 == a.stats()["dropped_outbound_closed"]
    assert a.peers() == [] and a.drain(TOPIC) == []
    never_started = make(start=False)
    never_started.close()
    never_started.close()


def test_publish_never_blocks(make) -> None:
    lonely = make()  # started, no peers
    data = os.urandom(4096)
    t0 = time.monotonic()
    for _ in range(1000):
        lonely.publish(TOPIC, data)
    assert time.monotonic() - t0 < 1.0

    queued = make(start=False, outbound_size=10)  # not running: the queue fills, then drops
    t0 = time.monotonic()
    for _ in range(1000):
        queued.publish(TOPIC, data)
    assert time.monotonic() - t0 < 1.0
    assert queued.stats()["dropped_outbound_full"] == 990 == queued.stats()["dropped_outbound"]


def test_start_fails_loudly_when_the_port_is_taken(make) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t = make(start=False, listen=[f"/ip4/127.0.0.1/tcp/{port}"])
        t0 = time.monotonic()
        with pytest.raises(TransportStartError, match=str(port)):
            t.start()
        assert time.monotonic() - t0 < 10.0
    with pytest.raises(ValueError, match="p2p"):
        Libp2pTransport(os.urandom(32), Libp2pOptions(bootstrap=["/ip4/127.0.0.1/tcp/4001"], topics=[TOPIC]))


def test_subscribe_after_start_and_inbox_drops_oldest(make) -> None:
    late_topic = "swarm/test/hints"
    a = make()
    b = make(bootstrap=a.listen_addrs(), inbox_size=5)
    _connected(a, b)
    a.subscribe(late_topic)
    b.subscribe(late_topic)
    b.subscribe(late_topic)  # idempotent
    time.sleep(0.3)  # let the new subscription announcements cross
    a.publish(late_topic, b"hint")
    assert [m.data for m in _collect(b, late_topic, 1, timeout=5.0)] == [b"hint"]

    for i in range(20):
        a.publish(TOPIC, b"m%d" % i)
    wait_until(lambda: b.stats()["received"] >= 21, "20 more messages at B", 5.0, step=0.01)
    assert len(b.drain(TOPIC)) == 5  # bounded inbox: the 15 oldest were evicted and counted
    assert b.stats()["dropped_inbound_full"] == 15
    assert b.drain(TOPIC, max_items=3) == []


def test_garbage_from_a_peer_does_not_kill_the_node(make) -> None:
    import trio
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V12

    a = make()
    evil = make(bootstrap=a.listen_addrs())
    _connected(a, evil)

    async def send_garbage() -> None:
        stream = await evil._trio.host.new_stream(ID.from_base58(a.peer_id), [PROTOCOL_ID_V12])
        await stream.write(b"\x05\xff\xff\xff\xff\xff")  # length 5, then not a protobuf

    trio.from_thread.run(send_garbage, trio_token=evil._trio.trio_token)
    wait_until(lambda: a.stats()["bad_streams"] >= 1, "A rejecting the garbage stream", 5.0, step=0.01)
    assert a.running
    good = make(bootstrap=a.listen_addrs())
    _connected(a, good)
    good.publish(TOPIC, b"still alive?")
    assert [m.data for m in _collect(a, TOPIC, 1, timeout=5.0)] == [b"still alive?"]


@pytest.mark.slow
@pytest.mark.serial
def test_a_stalled_peer_does_not_hold_back_the_others(make) -> None:
    import threading

    import trio

    a = make()
    b = make(bootstrap=a.listen_addrs())
    c = make(bootstrap=a.listen_addrs())
    _connected(a, b)
    _connected(a, c)
    a.publish(TOPIC, b"warm-up")  # both are in A's mesh before C freezes
    assert _collect(b, TOPIC, 1, 5.0) and _collect(c, TOPIC, 1, 5.0)

    release = threading.Event()
    frozen = threading.Thread(  # C's event loop stops reading its socket
        target=lambda: trio.from_thread.run_sync(lambda: release.wait(15.0),
                                                 trio_token=c._trio.trio_token),
        daemon=True,
    )
    frozen.start()
    try:
        payloads = [i.to_bytes(4, "big") + os.urandom(64 * 1024) for i in range(150)]
        t0 = time.monotonic()
        for p in payloads:
            a.publish(TOPIC, p)
        got = _collect(b, TOPIC, len(payloads), timeout=15.0)
        elapsed = time.monotonic() - t0
        assert len(got) == len(payloads), (len(got), a.stats())
        assert elapsed < 12.0, elapsed
    finally:
        release.set()
        frozen.join(5.0)


def test_the_factory_builds_each_kind_from_its_typed_options(tmp_path) -> None:
    """make_transport: Libp2pOptions -> py-libp2p, P2pdOptions -> the daemon's transport (neither
    started here); lists become immutable tuples; bad options fail with a clear error."""
    from protocol import P2pdOptions, make_transport
    from protocol.transports.p2pd import P2pdTransport
    from protocol.transports.p2pd.peer_cache import PeerCacheLimits

    seed = os.urandom(32)
    options = Libp2pOptions(topics=[TOPIC, TOPIC], dial_timeout=3.0)
    assert options.topics == (TOPIC, TOPIC) and options.listen == ("/ip4/127.0.0.1/tcp/0",)
    t = make_transport(seed, options)
    assert isinstance(t, Libp2pTransport) and t.peer_id == peer_id_from_seed(seed) and t.options is options
    t.close()
    limits = PeerCacheLimits(max_peers=7)
    p = make_transport(seed, P2pdOptions(topics=[TOPIC], peer_cache=tmp_path / "peers.json", peer_cache_limits=limits,
                                         flood_cut_rate=0.0))
    assert isinstance(p, P2pdTransport) and p.peer_id == peer_id_from_seed(seed)
    assert p.peer_cache is not None and p.peer_cache.limits == limits
    with pytest.raises(ValueError, match="max_msg_bytes must be positive"):
        Libp2pOptions(max_msg_bytes=0)
    with pytest.raises(TypeError, match="pass Libp2pOptions or P2pdOptions"):
        make_transport(seed, {"listen": []})  # type: ignore[arg-type]
