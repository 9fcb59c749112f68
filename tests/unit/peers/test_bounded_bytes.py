"""What peers' messages may hold of a node's memory is bounded by bytes, not only by count: the audit
memory (node/peers/audit.py), the ingest staging (node/peers/ingest.py) and the transports' inboxes.

The audit memory is checked on a real tiny Node's exchange on the in-process bus: established keys
skim messages of about 1 MB (zero-variance claims, node/peers/skim.py), and what the audit holds is
counted by draining it."""
import random
import time

import pytest

from node.peers.audit import AUDIT_MAX_BYTES, Unaudited
from node.peers.ingest import ESTABLISHED, YOUNG, Staging
from node.service.assembly import memory_bus_node
from protocol import MemoryBus, MemoryTransport, Outbox, Received, topic_name
from protocol.testing import seal_message
from protocol.transports.options import P2pdOptions
from protocol.transports.p2pd.shared import topic_inbox
from tests.unit.peers.test_exchange_lazy import group_msg
from tests.support.tiny_node import tiny_cfg

SWARM = "bytes"
MB = 1_000_000


def held_bytes(unaudited) -> int:
    """Every group the audit memory holds, drawn out of it and measured (its own count is not trusted)."""
    total, rng = 0, random.Random(0)
    while len(unaudited):
        for _, group in unaudited.draw(rng, len(unaudited)):
            total += len(group.data) if isinstance(group, Received) else group.ByteSize()
    return total


def big_flat_group(node, index: int, nbytes: int):
    """A real task's group whose 4 completions claim the same reward, about `nbytes` on the wire."""
    msg = group_msg(node, index, correct=0)
    for completion in msg.completions:
        completion.text = "x" * (nbytes // len(msg.completions))
    return msg


def test_the_audit_memory_stays_within_its_byte_bound_under_a_skim_of_1_mb_messages(tmp_path, identity):
    bus = MemoryBus()
    node = memory_bus_node(tiny_cfg(f"swarm.name={SWARM}", "swarm.admission.young_share_max=1.0",
                                    "swarm.admission.young_groups=1", "swarm.admission.young_rounds=0",
                                    "swarm.external_per_round=12", "swarm.audit_per_round=0"),
                           tmp_path, bus, "receiver")
    exchange = node.exchange
    senders, questions = [], set()
    for i in range(100):  # 12 keys, each with a group of its own task (the same content twice is a duplicate)
        question = node.source.batch(2000 + i, 1)[0].question
        if len(senders) == 12 or question in questions:
            continue
        questions.add(question)
        key = identity()
        transport = MemoryTransport(bus, key.peer_id())  # its bus origin is its key, as on libp2p
        transport.start()
        senders.append((key, transport))
        Outbox(key).publish(transport, SWARM, group_msg(node, i, correct=1))
    exchange.collect(0)  # each key credited once: established from the next round
    exchange.collect(1)
    assert all(not exchange.pool.admission.is_young(key.peer_id()) for key, _ in senders)
    now_ms = int(time.time() * 1000)
    for i, (key, transport) in enumerate(senders):
        for sequence in range(5):  # the audit keeps each sender's latest 4
            raw = seal_message(key, big_flat_group(node, 100 + 10 * i + sequence, MB), 100 + sequence, now_ms)
            assert 0.9 * MB < len(raw) < 1.1 * MB
            transport.publish(topic_name(SWARM, "rollouts"), raw)
    exchange.collect(2)
    assert exchange.last_round["messages_skimmed"] == 60  # 60 MB skimmed; counts alone kept 48 of them
    reported = exchange.status()["audit_memory"]["bytes"]  # what `swarm-node status --json` shows
    held = held_bytes(exchange.unaudited)
    assert 0.75 * AUDIT_MAX_BYTES < held <= AUDIT_MAX_BYTES and reported == held


def test_the_audit_memory_takes_from_the_sender_holding_the_most_bytes():
    unaudited = Unaudited(len, max_bytes=1000)
    for i in range(4):
        unaudited.remember("honest", b"h" * 10)
        unaudited.remember("big", b"b" * 400)
    assert unaudited.nbytes == 40 + 800  # the big sender lost its 2 oldest: the honest one nothing
    assert sorted((s, len(g)) for s, g in unaudited.draw(random.Random(0), 2)) == [("big", 400), ("honest", 10)]


def test_staging_is_bounded_by_bytes_and_young_senders_by_their_share_of_them():
    staging = Staging(per_sender=64, max_total=1000, sender_class=lambda peer: YOUNG if "young" in peer
                      else ESTABLISHED, young_share=0.25, max_bytes=4000)
    for i in range(20):
        staging.add("rollouts", [Received(f"young-{i % 4}", b"y" * 100, 0.0)])
    assert staging.lanes[YOUNG].nbytes == 1000 and staging.total == 10  # young: a quarter of the bytes
    for i in range(40):
        staging.add("rollouts", [Received("flooder", b"f" * 200, 0.0), Received("honest", b"h" * 10, 0.0)])
    assert staging.nbytes <= 4000
    assert staging.queued("honest") == 40  # the flooder paid for the bytes, not the honest peer
    assert staging.dropped["staging_full/established"] > 0


@pytest.mark.parametrize("make_inbox", [
    lambda: topic_inbox(P2pdOptions(inbox_max_bytes=10 * MB)),
    lambda: MemoryTransport(MemoryBus(), "n", inbox_max_bytes=10 * MB)])
def test_a_transports_inbox_is_bounded_by_bytes(make_inbox):
    inbox = make_inbox()
    if isinstance(inbox, MemoryTransport):
        inbox.subscribe("t")
        inbox = inbox._inboxes["t"]
    for i in range(40):
        inbox.put("flooder", Received("flooder", b"f" * MB, 0.0))
    inbox.put("honest", Received("honest", b"h" * 100, 0.0))
    assert inbox.nbytes <= 10 * MB and inbox.queued("honest") == 1
