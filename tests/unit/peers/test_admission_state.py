"""Issue 16: what makes a key established when its groups are solved, and admission state that a
restart does not forget. Real tiny nodes with their real exchange on the in-process bus; peers
publish real signed envelopes."""
from __future__ import annotations

import logging

from node.peers.admission import DUPLICATE
from node.peers.wire import to_wire
from node.train.groups import ScoredGroup
from node.train.loop import EXCHANGE_STATE, Node
from node.service.assembly import memory_bus_node
from policy.types import Rollout
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox
from tests.support.tiny_node import tiny_cfg

SWARM = "st"


def receiver(run_dir, bus, resume=False) -> Node:
    # one young slot a round (0.25 of J = 4); two credits make a key established, no waiting time
    cfg = tiny_cfg(f"swarm.name={SWARM}", "swarm.admission.young_groups=2", "swarm.admission.young_rounds=0")
    node = memory_bus_node(cfg, run_dir, bus, "receiver")
    if resume:
        node.resume()
    return node


class Peer:
    def __init__(self, bus, name: str):
        self.transport = MemoryTransport(bus, name)
        self.transport.start()
        self.identity = NodeIdentity.generate()
        self.outbox = Outbox(self.identity)

    @property
    def key(self) -> str:
        return self.identity.peer_id()

    def send(self, node: Node, index: int, solved: bool) -> None:
        """A group for task `index`, honestly scored: all four answers right (solved: no variance)
        or two right, two wrong."""
        task = node.source.batch(1000 + index, 1)[0]
        wrong = str((int(task.answer) + 1) % 10)
        texts = [task.answer] * 4 if solved else [task.answer, wrong, task.answer, wrong]
        tok = node.policy.tokenizer
        rollouts = [Rollout(prompt_ids=[], completion_ids=tok(t, add_special_tokens=False)["input_ids"],
                            logprobs=None, text=t, offsets=[(0, len(t))], truncated=True) for t in texts]
        rewards = [node.verifier.score(task, node.source, t)[0] for t in texts]
        group = ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards])
        message = to_wire(group, 0, swarm_pb2.ModelCard(name="tiny"), swarm_pb2.SamplingParams(temperature=1.0))
        self.outbox.publish(self.transport, SWARM, message)


def test_an_honest_peer_whose_groups_are_solved_becomes_established(tmp_path):
    """Its zero-variance groups are verified, never trained; before, it stayed young forever."""
    bus = MemoryBus()
    node = receiver(tmp_path, bus)
    solver = Peer(bus, "solver")
    admission = node.exchange.pool.admission
    for round_index in range(3):
        solver.send(node, round_index, solved=True)
        assert node.exchange.collect(round_index) == []  # nothing to train on in a solved group
    assert admission.keys[solver.key].credited == 2
    assert not admission.is_young(solver.key)


def test_fresh_keys_sending_solved_groups_earn_no_faster_than_the_young_share(tmp_path):
    """30 fresh keys, each a new solved group every round for 6 rounds: one young slot a round and
    two credits each, so at most 3 keys can be established, as with trained groups."""
    bus = MemoryBus()
    node = receiver(tmp_path, bus)
    sybils = [Peer(bus, f"sybil{i}") for i in range(30)]
    for round_index in range(6):
        for i, sybil in enumerate(sybils):
            sybil.send(node, 100 * round_index + i, solved=True)
        node.exchange.collect(round_index)
    admission = node.exchange.pool.admission
    established = [s for s in sybils if not admission.is_young(s.key)]
    assert sum(admission.keys[s.key].credited for s in sybils if s.key in admission.keys) == 6
    assert len(established) <= 3  # the six credits may fall on six keys (young slots rotate over keys)


def test_a_restart_keeps_established_peers_and_remembers_what_was_trained(tmp_path):
    """Save with the checkpoint, load in a fresh node from the same run dir: the peer is still
    established, and a group trained before the restart, re-signed by another key, is refused."""
    bus = MemoryBus()
    node = receiver(tmp_path, bus)
    honest = Peer(bus, "honest")
    trained = []
    for round_index in range(3):
        honest.send(node, round_index, solved=False)
        trained += node.exchange.collect(round_index)
    assert len(trained) == 3 and not node.exchange.pool.admission.is_young(honest.key)
    saved = node.checkpoint(2)
    assert (saved / EXCHANGE_STATE).is_file()
    node.exchange.transport.close()

    bus = MemoryBus()  # the restarted node: fresh objects, same run dir
    restarted = receiver(tmp_path, bus, resume=True)
    assert restarted.next_round == 3
    admission = restarted.exchange.pool.admission
    assert not admission.is_young(honest.key)
    assert admission.keys[honest.key].credited == 3
    resigner = Peer(bus, "resigner")
    resigner.send(restarted, 0, solved=False)  # the content of round 0's trained group, another key
    honest.transport = MemoryTransport(bus, "honest")
    honest.transport.start()
    honest.send(restarted, 3, solved=False)
    used = restarted.exchange.collect(3)
    assert restarted.exchange.rejected[DUPLICATE] == 1
    assert [g.origin for g in used] == [honest.key]  # established: not held to the young share


def test_a_corrupt_or_missing_state_file_means_empty_state_and_a_warning(tmp_path, caplog):
    bus = MemoryBus()
    node = receiver(tmp_path, bus)
    peer = Peer(bus, "peer")
    for round_index in range(3):
        peer.send(node, round_index, solved=False)
        node.exchange.collect(round_index)
    saved = node.checkpoint(2)
    node.exchange.transport.close()
    for damage in ('{"admission": {"version": 1, "keys": [["k", "x"]]}}', "{not json", None):
        if damage is None:
            (saved / EXCHANGE_STATE).unlink()
        else:
            (saved / EXCHANGE_STATE).write_text(damage)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            restarted = receiver(tmp_path, MemoryBus(), resume=True)
        assert restarted.exchange.pool.admission.keys == {}
        assert any("admission state" in r.getMessage() for r in caplog.records), damage
        restarted.exchange.transport.close()
