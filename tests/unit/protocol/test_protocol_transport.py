"""MemoryTransport: delivery among peers, no self-delivery, injected faults, thread safety; and
the end-to-end path Outbox -> transport -> Ingress."""
from __future__ import annotations

import threading
import time

import pytest

from protocol.identity import NodeIdentity
from protocol.ingress import Ingress
from protocol.kinds import KIND_SPECS, Kind
from protocol.transports.memory import MemoryBus, MemoryTransport
from protocol.outbox import Outbox
from protocol.testing import make_rollout_group
from protocol.transports.base import Transport, topic_name

from tests.support.fake_clock import FakeClock

TOPIC = topic_name("test", "rollouts")


def network(bus: MemoryBus, names=("a", "b", "c")) -> dict[str, MemoryTransport]:
    peers = {}
    for name in names:
        transport = MemoryTransport(bus, name)
        transport.subscribe(TOPIC)
        transport.start()
        peers[name] = transport
    return peers


def test_topic_names():
    assert topic_name("demo", "rollouts") == "swarm-node/demo/rollouts/v1"
    assert KIND_SPECS[Kind.HINT_REQUEST].topic == "hint-requests"
    with pytest.raises(ValueError):
        topic_name("bad/name", "rollouts")


def test_memory_transport_implements_the_interface():
    assert isinstance(MemoryTransport(MemoryBus(), "x"), Transport)


def test_delivery_among_three_peers_without_self_delivery():
    peers = network(MemoryBus())
    for name, transport in peers.items():
        transport.publish(TOPIC, f"from {name}".encode())
    for name, transport in peers.items():
        got = transport.drain(TOPIC)
        assert sorted(item.data for item in got) == sorted(f"from {other}".encode() for other in peers if other != name)
        assert {item.from_peer for item in got} == set(peers) - {name}
        assert transport.drain(TOPIC) == []  # drained
        assert transport.peers() == sorted(set(peers) - {name})
    assert peers["a"].stats() == {"published": 1, "received": 2}
    assert peers["a"].listen_addrs() == ["/memory/a"]


def test_unsubscribed_topics_and_max_items_and_full_inbox():
    bus = MemoryBus()
    peers = network(bus, ("a", "b"))
    peers["a"].publish("other-topic", b"x")
    assert peers["b"].stats().get("dropped_unsubscribed") == 1
    small = MemoryTransport(bus, "small", inbox_capacity=3)
    small.subscribe(TOPIC)
    small.start()
    for i in range(5):
        peers["a"].publish(TOPIC, bytes([i]))
    assert small.stats()["dropped_inbound_full"] == 2  # one sender, the heaviest: its oldest were dropped
    assert small.dropped_by_sender() == {"a": 2}
    assert [item.data for item in small.drain(TOPIC, max_items=2)] == [b"\x02", b"\x03"]
    assert [item.data for item in small.drain(TOPIC)] == [b"\x04"]


def test_a_full_inbox_drops_from_the_flooder_not_from_the_quiet_peer():
    bus = MemoryBus()
    peers = network(bus, ("quiet", "loud"))
    small = MemoryTransport(bus, "small", inbox_capacity=10)
    small.subscribe(TOPIC)
    small.start()
    peers["quiet"].publish(TOPIC, b"q0")
    for i in range(100):
        peers["loud"].publish(TOPIC, b"l%d" % i)
        if i == 50:
            peers["quiet"].publish(TOPIC, b"q1")
    items = small.drain(TOPIC)
    assert [i.data for i in items if i.from_peer == "quiet"] == [b"q0", b"q1"]
    assert small.dropped_by_sender() == {"loud": 92} and len(items) == 10
    assert all(i.neighbour == i.from_peer for i in items)  # direct delivery on the bus


def test_forward_models_a_relay():
    bus = MemoryBus()
    peers = network(bus, ("relay", "b"))
    peers["relay"].forward(TOPIC, b"x", origin="someone")
    (item,) = peers["b"].drain(TOPIC)
    assert (item.from_peer, item.neighbour) == ("someone", "relay")


def test_publish_before_start_delivers_after_close_drops_and_counts():
    bus = MemoryBus()
    peers = network(bus, ("b", "c"))
    early = MemoryTransport(bus, "a")
    early.publish(TOPIC, b"x")  # like libp2p's queue-until-started
    assert len(peers["b"].drain(TOPIC)) == 1
    peers["c"].close()
    peers["c"].close()  # idempotent
    assert peers["b"].peers() == []
    peers["c"].publish(TOPIC, b"y")
    assert peers["c"].stats()["dropped_outbound_closed"] == 1
    with pytest.raises(RuntimeError):
        peers["c"].start()


def test_injected_loss_duplication_and_latency():
    clock = FakeClock(100.0)
    bus = MemoryBus(loss=0.3, duplicate=0.2, latency_s=(0.5, 1.5), seed=3, clock=clock)
    peers = network(bus, ("a", "b"))
    for i in range(1000):
        peers["a"].publish(TOPIC, i.to_bytes(2, "big"))
    assert peers["b"].drain(TOPIC) == []  # nothing has arrived yet
    clock.now += 2.0
    got = peers["b"].drain(TOPIC)
    assert 600 < len(got) < 900  # ~700 survive loss, ~20% of those duplicated
    assert bus.counters["lost"] + len(got) - bus.counters["duplicated"] == 1000
    order = [int.from_bytes(item.data, "big") for item in got]
    assert order != sorted(order)  # jittered latency reorders, as gossip does
    assert all(item.received_at <= clock.now for item in got)


def test_partition_and_heal():
    peers = network(MemoryBus())
    peers["a"].bus.partition(["a", "b"], ["c"])
    peers["a"].publish(TOPIC, b"x")
    assert len(peers["b"].drain(TOPIC)) == 1 and peers["c"].drain(TOPIC) == []
    assert peers["c"].peers() == []
    peers["a"].bus.heal()
    peers["a"].publish(TOPIC, b"y")
    assert len(peers["c"].drain(TOPIC)) == 1


def test_concurrent_publishers_lose_nothing():
    peers = network(MemoryBus(), ("a", "b", "c", "sink"))

    def blast(name: str) -> None:
        for i in range(500):
            peers[name].publish(TOPIC, f"{name}{i}".encode())

    threads = [threading.Thread(target=blast, args=(name,)) for name in ("a", "b", "c")]
    drained = []
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        drained += peers["sink"].drain(TOPIC)
    for thread in threads:
        thread.join()
    drained += peers["sink"].drain(TOPIC)
    assert len(drained) == 1500 and len({item.data for item in drained}) == 1500


def test_end_to_end_outbox_transport_ingress():
    bus = MemoryBus(duplicate=0.5, latency_s=(0.0, 0.01), seed=1)
    identities = {name: NodeIdentity.generate() for name in ("a", "b", "c")}
    transports = {}
    for name, identity in identities.items():
        transport = MemoryTransport(bus, identity.peer_id())
        transport.subscribe(TOPIC)
        transport.start()
        transports[name] = transport
    for name, identity in identities.items():
        outbox = Outbox(identity)
        for i in range(5):
            outbox.publish(transports[name], "test", make_rollout_group(2, 4, index=i))
    time.sleep(0.02)
    ingress = Ingress()
    verified = ingress.accept_many(transports["a"].drain(TOPIC))
    assert len(verified) == 10  # b's and c's, once each: duplicates refused as replays
    assert {v.sender for v in verified} == {identities["b"].peer_id(), identities["c"].peer_id()}
    assert all(v.sender == v.from_peer for v in verified)  # no relays on the memory bus
    assert set(ingress.rejected) <= {"replay"}
