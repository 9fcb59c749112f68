"""The SAPO exchange inside a real tiny node, over the in-process bus: verification and mixing.

A real Node (tiny preset) trains with a SwarmExchange on a MemoryBus; honest and hostile peers
publish real signed envelopes onto the same bus."""
import dataclasses
import math
import time

import pytest

from node.peers.exchange import SwarmExchange
from node.peers.wire import to_wire
from node.train.groups import ScoredGroup
from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics
from node.service.assembly import memory_bus_node
from policy.types import Rollout
from proto import swarm_pb2
from node.peers.ingest import ESTABLISHED, YOUNG, Staging
from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox, Received, topic_name
from protocol.testing import forge, seal_message, tamper_body

SWARM = "t"
TOPIC = topic_name(SWARM, "rollouts")


@pytest.fixture()
def bus():
    return MemoryBus()


@pytest.fixture()
def node(tmp_path, bus, tiny_config):
    # fresh keys get the whole mix here: these tests are about verification
    # (admission: tests/unit/peers/test_admission.py)
    cfg = tiny_config(f"swarm.name={SWARM}", "swarm.external_per_round=4", "swarm.admission.young_share_max=1.0")
    n = memory_bus_node(cfg, tmp_path, bus, "receiver")
    return n


def peer(bus, name):
    t = MemoryTransport(bus, name)
    t.start()
    return t


def honest_group(node: Node, index: int, texts=None, rewards=None, fingerprint="") -> swarm_pb2.RolloutGroup:
    """A group a well-behaved peer would send: a real task, rewards it computed honestly."""
    task = node.source.batch(1000 + index, 1)[0]
    wrong = str((int(task.answer) + 1) % 10)
    texts = texts or [task.answer, wrong, task.answer, wrong]
    tok = node.policy.tokenizer
    rollouts = [Rollout(prompt_ids=[], completion_ids=tok(t, add_special_tokens=False)["input_ids"], logprobs=[-0.7],
                        text=t, offsets=[(0, len(t))], truncated=True) for t in texts]
    scored = rewards or [node.verifier.score(task, node.source, t)[0] for t in texts]
    group = ScoredGroup(task=task, rollouts=rollouts, rewards=scored, correct=[r == 1.0 for r in scored])
    return to_wire(group, 0, swarm_pb2.ModelCard(name="tiny", tokenizer_fingerprint=fingerprint),
                   swarm_pb2.SamplingParams(temperature=1.0, max_new_tokens=1))


def test_honest_groups_are_rescored_retokenized_and_used(node, bus):
    honest, identity = peer(bus, "honest"), NodeIdentity.generate()
    outbox = Outbox(identity)
    for i in range(3):
        outbox.publish(honest, SWARM, honest_group(node, i))
    all_wrong = honest_group(node, 9)
    wrong_text = all_wrong.completions[1].text
    outbox.publish(honest, SWARM, honest_group(node, 9, texts=[wrong_text] * 4))  # zero variance
    groups = node.exchange.collect(0)
    assert len(groups) == 3 and all(g.origin == identity.peer_id() for g in groups)
    assert node.exchange.last_round["external_zero_variance"] == 1
    g = groups[0]
    assert g.rewards == [1.0, 0.0, 1.0, 0.0]  # recomputed by the receiver
    assert g.rollouts[0].prompt_ids[0] == node.policy.tokenizer.bos_token_id  # local prompt rendering
    # no tokenizer fingerprint on the card: the sender's log-probs are aligned on character boundaries
    assert all(r.tier == 1 and r.logprobs is None for r in g.rollouts)
    assert [r.alignment.sender_sums for r in g.rollouts] == [pytest.approx((-0.7,))] * 4
    assert node.exchange.last_round["external_tiers"] == {"0": 0, "1": 12, "2": 0}
    assert node.exchange.collect(1) == []  # each group is used once


def test_node_survives_every_hostile_input_and_counts_each_reason(node, bus, tmp_path, identity):
    honest, hostile = identity(), identity()
    now_ms = int(time.time() * 1000)
    good = seal_message(honest, honest_group(node, 0), sequence=10, timestamp_ms=now_ms)

    def send(name, data):
        peer(bus, name).publish(TOPIC, data)

    send("relay-1", good)
    send("relay-2", good)  # the same envelope again: replay
    send("forger", forge(seal_message(hostile, honest_group(node, 1), 11, now_ms), claimed=honest, signer=hostile))
    send("tamperer", tamper_body(seal_message(hostile, honest_group(node, 2), 12, now_ms)))
    send("giant", b"\x0a" * (5 * 1024 * 1024))
    send("garbage", b"\xff\x00not a protobuf\x13\x37")
    liar = honest_group(node, 3)
    liar.verifier_digest = node.verifier.digest  # claims our verifier, so it must match our rewards
    liar.completions[1].claimed_reward = 1.0  # claims a wrong answer was right
    send("liar", seal_message(hostile, liar, 13, now_ms))
    unknown = honest_group(node, 4)
    unknown.task_ref.config_digest = "0" * 16  # a family of ours named wrongly (another source: not configured)
    send("stranger", seal_message(hostile, unknown, 14, now_ms))
    for i, value in enumerate([math.nan, 0.5]):
        bad = honest_group(node, 5 + i)
        bad.completions[0].behavior_logprobs[0] = value
        send(f"bad-logprob-{i}", seal_message(hostile, bad, 15 + i, now_ms))
    flooder, flood_key = peer(bus, "flooder"), identity()
    flood_body = honest_group(node, 7)
    for i in range(260):  # valid, signed, but beyond the burst of 200 messages per peer
        flooder.publish(TOPIC, seal_message(flood_key, flood_body, 100 + i, now_ms))

    node.run(3, RoundTable("hostile", quiet=True))  # must not raise

    status = node.exchange.status()
    reasons = status["rejected_by_reason"]
    for reason in ("replay", "bad_signature", "oversized", "malformed", "wrong_reward", "unknown_task",
                   "nonfinite_logprob", "positive_logprob", "rate_limited"):
        assert reasons.get(reason, 0) >= 1, (reason, reasons)
    assert reasons["bad_signature"] >= 2  # forged and tampered
    assert status["ingress_accepted"] >= 200 and honest.peer_id() in status["used_by_sender"]
    # the flooder's 200 admitted copies of one group: pooled once, the rest refused as duplicates
    assert reasons["duplicate_content"] >= 195 and status["accepted"] <= status["ingress_accepted"] - 195
    assert [r["round"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    scores = {p.peer_id: p for p in status["peers"]}
    assert scores[hostile.peer_id()].score < 0 < scores[honest.peer_id()].score


def test_a_peer_with_a_family_we_lack_costs_nothing_net_unlike_one_naming_ours_wrongly(node, bus):
    """An honest peer whose task family (or reasoning-gym seed) we do not configure was banned in
    1-4 minutes (unknown_task -0.2 against +0.1 a message); a ref to a family of ours that we cannot
    rebuild (digest, index, a held-out question) still costs."""
    lacking, lacking_key = peer(bus, "lacking"), NodeIdentity.generate()
    wrong, wrong_key = peer(bus, "wrong"), NodeIdentity.generate()
    now_ms = int(time.time() * 1000)
    for i in range(150):
        other_family = honest_group(node, i)
        other_family.task_ref.source = "reasoning_gym"
        other_family.task_ref.dataset = "leg_counting"  # not in this node's sources
        lacking.publish(TOPIC, seal_message(lacking_key, other_family, 1 + i, now_ms))
        misnamed = honest_group(node, i)
        misnamed.task_ref.config_digest = "0" * 16
        wrong.publish(TOPIC, seal_message(wrong_key, misnamed, 1 + i, now_ms))
        if i % 50 == 49:  # rounds of 50: inline ingest scores a round's drain before its refusals, and a
            node.exchange.collect(i // 50)  # positive score is capped at 10
    status = node.exchange.status()
    assert status["rejected_by_reason"]["task_not_configured"] == 150
    assert status["rejected_by_reason"]["unknown_task"] >= 100  # until its ban
    scores = {p.peer_id: p for p in status["peers"]}
    lacking_score = scores[lacking_key.peer_id()]
    assert not lacking_score.banned and lacking_score.accepted == 150 and abs(lacking_score.score) < 0.01
    assert scores[wrong_key.peer_id()].banned


def test_the_staging_lane_follows_the_signer_once_authenticated(tmp_path, bus, tiny_config):
    """Staging runs before the Ingress, so it classes a message by its delivering host; once the
    host's messages are authenticated, by their signer: an established host publishing a fresh key's
    messages stages young, and a host whose id is not its key stages as its key."""
    cfg = tiny_config(f"swarm.name={SWARM}", "swarm.admission.young_share_max=1.0",
                      "swarm.admission.young_groups=1", "swarm.admission.young_rounds=0")
    node = memory_bus_node(cfg, tmp_path, bus, "receiver")
    exchange = node.exchange
    established, fresh = NodeIdentity.generate(), NodeIdentity.generate()
    host = established.peer_id()
    established_out, host_transport = Outbox(established), peer(bus, host)  # the host's id is its key
    established_out.publish(host_transport, SWARM, honest_group(node, 0))
    exchange.collect(0)
    exchange.collect(1)
    staging = Staging(per_sender=8, max_total=100, sender_class=exchange.gate.sender_class)
    staging.add(TOPIC, [Received(host, b"", 0.0)])
    assert staging.lanes[ESTABLISHED].queued(host) == 1
    host_transport.publish(TOPIC, Outbox(fresh).seal(honest_group(node, 1)))  # a fresh key's
    exchange.collect(2)
    staging.add(TOPIC, [Received(host, b"", 0.0)])
    assert staging.lanes[YOUNG].queued(host) == 2 and not staging.lanes[ESTABLISHED].queued(host)
    named = peer(bus, "a-bus-name")  # a host whose id is not its key: classed by its key once authenticated
    assert exchange.gate.sender_class("a-bus-name") == YOUNG
    established_out.publish(named, SWARM, honest_group(node, 2))
    exchange.collect(3)
    assert exchange.gate.sender_class("a-bus-name") == ESTABLISHED


def test_sender_answers_only_when_opted_in(node, bus):
    unknown = honest_group(node, 0)
    unknown.task_ref.source = "reasoning_gym"
    unknown.task_ref.dataset = "leg_counting"
    identity = NodeIdentity.generate()
    strict = node.exchange
    assert strict.verify_group(identity.peer_id(), unknown) is None
    lenient = SwarmExchange(MemoryTransport(bus, "lenient"), NodeIdentity.generate(),
                            dataclasses.replace(strict.context, accept_sender_answers=True, sandbox=None),
                            strict.options)
    group = lenient.verify_group(identity.peer_id(), unknown)
    assert group is not None and group.rewards == [1.0, 0.0, 1.0, 0.0]


def test_untokenizable_text_is_dropped_not_crashing(node):
    group = honest_group(node, 0)
    group.completions[1].text = "é"  # a wrong answer (claimed 0, scores 0) outside the tiny vocabulary
    assert node.exchange.verify_group("someone", group) is None
    assert node.exchange.rejected["untokenizable"] == 1


def test_per_sender_sampling_and_cap_resist_a_flooding_peer(tmp_path, bus, tiny_config, identity):
    cfg = tiny_config(f"swarm.name={SWARM}", "swarm.external_per_round=2", "swarm.admission.young_share_max=1.0")
    node = memory_bus_node(cfg, tmp_path, bus, "receiver")
    flood_key, honest_key = identity(), identity()
    flood, honest = Outbox(flood_key), Outbox(honest_key)
    flooder, good = peer(bus, "flooder"), peer(bus, "good")
    for i in range(40):  # distinct contents: the pool refuses a duplicate whoever signs it
        answer = node.source.batch(1100 + i, 1)[0].answer
        texts = [answer, "0123456789+m"[i % 12]] + ["="] * (1 + i // 12)
        flood.publish(flooder, SWARM, honest_group(node, 100 + i, texts=texts))
    honest.publish(good, SWARM, honest_group(node, 0))
    exchange = node.exchange
    used = exchange.collect(0)
    assert {g.origin for g in used} == {flood_key.peer_id(), honest_key.peer_id()}  # one of each sender
    assert sum(e.group.origin == flood_key.peer_id() for e in exchange.pool.entries) <= exchange.pool.max_per_sender
    assert exchange.observed["pool_sender_cap"] == 40 - exchange.pool.max_per_sender


def test_status_accepted_counts_only_messages_that_passed_every_check(node, bus, identity):
    """`accepted` in status is what passed the Ingress AND this node's own checks; a Hint on the
    rollouts topic is refused as wrong_topic (kind and topic are bound)."""
    liar, honest = peer(bus, "liar"), peer(bus, "honest")
    lying = honest_group(node, 1)
    lying.verifier_digest = node.verifier.digest  # claims our verifier, so it must match our rewards
    lying.completions[1].claimed_reward = 1.0  # signature fine, reward a lie: the Ingress lets it through
    Outbox(identity()).publish(liar, SWARM, lying)
    Outbox(identity()).publish(honest, SWARM, honest_group(node, 2))
    hint = swarm_pb2.Hint(task_ref=lying.task_ref, level=swarm_pb2.Hint.L1, text="think")
    honest.publish(TOPIC, seal_message(identity(), hint, 1, int(time.time() * 1000)))  # Hint on rollouts
    node.exchange.collect(0)
    status = node.exchange.status()
    assert status["rejected_by_reason"]["wrong_reward"] == 1
    assert status["rejected_by_reason"]["wrong_topic"] == 1
    assert status["ingress_accepted"] == 2 and status["accepted"] == 1


def test_the_node_names_the_peers_whose_groups_it_used_to_the_transport(tmp_path, bus, tiny_config):
    """The p2pd peer cache ranks those peers first (issue 16); protocol never imports node, so the
    exchange tells the transport plain peer ids."""
    from node.train.assembly import build_parts
    from node.service.assembly import build_exchange

    class NotingTransport(MemoryTransport):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.noted: list[list[str]] = []

        def note_useful_peers(self, peer_ids: list[str]) -> None:
            self.noted.append(list(peer_ids))

    cfg = tiny_config(f"swarm.name={SWARM}", "swarm.external_per_round=4",
                      "swarm.admission.young_groups=0", "swarm.admission.young_rounds=0")  # nobody young: only
    parts = build_parts(cfg)  # established keys are named (tests/unit/peers/test_ingest_sybil.py: young ones are not)
    transport = NotingTransport(bus, "receiver")
    transport.start()
    n = Node(cfg, tmp_path, build_exchange(parts, NodeIdentity.generate(), transport, ingest="inline"), parts=parts)
    honest, identity = peer(bus, "honest"), NodeIdentity.generate()
    outbox = Outbox(identity)
    for i in range(2):
        outbox.publish(honest, SWARM, honest_group(n, i))
    assert len(n.exchange.collect(0)) == 2
    assert transport.noted == [[identity.peer_id()]]
    assert n.exchange.collect(1) == [] and transport.noted == [[identity.peer_id()]]  # nothing used: nothing named
