"""Group composition (SAPO groups vs cross-actor merge) and the pool's samplers, on hand-built groups."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from node.train.groups import HintUse, ScoredGroup, compose
from node.peers.pool import GroupPool, PoolEntry
from node.tasks.synthetic import SyntheticSource
from policy.advantages import group_advantages
from policy.types import Rollout

SOURCE = SyntheticSource({"copy": 1.0, "succ": 1.0}, seed=0)


def group(task, rewards, origin="local", tier=None):
    rollouts = [Rollout(prompt_ids=[1], completion_ids=[3], logprobs=[-1.0], text="0", offsets=[(0, 1)],
                        truncated=True, tier=tier) for _ in rewards]
    return ScoredGroup(task=task, rollouts=rollouts, rewards=list(rewards), correct=[r == 1.0 for r in rewards],
                       origin=origin)


def test_cross_actor_merges_same_prompt_with_one_baseline_over_the_union():
    task, other = SOURCE.batch(0, 2)
    local = [group(task, [0, 0, 0, 0]), group(other, [1, 0, 0, 0])]
    peer_same = group(task, [1, 1, 0, 1], origin="peer", tier=0)  # same prompt as our all-wrong group
    peer_other = group(SOURCE.batch(5, 1)[0], [1, 0, 1, 0], origin="peer", tier=0)

    groups, merged = compose(local, [peer_same, peer_other], "cross_actor")
    assert merged == 1 and len(groups) == 3
    union = groups[0]
    assert [s.reward for s in union.samples] == [0, 0, 0, 0, 1, 1, 0, 1]
    assert [s.tier for s in union.samples] == [None] * 4 + [0] * 4 and union.meta["merged_from"] == ["peer"]
    adv, _ = group_advantages(torch.tensor([s.reward for s in union.samples]))
    # hand-computed: mean 3/8, sample std (ddof 1) = sqrt(15/56) = 0.517549
    assert adv[0].item() == pytest.approx(-0.375 / (0.5175492 + 1e-4), abs=1e-5)
    assert adv[4].item() == pytest.approx(0.625 / (0.5175492 + 1e-4), abs=1e-5)
    assert groups[2].samples[0].tier == 0 and groups[2].external  # no match: its own group

    sapo, merged = compose(local, [peer_same, peer_other], "sapo")
    assert merged == 0 and len(sapo) == 4
    alone, _ = group_advantages(torch.tensor([s.reward for s in sapo[0].samples]))
    assert bool((alone == 0).all())  # our all-wrong group alone has no signal; merged it has


def test_cross_actor_never_merges_a_peer_group_into_a_hinted_group():
    """A hinted group's completions were conditioned on a hint: the pool never takes peers' groups
    for its prompt, and a peer group sampled for that prompt anyway trains as its own group."""
    task = SOURCE.batch(0, 1)[0]
    hinted = group(task, [0, 0, 0, 1])
    hinted.hint = HintUse(level="l1", text="think about the last digit")
    peer = group(task, [1, 1, 0, 1], origin="peer", tier=0)
    groups, merged = compose([hinted], [peer], "cross_actor")
    assert merged == 0 and len(groups) == 2 and len(groups[0].samples) == 4 and groups[1].external


def test_pool_keeps_flat_groups_only_for_merging_and_samples_those_with_variance():
    task = SOURCE.batch(0, 1)[0]
    pool = GroupPool(max_groups=10, max_age_rounds=3, max_per_sender=5)
    pool.add(PoolEntry(group(task, [1, 1, 1, 1], origin="a"), verified_round=0))  # flat
    pool.add(PoolEntry(group(SOURCE.batch(1, 1)[0], [1, 0, 0, 0], origin="a"), verified_round=0))
    chosen = pool.sample(5, "uniform", random.Random(0))
    assert len(chosen) == 1 and not chosen[0].flat and len(pool) == 1  # the flat group stays pooled
    flat = pool.entries[0].group
    assert pool.take_matching({SOURCE.batch(9, 1)[0].prompt_key}) == [] and len(pool) == 1
    assert pool.take_matching({task.prompt_key}) == [flat] and len(pool) == 0
    pool.add(PoolEntry(group(task, [1, 0, 0, 0], origin="a"), verified_round=0))
    pool.evict(4)  # older than max_age_rounds
    assert len(pool) == 0


def test_weak_tasks_sampler_prefers_families_we_fail_and_stays_sender_fair():
    copy_task, succ_task = (SyntheticSource({name: 1.0}, seed=0).batch(0, 1)[0] for name in ("copy", "succ"))
    weakness = {"copy": 0.05, "succ": 0.95}  # we master copy and fail succ
    picks = Counter()
    for seed in range(200):
        pool = GroupPool(100, 10, 100)
        for i in range(4):
            pool.add(PoolEntry(group(copy_task, [1, 0, 1, 0], origin="a"), 0))
            pool.add(PoolEntry(group(succ_task, [1, 0, 1, 0], origin="a"), 0))
        chosen = pool.sample(2, "weak_tasks", random.Random(seed), lambda g: weakness[g.task.ref.dataset])
        picks.update(g.task.ref.dataset for g in chosen)
    assert picks["succ"] > 4 * picks["copy"]

    pool = GroupPool(100, 10, 100)
    for i in range(10):
        pool.add(PoolEntry(group(succ_task, [1, 0, 1, 0], origin="flooder"), 0))
    pool.add(PoolEntry(group(copy_task, [1, 0, 1, 0], origin="honest"), 0))
    chosen = pool.sample(2, "weak_tasks", random.Random(1), lambda g: weakness[g.task.ref.dataset])
    assert Counter(g.origin for g in chosen) == {"flooder": 1, "honest": 1}  # quota: ceil(2 / 2 senders)
