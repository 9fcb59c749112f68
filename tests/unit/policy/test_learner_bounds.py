"""The learner bounds its batch whatever peers send (real tiny model): long or out-of-vocabulary peer
samples are refused before padding, and a failure on peers' samples trains the round on our own."""
from __future__ import annotations

import torch

from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.losses import make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TrainGroup, TrainSample
from tests.unit.policy.test_learner_external import CLAIMS

PROMPT = [1, 5, 13]  # bos '2' '='
REWARDS = [1.0, 0.0, 0.0, 1.0]


def make_learner():
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return Learner(policy.model, make_objective("grpo"), OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                   external_objective=make_objective("minpro"), completion_budget=3,
                   off_policy=OffPolicyConfig(**CLAIMS))  # the claims under test


def group(tier, completion, logprobs=None):
    return TrainGroup([TrainSample(PROMPT, list(completion), logprobs, r, tier=tier) for r in REWARDS])


def test_oversized_and_out_of_vocabulary_peer_samples_are_refused_before_padding():
    learner = make_learner()
    own = group(None, [3, 4, 5])
    huge = group(2, [4] * 30_000)  # would pad the whole batch to 30,000 tokens
    alien = group(2, [3, 10_000, 5])  # no such token in our vocabulary
    stats = learner.update([own, huge, alien, group(2, [6, 7, 8])])
    assert stats["external_groups_refused"] == 2
    assert stats["samples_trained"] == 8 and stats["ext_t2_samples"] == 4  # ours and the fitting peer group
    assert stats["optimizer_steps"] == 1


def test_merged_group_keeps_our_samples_when_the_peer_part_is_refused():
    learner = make_learner()
    merged = TrainGroup(group(None, [3, 4, 5]).samples + group(2, [4] * 500).samples)
    kept, refused = learner.admit_external([merged])
    assert refused == 1 and [s.tier for s in kept[0].samples] == [None] * 4


def test_a_failure_on_peer_samples_trains_the_round_on_our_own():
    learner = make_learner()
    # tier-0 log-probs that do not match the completion's length: shapes disagree inside the update
    broken = group(0, [3, 4, 5], logprobs=[-0.5] * 7)
    stats = learner.update([group(None, [3, 4, 5]), broken])
    assert stats["external_update_failed"] == 1.0
    assert stats["samples_trained"] == 4 and "ext_t0_samples" not in stats
    assert learner.policy_version == 1  # the round still took its step
