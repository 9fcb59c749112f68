"""Admission to the external mix (node/peers/admission.py, node/peers/pool.py): content dedup across signers and
the capped share of young keys; then issue 9's acceptance tests (c) and (d) on real tiny nodes with
real signed envelopes through the real Ingress (scripts/experiments/admission.py runs the same scenarios)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from node.peers.admission import DUPLICATE, Admission
from node.config.schema import load_config
from node.train.groups import ScoredGroup
from node.peers.pool import GroupPool, PoolEntry
from node.tasks.synthetic import SyntheticSource
from policy.types import Rollout

from scripts.experiments import admission as exp_admission

SOURCE = SyntheticSource({"copy": 1.0, "succ": 1.0, "max": 1.0}, seed=0)


def group(index: int, origin: str, texts=("1", "0", "1", "0")) -> ScoredGroup:
    task = SOURCE.batch(index, 1)[0]
    rollouts = [Rollout(prompt_ids=[1], completion_ids=[3], logprobs=None, text=t, offsets=[], truncated=False)
                for t in texts]
    rewards = [float(i % 2 == 0) for i in range(len(texts))]  # variance: sampleable
    return ScoredGroup(task=task, rollouts=rollouts, rewards=rewards, correct=[r == 1.0 for r in rewards],
                       origin=origin)


def distinct(index: int, origin: str) -> ScoredGroup:
    """A group no other index shares content with (the tiny families repeat their prompts)."""
    return group(index, origin, texts=(str(index), "x", str(index), "x"))


def pool(share=0.25, young_groups=2, young_rounds=3, remember=10, max_keys=4096) -> GroupPool:
    return GroupPool(100, 50, 32, Admission(share, young_groups, young_rounds, remember, max_keys), Counter())


def test_same_content_under_another_key_or_order_is_refused_and_counted_without_blame():
    p = pool()
    assert p.add(PoolEntry(group(0, "honest"), 0)) is False and len(p) == 1
    shuffled = group(0, "sybil", texts=("0", " 1", "0", "1 "))  # reordered, whitespace changed
    p.add(PoolEntry(shuffled, 0))
    assert len(p) == 1 and p.rejected == {DUPLICATE: 1}
    p.add(PoolEntry(group(0, "other", texts=("1", "0", "0", "0")), 0))  # other completions: new content
    assert len(p) == 2


def test_used_content_is_remembered_for_dedup_rounds_only():
    p = pool(share=1.0, remember=10)
    p.add(PoolEntry(group(0, "honest"), 0))
    p.evict(0)
    assert [g.origin for g in p.sample(1, "per_sender", random.Random(0))] == ["honest"]
    for round_index in (1, 10):
        p.evict(round_index)
        p.add(PoolEntry(group(0, f"resigner{round_index}"), round_index))
        assert len(p) == 0  # trained once: refused whoever signs it again
    p.evict(11)  # more than dedup_rounds later the memory is gone (it is bounded by rounds)
    p.add(PoolEntry(group(0, "later"), 11))
    assert len(p) == 1 and p.rejected[DUPLICATE] == 2


def test_young_slots_go_round_robin_across_network_groups_whoever_came_first():
    """20 fresh keys a round from one network group, the first of them seen before an honest newcomer
    from another group: the young slot (one of four) alternates between the two groups, so the
    newcomer is used every other round and earns its weight. With seniority (first come, first served)
    it was used 0 times."""
    p = pool(share=0.25, young_groups=3, young_rounds=0)
    used = Counter()
    for round_index in range(8):
        p.evict(round_index)
        for i in range(20):
            key = f"sybil{round_index}-{i}"
            p.add(PoolEntry(distinct(1000 * round_index + i, key), round_index))
            p.admission.place(key, "203.0")
        p.add(PoolEntry(distinct(100_000 + round_index, "newcomer"), round_index))
        p.admission.place("newcomer", "198.51")
        chosen = p.sample(4, "per_sender", random.Random(round_index))
        used.update("newcomer" if g.origin == "newcomer" else "sybil" for g in chosen)
        if p.admission.is_young("newcomer"):
            assert len(chosen) == 1  # young only: one slot of four
    assert not p.admission.is_young("newcomer")  # 3 groups used: established, sampled as such since
    assert used["newcomer"] >= 4 and used["sybil"] >= 2, used


def test_keys_of_one_network_group_take_turns_in_the_young_slots():
    """Within a group the turn rotates over its keys (never strictly the first seen), each holding it
    until it has its credits: 4 keys, 2 credits each, 8 rounds, every key served twice."""
    p = pool(share=0.25, young_groups=2, young_rounds=100)  # young throughout: every pick is a young slot's
    served = Counter()
    for round_index in range(8):
        p.evict(round_index)
        for key in ("a", "b", "c", "d"):
            p.add(PoolEntry(distinct(100 * round_index + ord(key), key), round_index))
            p.admission.place(key, "10.0")
        served.update(g.origin for g in p.sample(4, "per_sender", random.Random(round_index)))
    assert served == {"a": 2, "b": 2, "c": 2, "d": 2}


@pytest.mark.parametrize("honest_per_round, young_expected", [(1, 4), (3, 12)])
def test_young_keys_hold_at_most_their_share_of_the_mix_when_established_keys_offer_little(
        honest_per_round, young_expected):
    p = pool(share=0.25, young_groups=1, young_rounds=0)
    p.evict(0)
    p.add(PoolEntry(group(0, "honest"), 0))
    assert [g.origin for g in p.sample(4, "per_sender", random.Random(0))] == ["honest"]  # young, cold start
    used = Counter()
    for round_index in range(1, 13):
        p.evict(round_index)
        for i in range(honest_per_round):
            p.add(PoolEntry(distinct(100 * round_index + i, "honest"), round_index))
        for i in range(10):  # ten fresh keys a round, more than the mix could ever take
            p.add(PoolEntry(distinct(10_000 * round_index + i, f"sybil{round_index}-{i}"), round_index))
        chosen = Counter(g.origin == "honest" for g in p.sample(4, "per_sender", random.Random(round_index)))
        assert chosen[True] == honest_per_round  # every established group, every round
        used.update(chosen)
    assert used[False] == young_expected and used[False] <= 0.25 * (used[True] + used[False])


def test_a_full_pool_drops_young_keys_groups_before_established_ones():
    p = GroupPool(8, 50, 32, Admission(0.25, 1, 0, 10), Counter())
    p.evict(0)
    p.add(PoolEntry(distinct(0, "honest"), 0))
    p.sample(4, "per_sender", random.Random(0))  # used once: established
    p.evict(1)
    for i in range(3):
        p.add(PoolEntry(distinct(10 + i, "honest"), 1))
    for i in range(20):  # 20 fresh keys after it
        p.add(PoolEntry(distinct(100 + i, f"sybil{i}"), 2))
    p.evict(2)
    origins = Counter(e.group.origin for e in p.entries)
    assert len(p) == 8 and origins["honest"] == 3  # the newest young groups stay in what is left
    assert {e.group.origin for e in p.entries} - {"honest"} == {f"sybil{i}" for i in range(15, 20)}


def test_a_full_pool_drops_the_heaviest_established_senders_oldest_not_a_quiet_ones():
    """Over the size bound, the rule of every per-sender buffer (protocol/inbox.py): a busy established
    sender loses its own oldest groups; a quiet one that arrived first keeps its group."""
    p = GroupPool(6, 50, 32, Admission(0.25, 1, 0, 10), Counter())
    for round_index, origin in enumerate(("quiet", "busy")):  # each used once, alone: established
        p.evict(round_index)
        p.add(PoolEntry(distinct(round_index, origin), round_index))
        p.sample(4, "per_sender", random.Random(round_index))
    assert not p.admission.is_young("quiet") and not p.admission.is_young("busy")
    p.evict(2)
    quiet = distinct(2, "quiet")
    busy = [distinct(10 + i, "busy") for i in range(8)]
    for g in [quiet, *busy]:
        p.add(PoolEntry(g, 2))
    p.evict(2)
    assert [e.group for e in p.entries] == [quiet, *busy[3:]]  # oldest-first would have dropped `quiet`


def test_a_fraction_of_a_slot_carries_over_but_is_never_banked():
    p = pool(share=0.25, young_groups=100)
    used = 0
    for round_index in range(8):
        p.evict(round_index)
        for i in range(3):
            p.add(PoolEntry(group(100 * round_index + i, f"k{round_index}-{i}"), round_index))
        used += len(p.sample(2, "uniform", random.Random(round_index)))
    assert used == 4  # 0.25 of J = 2: one slot every other round
    admission = Admission(0.25, 8, 0, 10)
    for _ in range(10):  # quiet rounds bank at most one slot
        admission.split(4, young=0, established=0)
    assert admission.split(4, young=10, established=0) == (1, 0)


def test_young_keys_wait_for_time_as_well_as_contributions():
    admission = Admission(0.25, young_groups=1, young_rounds=5, dedup_rounds=10)
    admission.start_round(0)
    assert admission.admit("k", "d1", 0)
    admission.credit("k", "d1")
    admission.start_round(4)
    assert admission.is_young("k") and not admission.any_established  # ingest: young share uncapped
    admission.start_round(5)
    assert not admission.is_young("k") and admission.any_established  # from now on young keys are capped


def test_key_table_is_bounded_and_forgets_fresh_keys_before_earlier_ones():
    p = pool(share=1.0, young_groups=2, young_rounds=0, max_keys=8)
    p.evict(0)
    p.add(PoolEntry(group(0, "early"), 0))
    p.add(PoolEntry(group(1, "early"), 0))
    p.sample(2, "uniform", random.Random(0))  # early is established now
    for i in range(50):  # fresh keys, one group each, trained on: still young, nothing pooled
        p.add(PoolEntry(group(2 + i, f"fresh{i}", texts=(str(i), "0", "1", "0")), 0))
        assert len(p.sample(1, "uniform", random.Random(i))) == 1
    assert len(p.admission.keys) <= 8 and "early" in p.admission.keys and not p.admission.is_young("early")


def test_a_credited_newcomer_is_not_forgotten_by_a_flood_of_fresh_keys():
    """Issue 16: the old table forgot the newest young key with nothing pooled, i.e. a newcomer
    whose group had just been trained, and with it the credit it had earned (first_seen reset)."""
    p = pool(share=0.25, young_groups=4, young_rounds=0, max_keys=16)
    p.evict(0)
    p.add(PoolEntry(group(0, "newcomer"), 0))
    assert [g.origin for g in p.sample(4, "per_sender", random.Random(0))] == ["newcomer"]  # credited, unpooled
    for i in range(100):  # fresh keys, one pooled group each, over five rounds
        p.evict(1 + i // 20)
        p.add(PoolEntry(group(1 + i, f"fresh{i}"), 1 + i // 20))
    record = p.admission.keys.get("newcomer")
    assert record is not None and (record.credited, record.first_seen) == (1, 0)
    assert len(p.admission.keys) == 16


def test_node_config_turns_admission_on_and_bare_pools_stay_plain(tiny_config):
    cfg = tiny_config("swarm.admission.young_share_max=0.1", "swarm.admission.young_groups=3",
                      "swarm.admission.young_rounds=7", threads=None)
    p = GroupPool.from_config(cfg.swarm.pool, cfg.swarm.admission)
    assert (p.admission.young_share_max, p.admission.young_groups, p.admission.young_rounds) == (0.1, 3, 7)
    plain = GroupPool(10, 5, 5)
    plain.add(PoolEntry(group(0, "a"), 0))
    plain.add(PoolEntry(group(0, "b"), 0))
    assert len(plain) == 2 and plain.admission is None


@pytest.mark.slow
def test_c_fresh_keys_get_at_most_the_young_share_while_honest_peers_keep_flowing(tmp_path):
    """Issue 9 (c): 100 fresh keys, each under its own transport origin, send one valid, honestly
    scored group of new content every round for 10 rounds; two honest tiny peers that have been
    sharing since round 0 keep sharing. The receiver runs the default config (young share 0.25)."""
    # warm-up: 20 rounds (swarm.admission.young_rounds) and 8 used groups each make the honest peers established;
    # 4 completions per prompt instead of 8 halve every node's round
    result = exp_admission.sybil_share(tmp_path, keys=100, warmup=24, rounds=10, extra=["sampling.group_size=4"])
    share = load_config("tiny").swarm.admission.young_share_max
    assert "rate_limited" not in result["rejected"] and "banned" not in result["rejected"]  # admission alone
    assert result["attacker_share"] <= share + 1e-9, result
    assert min(result["honest_used_per_round"]) >= 1, result  # every round, honest groups were trained on
    assert result["honest_used"] >= 2 * result["attacker_used"], result


def test_d_one_group_re_signed_under_100_keys_is_trained_at_most_once(tmp_path):
    """Issue 9 (d): the same valid group under 100 fresh keys (10 new keys a round for 10 rounds, each
    its own transport origin): trained once, the 99 others refused as duplicate_content."""
    result = exp_admission.resign_count(tmp_path, keys=100, rounds=10)
    assert result["times_trained"] <= 1, result
    assert result["rejected"].get(DUPLICATE, 0) >= 99 - result["times_trained"], result
