"""Admission's windows in time (node/peers/admission.py, issue 31), with a fake clock: a node running 50
rounds/s or 1 round/s, fresh keys that earn their credits at once, and the bootstrap window."""
from __future__ import annotations

import random
from collections import Counter

from node.peers.admission import Admission
from node.config.schema import load_config
from node.peers.pool import GroupPool, PoolEntry
from tests.unit.peers.test_admission import distinct, group

ROUNDS_PER_S = 50


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def timed_admission(clock: Clock, trusted=frozenset({"honest"}), **windows) -> Admission:
    """The README defaults (young_groups 8, young_rounds 20, ...); "honest" is the operator's --peers key."""
    cfg = load_config("tiny").swarm.admission
    admission = Admission.from_config(cfg, clock, trusted)
    for name, value in windows.items():
        setattr(admission, name, value)
    return admission


def earn(admission: Admission, key: str, round_index: int, credits: int = 8) -> None:
    for i in range(credits):
        digest = f"{key}/{round_index}/{i}"
        admission.admit(key, digest, round_index)
        admission.credit(key, digest)


def test_the_first_key_in_a_new_swarm_is_established_in_rounds_and_the_next_only_after_young_seconds():
    clock = Clock()
    admission = timed_admission(clock)
    admission.start_round(0)
    earn(admission, "honest", 0)
    earn(admission, "second", 0)
    for round_index in range(1, 21):  # a paced node: one round a second
        clock.now += 1.0
        admission.start_round(round_index)
    assert not admission.is_young("honest")  # bootstrap: its rounds and credits suffice (20 s)
    assert admission.is_young("second")  # the window closed with the first promotion
    clock.now += admission.young_seconds  # first seen young_seconds ago now
    admission.start_round(21 + admission.young_seconds)
    assert not admission.is_young("second")
    assert [key for key, _ in admission.established()] == ["honest", "second"]


def test_a_spread_flood_of_fresh_keys_is_established_at_most_one_per_interval_at_50_rounds_a_second():
    """32 keys arrive once an honest peer is established, each earning its credits at once (every
    young slot of a node at 50 rounds/s). Before: all 32 established after 20 rounds (0.4 s). Now:
    none before young_seconds, then one per establish_interval_s, the earliest first."""
    clock = Clock()
    admission = timed_admission(clock)
    admission.start_round(0)
    earn(admission, "honest", 0)
    admission.start_round(20)
    assert not admission.is_young("honest")
    attackers = [f"sybil{i}" for i in range(32)]
    for key in attackers:
        earn(admission, key, 20)
    promoted_at: dict[str, float] = {}
    start = clock.now
    round_index = 20
    while clock.now - start < 600.0:  # ten minutes of flood
        round_index += 1
        clock.now += 1.0 / ROUNDS_PER_S
        admission.start_round(round_index)
        for key in attackers:
            if key not in promoted_at and not admission.is_young(key):
                promoted_at[key] = clock.now - start
    times = sorted(promoted_at.values())
    assert times[0] >= admission.young_seconds - 0.05
    assert all(b - a >= admission.establish_interval_s - 1e-6 for a, b in zip(times, times[1:]))
    assert len(times) <= 1 + (600.0 - admission.young_seconds) // admission.establish_interval_s
    assert len(times) <= admission.max_established_per_group  # one network group ("" here): its cap


def test_a_group_re_signed_by_100_keys_is_trained_at_most_once_at_50_rounds_a_second():
    """The credited content is remembered dedup_seconds as well as dedup_rounds (1000 rounds are
    20 s at 50 rounds/s: the re-signed copies that came 20 s later were trained again)."""
    clock = Clock()
    cfg = load_config("tiny").swarm
    pool = GroupPool.from_config(cfg.pool, cfg.admission, Counter(), clock)
    pool.admission.young_share_max = 1.0  # every re-signer may fill the mix: only dedup stands in the way
    trained = 0
    for i in range(100):  # one re-signed copy every 100 rounds (2 s), 200 s in all
        for _ in range(100):
            clock.now += 1.0 / ROUNDS_PER_S
        round_index = 100 * (i + 1)
        pool.evict(round_index)
        pool.add(PoolEntry(group(0, f"resigner{i}"), round_index, pool.now()))
        trained += len(pool.sample(4, "uniform", random.Random(i)))
    assert (trained, pool.rejected["duplicate_content"]) == (1, 99)


def test_pooled_groups_age_from_their_verification_in_rounds_and_in_seconds():
    clock = Clock()
    pool = GroupPool(100, 5, 32, None, Counter(), max_age_s=60.0, clock=clock)
    pool.add(PoolEntry(distinct(1, "a"), verified_round=10, verified_at=pool.now()))
    pool.evict(15)
    assert len(pool) == 1  # five rounds after verification: still there
    pool.evict(16)
    assert len(pool) == 0
    pool.add(PoolEntry(distinct(2, "a"), verified_round=16, verified_at=pool.now()))
    clock.now += 60.5  # a slow node: a minute passed within one round
    pool.evict(17)
    assert len(pool) == 0


def test_without_a_clock_every_window_stays_in_rounds():
    """The in-process testnet (inline ingest) runs in virtual time: unchanged by the time windows."""
    admission = Admission.from_config(load_config("tiny").swarm.admission)
    admission.start_round(0)
    earn(admission, "a", 0)
    earn(admission, "b", 0)
    admission.start_round(20)
    assert not admission.is_young("a") and not admission.is_young("b")


def test_the_state_keeps_promotions_and_reads_a_version_1_state():
    clock = Clock()
    admission = timed_admission(clock)
    admission.start_round(0)
    earn(admission, "honest", 0)
    admission.start_round(20)
    restored = timed_admission(clock)
    restored.load_state_dict(admission.state_dict())
    assert not restored.is_young("honest") and restored.established() == admission.established()
    v1 = admission.state_dict()
    v1["version"] = 1
    v1["keys"] = [row[:5] for row in v1["keys"]]
    v1["credited"] = [row[:2] for row in v1["credited"]]
    old = timed_admission(clock)
    old.load_state_dict(v1)
    assert not old.is_young("honest")  # it had earned its credits and rounds: established


def test_at_a_fast_node_flooding_young_keys_hold_at_most_the_young_share_beside_a_slower_established_peer():
    """A node at 50 rounds/s whose established peer offers a group every 10 rounds (5/s), while 32
    young keys offer a group each every round. The young slots of rounds without an established
    group used to be free (share * J each): the young keys held about 0.9 of the mix. Now they are
    free only while no established key was heard from lately."""
    clock = Clock()
    swarm = load_config("tiny").swarm
    pool = GroupPool.from_config(swarm.pool, swarm.admission, Counter(), clock, trusted=frozenset({"honest"}))
    admission = pool.admission
    pool.evict(0)
    earn(admission, "honest", 0)
    used, index = Counter(), 0
    for round_index in range(20, 2020):
        clock.now += 1.0 / ROUNDS_PER_S
        pool.evict(round_index)
        arrivals = [f"sybil{i}" for i in range(32)] + (["honest"] if round_index % 10 == 0 else [])
        for origin in arrivals:
            index += 1
            admission.heard(origin)
            pool.add(PoolEntry(distinct(index, origin), round_index, pool.now()))
        for chosen in pool.sample(4, "per_sender", random.Random(round_index)):
            used["honest" if chosen.origin == "honest" else "young"] += 1
    assert not admission.is_young("honest") and used["honest"] == 200  # every group of the established peer
    assert used["young"] <= admission.young_share_max / (1 - admission.young_share_max) * used["honest"] + 1
