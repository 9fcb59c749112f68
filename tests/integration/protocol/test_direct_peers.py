"""Direct peers (protocol/transports/p2pd/relayed.py, dedup.py): our own messages also go on
acknowledged streams to the peers whose groups we used most recently, beside gossip, and the
receiver keeps one copy of what both paths bring. Real p2pd daemons on 127.0.0.1."""
from __future__ import annotations

import time

import pytest

from protocol import NodeIdentity, P2pdOptions
from protocol.transports.p2pd import P2pdTransport
from protocol.transports.p2pd.dedup import GOSSIP, STREAM, CrossPathDedup, digest

from tests.support.waiting import wait_until

TOPIC = "swarm-node/test/rollouts/v1"


def test_a_copy_on_the_other_path_is_dropped_one_on_the_same_path_is_not():
    dedup = CrossPathDedup(capacity=2)
    a, b, c = (digest("P", TOPIC, m) for m in (b"a", b"b", b"c"))
    assert not dedup.is_copy(a, GOSSIP)
    assert dedup.is_copy(a, STREAM)       # the stream brought what gossip did
    assert not dedup.is_copy(a, GOSSIP)   # a resend on gossip: the node's replay checks judge it
    assert not dedup.is_copy(b, STREAM) and dedup.is_copy(b, GOSSIP)
    assert digest("P", TOPIC, b"a") != digest("P", "other/topic", b"a")
    assert digest("P", TOPIC, b"a") != digest("M", TOPIC, b"a")  # M forwarding P's envelope first drops nothing of P's
    assert not dedup.is_copy(c, STREAM)   # the bound: the oldest (a) is forgotten
    assert not dedup.is_copy(a, STREAM)


def transport(**kwargs) -> P2pdTransport:
    return P2pdTransport(NodeIdentity.generate().private_seed(),
                         P2pdOptions(listen=["/ip4/127.0.0.1/tcp/0"], topics=[TOPIC], **kwargs))


@pytest.fixture
def pair():
    """A receives; B dials it."""
    a = transport()
    b = None
    try:
        a.start()
        b = transport(bootstrap=a.listen_addrs())
        b.start()
        wait_until(lambda: a.peer_id in b.peers() and b.peer_id in a.peers(), "B and A to connect", 20)
        yield a, b
    finally:
        for t in (b, a):
            if t is not None:
                t.close()


def publish_and_collect(sender: P2pdTransport, receiver: P2pdTransport, tag: str, n: int) -> list[bytes]:
    sent = [f"{tag} {i}".encode() for i in range(n)]
    for m in sent:
        sender.publish(TOPIC, m)
    got: list[bytes] = []
    wait_until(lambda: got.extend(r.data for r in receiver.drain(TOPIC)) or set(sent) <= set(got),
               f"the {tag} messages", 20)
    time.sleep(1.0)  # what a second path would bring late
    got.extend(r.data for r in receiver.drain(TOPIC))
    return got


@pytest.mark.slow
def test_a_peer_we_use_gets_our_messages_on_a_stream_too_and_keeps_one_copy_of_each(pair):
    a, b = pair
    assert publish_and_collect(b, a, "before", 10) and b.stats()["direct_sent"] == 0  # nobody used yet: gossip only
    b.note_useful_peers([a.peer_id])  # B trained on A's groups: A is a direct peer of B's now
    got = publish_and_collect(b, a, "after", 30)
    after = [m for m in got if m.startswith(b"after")]
    assert sorted(after) == sorted(set(after)) and len(after) == 30  # each once, though two paths carried it
    stats_b, stats_a = b.stats(), a.stats()
    assert stats_b["direct_sent"] >= 30 and stats_b["direct_given_up"] == 0
    assert stats_a["direct_received"] + stats_a["dropped_copies"] >= 30  # every message came on the stream
    assert stats_a["dropped_copies"] >= 1 and stats_a["relayed_received"] == 0


@pytest.mark.slow
def test_direct_peers_zero_is_gossip_only(pair):
    a, _ = pair
    c = transport(bootstrap=a.listen_addrs(), direct_peers=0)
    try:
        c.start()
        wait_until(lambda: a.peer_id in c.peers(), "C to connect to A", 20)
        c.note_useful_peers([a.peer_id])
        got = publish_and_collect(c, a, "c", 10)
        assert len([m for m in got if m.startswith(b"c")]) == 10
        assert c.stats()["direct_sent"] == 0 and a.stats()["dropped_copies"] == 0
    finally:
        c.close()
