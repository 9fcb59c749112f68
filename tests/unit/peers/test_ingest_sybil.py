"""Issue 16: free origins must not crowd an established peer out of verification or of the mix.

A real tiny node's exchange with background ingest (its real IngestWorker thread and Admission) on
the in-process bus. One honest peer A earns weight first; then, every round for ATTACK_ROUNDS rounds
paced at ROUND_S, 64 Sybil hosts (a key each) and 1,000 more origins (a key each) flood valid,
honestly scored, distinct groups, each a full verification for the receiver, while A keeps sending
its usual groups. The receiver must verify and train on A's groups every round, and attacker keys
may hold at most `swarm.admission.young_share_max` of its external mix.

In-process on purpose: over p2pd every GossipSub origin is a libp2p host of its own (messages are
signed by their origin), so 1,000 origins would take 1,000 daemons."""
from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from node.peers.wire import wire_task_ref
from node.train.loop import Node
from node.observe.control import status_reply
from node.service.assembly import memory_bus_node
from node.service.join import snapshot
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, NodeIdentity, topic_name
from protocol.testing import seal_message
from tests.support.waiting import wait_until

SWARM = "syb"
TOPIC = topic_name(SWARM, "rollouts")
SYBIL_HOSTS = 64
SYBIL_PER_HOST = 2      # messages a round from each Sybil host
FRESH_ORIGINS = 1_000   # one message a round from each
HONEST_PER_ROUND = 4    # A's groups a round (J = 4)
ATTACK_ROUNDS = 6
ROUND_S = 1.0           # the receiver runs one round per second
WARMUP_ROUNDS = 8       # A earns `young_groups` (8) used groups, one a round in its young slot


class GroupMaker:
    """Valid, distinct groups with reward variance: a real task, one-character completions (the tiny
    model's), the rewards the receiver's verifier computes. Distinct content: different multisets
    of completions, so content dedup (node/peers/admission.py) refuses none of them."""

    def __init__(self, node: Node, seed: int):
        self.node = node
        self.rng = random.Random(seed)
        self.tasks = node.source.batch(seed, 64)
        self._rewards: dict[tuple[str, str], float] = {}

    def reward(self, task, text: str) -> float:
        key = (task.prompt_key, text)
        if key not in self._rewards:
            self._rewards[key] = self.node.verifier.score(task, self.node.source, text)[0]
        return self._rewards[key]

    def group(self) -> swarm_pb2.RolloutGroup:
        task = self.rng.choice(self.tasks)
        wrong = [d for d in "0123456789" if d != task.answer]
        texts = [task.answer] * self.rng.randint(1, 4) + self.rng.choices(wrong, k=self.rng.randint(4, 8))
        msg = swarm_pb2.RolloutGroup(task_ref=wire_task_ref(task.ref),
                                     model=swarm_pb2.ModelCard(name="tiny", tokenizer_fingerprint="peer"),
                                     sampling=swarm_pb2.SamplingParams(temperature=1.0, max_new_tokens=1),
                                     question=task.question, answer=task.answer)
        for text in texts:
            msg.completions.add(text=text, claimed_reward=self.reward(task, text))
        return msg


class Sender:
    """A key publishing on the bus under its own peer id as the GossipSub origin."""

    def __init__(self, relay: MemoryTransport):
        self.key = NodeIdentity.generate()
        self.peer_id = self.key.peer_id()
        self.relay = relay
        self.sequence = 0

    def send(self, body: swarm_pb2.RolloutGroup) -> None:
        self.sequence += 1
        self.relay.forward(TOPIC, seal_message(self.key, body, self.sequence, int(time.time() * 1000)), self.peer_id)


def attacker_share(used_by_round: list[Counter], honest: str) -> float:
    total = sum(sum(c.values()) for c in used_by_round)
    return sum(n for c in used_by_round for key, n in c.items() if key != honest) / max(1, total)


@pytest.mark.slow
@pytest.mark.serial
def test_an_established_peer_is_verified_and_mixed_every_round_whatever_sybils_send(tmp_path, tiny_config):
    bus = MemoryBus()
    relay = MemoryTransport(bus, "relay")  # delivers every sender's messages under their own origin
    relay.start()
    honest = Sender(relay)
    # A is the receiver's --peers: the bootstrap window promotes it once it has its credits and rounds
    peers = f'swarm.peers=["/ip4/127.0.0.1/tcp/4001/p2p/{honest.peer_id}"]'
    cfg = tiny_config(f"swarm.name={SWARM}", "swarm.external_per_round=4", peers)
    receiver = memory_bus_node(cfg, tmp_path / "receiver", bus, "receiver", ingest="background")
    exchange = receiver.exchange
    honest_groups, attack_groups = GroupMaker(receiver, 1), GroupMaker(receiver, 2)
    admission = exchange.pool.admission
    noted_useful: set[str] = set()  # what p2pd would keep connected and rank first in its peer cache
    exchange.note_useful = noted_useful.update
    try:
        # A earns weight: one group a round, used in the young slot, then enough rounds pass
        for round_index in range(WARMUP_ROUNDS):
            honest.send(honest_groups.group())
            wait_until(lambda: any(e.group.origin == honest.peer_id for e in exchange.pool.entries),
                       "A's group in the pool", 10.0, step=0.01)
            assert [g.origin for g in exchange.collect(round_index)] == [honest.peer_id]
        first_attack_round = 100  # > young_rounds after A's first group
        exchange.collect(first_attack_round - 1)
        assert not admission.is_young(honest.peer_id)

        sybils = [Sender(relay) for _ in range(SYBIL_HOSTS)]
        fresh = [Sender(relay) for _ in range(FRESH_ORIGINS)]
        flood = [s for s in sybils for _ in range(SYBIL_PER_HOST)] + fresh
        attacker_keys = {s.peer_id for s in sybils + fresh}
        used_by_round: list[Counter] = []
        for round_index in range(first_attack_round, first_attack_round + ATTACK_ROUNDS + 1):
            started = time.monotonic()
            used = exchange.collect(round_index)  # what arrived during the previous round
            if round_index > first_attack_round:
                used_by_round.append(Counter(g.origin for g in used))
            if round_index == first_attack_round + ATTACK_ROUNDS:
                break
            for _ in range(HONEST_PER_ROUND):
                honest.send(honest_groups.group())
            for sender in flood:
                sender.send(attack_groups.group())
            time.sleep(max(0.0, ROUND_S - (time.monotonic() - started)))
        status = exchange.status()
        reply = status_reply(snapshot(receiver, exchange, time.monotonic()))  # what `swarm-node status` shows
    finally:
        exchange.close()

    ingest = status["ingest"]
    summary = (f"used per round {[dict(c) for c in used_by_round][:2]}..., ingest {ingest}, "
               f"rejected {status['rejected_by_reason']}")
    print(f"\nA used in {sum(c[honest.peer_id] >= 1 for c in used_by_round)}/{len(used_by_round)} rounds; "
          f"attacker share of the external mix {attacker_share(used_by_round, honest.peer_id):.2f}; "
          f"ingest {ingest}")
    assert all(c[honest.peer_id] >= 1 for c in used_by_round), summary  # A verified and used every round
    honest_used = sum(c[honest.peer_id] for c in used_by_round)
    attacker_used = sum(n for c in used_by_round for key, n in c.items() if key in attacker_keys)
    assert attacker_used + honest_used == sum(sum(c.values()) for c in used_by_round)
    assert attacker_used >= 1, summary  # the flood was verified and competed for the young slots
    assert attacker_used <= cfg.swarm.admission.young_share_max * (attacker_used + honest_used), summary
    assert ingest["checked/young"] > 0 and sum(ingest["dropped"].values()) > 0, summary  # a real flood
    assert reply.ingest["checked/established"] == ingest["checked/established"] > 0
    assert {k for k in reply.ingest if k.startswith("dropped/")} == {f"dropped/{k}" for k in ingest["dropped"]}
    # `swarm-node status` names the established peer (promoted by the bootstrap window) and how often
    # each peer was verified
    assert list(reply.established) == [honest.peer_id] and reply.established_keys == 1
    assert reply.young_keys >= 1 and reply.ingest[f"checked_by_peer/{honest.peer_id}"] >= ATTACK_ROUNDS
    # the attackers' groups trained in young slots buy them neither a kept connection nor cache rank
    assert noted_useful == {honest.peer_id}, noted_useful - {honest.peer_id}
