"""A failed pick costs the key its turn (node/peers/bench.py, node/peers/pool.py): keys whose picked or
audited groups fail verification, blamed or not, are benched and sent to the back of the young line.

The acceptance test drives a real tiny Node's SwarmExchange on the in-process bus (inline ingest:
deterministic); peers publish real signed envelopes."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from node.peers.admission import Admission
from node.peers.bench import Bench
from node.peers.pool import GroupPool, PoolEntry
from node.peers.reasons import MISMATCH, TOO_LONG, UNTOKENIZABLE
from node.service.assembly import memory_bus_node
from node.tasks.base import Task, TaskRef
from node.train.groups import ScoredGroup
from node.peers.wire import to_wire
from policy.types import Rollout
from proto import swarm_pb2
from protocol import MemoryBus, MemoryTransport, NodeIdentity, Outbox
from tests.support.tiny_node import tiny_cfg

SWARM = "bench"
ROUNDS = 40


def test_a_failure_benches_for_rounds_and_repeat_unverifiable_results_for_longer():
    bench = Bench(rounds=2, seconds=0.0, strikes=2)
    bench.fail("a", MISMATCH, 0)
    assert bench.benched("a", 1) and not bench.benched("a", 2) and not bench.benched("b", 0)
    assert bench.strikes_of("a") == 0  # a blamed failure goes to the ban score, not to the strikes
    lengths = []
    for round_index in range(10, 60, 10):
        bench.fail("a", UNTOKENIZABLE, round_index)
        lengths.append(next(r for r in range(round_index, round_index + 200) if not bench.benched("a", r))
                       - round_index)
    assert lengths == [2, 2, 4, 8, 16]  # from the third unverifiable result on, each doubles the bench
    bench.passed("a")  # a verified group halves the count
    assert bench.strikes_of("a") == 2
    bench.fail("b", TOO_LONG, 0)
    assert bench.order("c") == 0 < bench.order("a") < bench.order("b")  # the latest failure queues last


def test_seconds_bench_too_with_a_clock():
    now = [100.0]
    bench = Bench(rounds=1, seconds=30.0, strikes=3, clock=lambda: now[0])
    bench.fail("a", UNTOKENIZABLE, 0)
    assert bench.benched("a", 5)  # the rounds passed, the seconds not
    now[0] += 31
    assert not bench.benched("a", 5)


def scored(index: int, origin: str) -> ScoredGroup:
    task = Task(ref=TaskRef("synthetic", "copy", "0" * 16, 0, index), question=f"q{index}", answer="1", metadata={})
    rollouts = [Rollout(prompt_ids=[1], completion_ids=[1], logprobs=[-0.5], text=t, offsets=[(0, 1)],
                        truncated=False) for t in ("1", "0")]
    return ScoredGroup(task=task, rollouts=rollouts, rewards=[1.0, 0.0], correct=[True, False], origin=origin)


def test_within_one_sample_call_a_key_whose_group_failed_is_skipped():
    pool = GroupPool(100, 50, 32, Admission(1.0, 0, 0, 10), Counter())
    for i in range(4):
        pool.add(PoolEntry(scored(i, "bad"), 0))
    pool.add(PoolEntry(scored(10, "good"), 0))
    calls = Counter()

    class Verifier:  # stands in for node/peers/verification.py: "bad"'s groups fail
        @staticmethod
        def verify_pick(group):
            calls[group.origin] += 1
            return UNTOKENIZABLE if group.origin == "bad" else group

    pool.evict(0)
    chosen = pool.sample(1, "uniform", random.Random(0), verifier=Verifier())
    assert [g.origin for g in chosen] == ["good"] and calls["bad"] <= 1  # one failure, then skipped
    assert pool.bench.benched("bad", 0) and pool.held_by("bad") == 4 - calls["bad"]


def group_msg(node, index: int, texts: list[str]) -> swarm_pb2.RolloutGroup:
    """A group for a real task with honestly computed claims (a failing text scores 0, as we do)."""
    task = node.source.batch(5000 + index, 1)[0]
    rewards = [node.verifier.score(task, node.source, t)[0] for t in texts]
    rollouts = [Rollout(prompt_ids=[], completion_ids=[0], logprobs=[-0.7], text=t, offsets=[(0, len(t))],
                        truncated=True) for t in texts]
    group = ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards])
    return to_wire(group, 0, swarm_pb2.ModelCard(name="tiny"), swarm_pb2.SamplingParams(temperature=1.0,
                                                                                       max_new_tokens=1),
                   node.verifier.digest)


def answer_and_wrong(node, index: int) -> tuple[str, str]:
    task = node.source.batch(5000 + index, 1)[0]
    return task.answer, str((int(task.answer) + 1) % 10)


def test_failing_young_keys_seen_first_do_not_keep_an_honest_newcomer_out(tmp_path):
    """Issue 42: 2 attacker keys seen before an honest newcomer, each keeping 6 groups pooled a round
    that pass the cheap checks and fail verification blaming nobody (untokenizable, too_long). Before
    the bench the young slot went to the most senior attacker again and again: the newcomer was used
    0 times in 40 rounds."""
    bus = MemoryBus()
    node = memory_bus_node(tiny_cfg(f"swarm.name={SWARM}"), tmp_path, bus, "receiver")
    exchange = node.exchange
    attackers, honest = [], None
    for name in ("attacker-0", "attacker-1", "honest"):
        transport = MemoryTransport(bus, name)
        transport.start()
        out = Outbox(NodeIdentity.generate())
        if name == "honest":
            honest = (transport, out)
        else:
            attackers.append((transport, out))
    honest_key = honest[1].identity.peer_id()
    attacker_keys = {out.identity.peer_id() for _, out in attackers}
    index = 0
    used_rounds, young_slot_rounds = 0, 0
    for round_index in range(ROUNDS):
        for a, (transport, out) in enumerate(attackers):
            for j in range(6):
                index += 1
                right, _ = answer_and_wrong(node, index)
                bad = "~" if j % 2 else "55"  # outside the tiny vocabulary; two tokens where one is the cap
                out.publish(transport, SWARM, group_msg(node, index, [right, bad, bad, bad]))
        if round_index == 0:
            exchange.collect(-1)  # the attackers are seen first
        index += 1
        right, wrong = answer_and_wrong(node, index)
        honest[1].publish(honest[0], SWARM, group_msg(node, index, [right, wrong, wrong, right]))
        young = exchange.pool.admission.is_young(honest_key)
        exchange.collect(round_index)
        used = exchange.last_round["external_used_by_sender"]
        assert not set(used) & attacker_keys
        young_slot_rounds += young
        used_rounds += young and used.get(honest_key, 0) > 0
    print(f"honest newcomer used in {used_rounds} of {young_slot_rounds} rounds it was young")
    assert young_slot_rounds > 0 and used_rounds >= 0.5 * young_slot_rounds, (used_rounds, young_slot_rounds)
    record = exchange.pool.admission.keys[honest_key]
    assert record.credited >= 8 and not exchange.pool.admission.is_young(honest_key)  # credited: established
    assert all(exchange.pool.bench.benched(key, ROUNDS) for key in attacker_keys)
    assert all(exchange.pool.bench.strikes_of(key) >= 3 for key in attacker_keys)
    scores = {p.peer_id: p for p in exchange.status()["peers"]}
    assert not any(scores[key].banned for key in attacker_keys)  # unverifiable results never touch the ban score
    assert exchange.rejected["untokenizable"] + exchange.rejected["too_long"] >= 2


@pytest.mark.parametrize("reason_text", ["~"])
def test_a_candidate_that_fails_its_audit_leaves_the_pool_and_benches_its_key(tmp_path, reason_text):
    bus = MemoryBus()
    node = memory_bus_node(tiny_cfg(f"swarm.name={SWARM}", "swarm.external_per_round=0",
                                    "swarm.audit_per_round=1"), tmp_path, bus, "receiver")
    transport = MemoryTransport(bus, "sender")
    transport.start()
    out = Outbox(NodeIdentity.generate())
    right, _ = answer_and_wrong(node, 1)
    out.publish(transport, SWARM, group_msg(node, 1, [right, reason_text, reason_text, reason_text]))
    node.exchange.collect(0)
    key = out.identity.peer_id()
    assert node.exchange.last_round["groups_audited"] == 1 and node.exchange.rejected["untokenizable"] == 1
    assert node.exchange.pool.held_by(key) == 0 and node.exchange.pool.bench.benched(key, 1)


def test_the_bench_survives_a_restart_and_a_bad_state_is_refused():
    now = [1000.0]
    bench = Bench(rounds=4, seconds=30.0, strikes=3, clock=lambda: now[0])
    for round_index in range(5):
        bench.fail("repeat", UNTOKENIZABLE, round_index)
    bench.fail("once", MISMATCH, 4)
    now[0] += 60  # the restart took a minute: "once" sat out its 30 s, "repeat" (4 x 30 s) did not
    again = Bench(rounds=4, seconds=30.0, strikes=3, clock=lambda: now[0])
    again.load_state_dict(json.loads(json.dumps(bench.state_dict())))  # as a checkpoint writes it
    assert again.strikes_of("repeat") == 5 and again.benched("repeat", 12) and not again.benched("once", 12)
    assert again.order("repeat") < again.order("once")
    again.fail("new", TOO_LONG, 0)
    assert again.order("new") > again.order("once")  # the failure order carries on after a restart
    with pytest.raises(ValueError):
        again.load_state_dict([["key", "not a round", 0.0, 0, 0]])
    assert again.strikes_of("repeat") == 5  # unchanged
