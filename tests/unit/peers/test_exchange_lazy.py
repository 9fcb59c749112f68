"""Verify what the mix will use: peers' groups are checked cheaply on arrival and verified only when
picked (or audited), and peers' hint requests wait unverified until the node can answer one.

A real tiny Node with its SwarmExchange on the in-process bus; peers publish real signed envelopes."""
import time

import pytest

from node.commands.status import exchange_summary
from node.observe.control import status_reply
from node.train.groups import ScoredGroup
from node.service.assembly import memory_bus_node
from node.service.join import snapshot
from node.tasks.base import Task
from node.peers.wire import to_wire, wire_task_ref
from policy.types import Rollout
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, Outbox, topic_name
from protocol.testing import forge, seal_message
from tests.support.tiny_node import tiny_cfg

SWARM = "lazy"


@pytest.fixture()
def bus():
    return MemoryBus()


def make_node(tmp_path, bus, *overrides):
    cfg = tiny_cfg(f"swarm.name={SWARM}", "swarm.admission.young_share_max=1.0", *overrides)
    return memory_bus_node(cfg, tmp_path, bus, "receiver")


def peer(bus, name):
    transport = MemoryTransport(bus, name)
    transport.start()
    return transport


def group_msg(node, index: int, correct: int, claimed: list[float] | None = None) -> swarm_pb2.RolloutGroup:
    """A group of 4 completions of a real task, `correct` of them right; rewards honestly computed
    unless `claimed` says otherwise."""
    task = node.source.batch(2000 + index, 1)[0]
    wrong = str((int(task.answer) + 1) % 10)
    texts = [task.answer] * correct + [wrong] * (4 - correct)
    tok = node.policy.tokenizer
    rollouts = [Rollout(prompt_ids=[], completion_ids=tok(t, add_special_tokens=False)["input_ids"], logprobs=[-0.7],
                        text=t, offsets=[(0, len(t))], truncated=True) for t in texts]
    rewards = claimed or [node.verifier.score(task, node.source, t)[0] for t in texts]
    group = ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards])
    return to_wire(group, 0, swarm_pb2.ModelCard(name="tiny"), swarm_pb2.SamplingParams(temperature=1.0,
                                                                                       max_new_tokens=1),
                   node.verifier.digest)


def test_only_the_picked_groups_are_verified(tmp_path, bus, identity):
    node = make_node(tmp_path, bus, "swarm.external_per_round=2", "swarm.audit_per_round=0")
    sender = peer(bus, "honest")
    outbox = Outbox(identity())
    for i in range(6):
        outbox.publish(sender, SWARM, group_msg(node, i, correct=2))  # reward variance: pooled
    for i in range(6, 12):
        outbox.publish(sender, SWARM, group_msg(node, i, correct=0))  # none: dropped before verification
    used = node.exchange.collect(0)
    row = node.exchange.last_round
    assert len(used) == 2 and all(g.rewards.count(1.0) == 2 for g in used)
    assert row["external_received"] == 12 and row["external_zero_variance"] == 6
    assert row["groups_verified"] == 2 and row["groups_verified_unused"] == 0  # was 12 verified for 2 used
    assert row["messages_checked"] == 12
    assert all(row[f"t_exchange_{phase}"] >= 0 for phase in ("ingress", "precheck", "score", "retokenize", "tier"))
    assert row["t_exchange_ingress"] > 0 and row["t_exchange_score"] > 0
    # what `swarm-node status` shows: the round's usage and the totals, one line of them
    reply = status_reply(snapshot(node, node.exchange, time.monotonic()))
    assert reply.rounds[0].groups_verified == 2 and reply.rounds[0].external_groups_received == 12
    assert reply.exchange_totals["groups_verified"] == 2 and reply.exchange_totals["t_exchange_score"] > 0
    assert "12 groups received, 2 verified (0 audits), 2 used: 1.00 verified per used" in \
        exchange_summary(dict(reply.exchange_totals))


def test_a_lying_pick_is_refused_and_its_slot_goes_to_an_honest_group(tmp_path, bus, identity):
    node = make_node(tmp_path, bus, "swarm.external_per_round=2", "swarm.audit_per_round=0")
    liar, honest = peer(bus, "liar"), peer(bus, "honest")
    liar_out, honest_out = Outbox(identity()), Outbox(identity())
    for i in range(3):  # all wrong, claimed half right: variance a verifier cannot find
        liar_out.publish(liar, SWARM, group_msg(node, i, correct=0, claimed=[1.0, 1.0, 0.0, 0.0]))
    for i in range(3, 6):
        honest_out.publish(honest, SWARM, group_msg(node, i, correct=1))
    used = node.exchange.collect(0)
    assert len(used) == 2 and {g.origin for g in used} == {honest_out.identity.peer_id()}
    assert node.exchange.rejected["wrong_reward"] >= 1  # counted against the liar's key
    scores = {p.peer_id: p.score for p in node.exchange.status()["peers"]}
    assert scores[liar_out.identity.peer_id()] < 0 < scores[honest_out.identity.peer_id()]


def test_a_liar_whose_groups_are_never_picked_is_caught_by_the_audit(tmp_path, bus, identity):
    """Claims without variance are never picked; the audit verifies them all the same."""
    node = make_node(tmp_path, bus, "swarm.external_per_round=1", "swarm.audit_per_round=1")
    liar, honest = peer(bus, "liar"), peer(bus, "honest")
    liar_key = identity()
    liar_out, honest_out = Outbox(liar_key), Outbox(identity())
    caught_at = None
    for round_index in range(12):
        # two right answers claimed wrong: a flat claim, so the mix never picks it
        liar_out.publish(liar, SWARM, group_msg(node, 100 + round_index, correct=2, claimed=[0.0] * 4))
        honest_out.publish(honest, SWARM, group_msg(node, 200 + round_index, correct=1))
        used = node.exchange.collect(round_index)
        assert all(g.origin != liar_key.peer_id() for g in used)
        if node.exchange.rejected["wrong_reward"] and caught_at is None:
            caught_at = round_index
    assert caught_at is not None, "the audit never verified the liar's groups"
    status = node.exchange.status()
    assert status["rejected_by_reason"]["wrong_reward"] >= 2  # every audit of it is a catch...
    liar_score = {p.peer_id: p for p in status["peers"]}[liar_key.peer_id()]
    assert liar_score.banned  # ...until its key is banned (its score resets with the ban), as for a picked lie
    assert status["rejected_by_reason"]["banned"] >= 1  # its later groups never reach the pool
    # the honest sender's groups were picked (verified then), so the audit had only the liar to check
    assert 2 <= sum(r["groups_audited"] for r in status["rounds"]) <= 12


def hint_request(task: Task) -> swarm_pb2.HintRequest:
    return swarm_pb2.HintRequest(task_ref=wire_task_ref(task.ref))


def test_hint_requests_wait_unverified_and_are_checked_only_when_answered(tmp_path, bus, identity):
    node = make_node(tmp_path, bus)
    exchange = node.exchange
    asker_key = identity()
    asker, asker_out = peer(bus, "asker"), Outbox(asker_key)
    forger = peer(bus, "forger")
    tasks = node.source.batch(3000, 3)
    for task in tasks:
        asker_out.publish(asker, SWARM, hint_request(task), priority=1)
    asker_out.publish(asker, SWARM, hint_request(tasks[0]), priority=1)  # a duplicate: dropped unchecked
    raw = seal_message(identity(), hint_request(tasks[1]), 1, int(time.time() * 1000))
    forger.publish(topic_name(SWARM, "hint-requests"), forge(raw, asker_key, identity()))
    exchange.collect(0)
    assert exchange.last_round["messages_checked"] == 0  # nothing was answerable: nothing checked
    waiting = exchange.status()["hint_requests"]
    assert waiting["waiting"] == 3 and waiting["hint_request_duplicate"] == 2  # the repeat and the forgery

    answerable = {tasks[2].prompt_key}
    served = exchange.take_hint_requests(5, lambda task: task.prompt_key in answerable)
    assert [(t.prompt_key, sender) for t, sender in served] == [(tasks[2].prompt_key,
                                                                 asker_out.identity.peer_id())]
    assert exchange.ingress.snapshot().accepted == 1  # only the one answered met the Ingress
    assert exchange.take_hint_requests(5, lambda task: False) == [] and len(exchange.hint_traffic.requests) == 2


def test_an_established_senders_zero_variance_claims_are_skimmed_yet_audited(tmp_path, bus, identity):
    """Established keys' flat claims skip the Ingress (node/peers/skim.py); the audit still checks them."""
    node = make_node(tmp_path, bus, "swarm.external_per_round=2", "swarm.audit_per_round=1",
                     "swarm.admission.young_groups=1", "swarm.admission.young_rounds=0")
    key = identity()
    sender, out = peer(bus, key.peer_id()), Outbox(key)  # its bus origin is its key, as on libp2p
    exchange = node.exchange
    out.publish(sender, SWARM, group_msg(node, 0, correct=1))
    assert len(exchange.collect(0)) == 1  # credited: established from the next round
    exchange.collect(1)
    assert not exchange.pool.admission.is_young(key.peer_id())
    for i in range(3):  # right answers claimed wrong: flat lies, never picked
        out.publish(sender, SWARM, group_msg(node, 10 + i, correct=2, claimed=[0.0] * 4))
    out.publish(sender, SWARM, group_msg(node, 20, correct=1))
    used = exchange.collect(2)
    row = exchange.last_round
    assert row["messages_skimmed"] == 3 and row["external_zero_variance"] == 3 and row["external_received"] == 4
    # one message through the Ingress on arrival (the trainable group), one for the audit of the latest skim
    assert row["messages_checked"] == 2 and len(used) == 1
    assert exchange.rejected["wrong_reward"] == 1 and row["groups_audited"] == 1
    # a forgery claiming the established key from another origin is never skimmed: the Ingress refuses it
    forger = peer(bus, "forger")
    forger.publish(topic_name(SWARM, "rollouts"), forge(out.seal(group_msg(node, 30, correct=0)), key, identity()))
    exchange.collect(3)
    assert exchange.last_round["messages_skimmed"] == 0
    assert exchange.ingress.rejected_counts().get("bad_signature") == 1
