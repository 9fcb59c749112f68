"""The learner on peers' samples (real tiny model): tiers, the trust gate, damping, the external
objective, SAPO's ratio-1 switch and the behavior-proximal option."""
from __future__ import annotations

import pytest
import torch

from policy.behavior import SegmentPlan
from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.losses import make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TrainGroup, TrainSample

PROMPT = [1, 5, 13]  # bos '2' '='
REWARDS = [1.0, 0.0, 0.0, 1.0]


def make_learner(local="grpo", external="minpro", **off_policy):
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return Learner(policy.model, make_objective(local), OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                   external_objective=make_objective(external), off_policy=OffPolicyConfig(**off_policy),
                   completion_budget=3)


def external_group(tier, logprobs=None, alignment=None, rewards=REWARDS):
    samples = [TrainSample(PROMPT, [3 + i, 4 + i, 5 + i], logprobs, r, tier=tier, alignment=alignment)
               for i, r in enumerate(rewards)]
    return TrainGroup(samples)


def identity_plan(logprobs, n_bytes=3):
    """Each receiver token its own segment: tier 1 that must reproduce tier 0 exactly."""
    return SegmentPlan(token_segment=(0, 1, 2), sender_sums=tuple(logprobs), n_bytes=n_bytes)


def test_tier1_alignment_reproduces_tier0_when_segments_are_single_tokens():
    lps = [-0.5, -1.5, -2.5]
    same = {"trust_lambda_min": None, "neg_damping": (1.0, 1.0, 1.0)}  # tier 1 is damped by default
    tier0 = make_learner(**same).update([external_group(0, logprobs=lps)])
    tier1 = make_learner(**same).update([external_group(1, alignment=identity_plan(lps))])
    assert tier0["ext_t0_samples"] == tier1["ext_t1_samples"] == 4
    assert tier1["ext_t1_ratio_mean"] == pytest.approx(tier0["ext_t0_ratio_mean"], rel=1e-5)
    assert tier1["ext_t1_ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # a real behavior ratio
    assert tier1["loss"] == pytest.approx(tier0["loss"], rel=1e-5)


def test_trust_gate_demotes_a_sender_claiming_far_more_likelihood():
    # the sender claims ~certainty (-0.001 per token) for 3 bytes the receiver finds unlikely
    lrn = make_learner()
    stats = lrn.update([external_group(1, alignment=identity_plan([-0.001] * 3))])
    assert stats["ext_trust_demoted"] == 4 and stats["ext_t2_samples"] == 4 and "ext_t1_samples" not in stats
    assert stats["ext_t2_ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # tier 2: b = l^prox
    open_gate = make_learner(trust_lambda_min=None).update([external_group(1, alignment=identity_plan([-0.001] * 3))])
    assert open_gate["ext_t1_samples"] == 4 and "ext_trust_demoted" not in open_gate


def test_negative_advantages_of_peers_are_damped_per_tier():
    # tier 2, one step: every ratio is 1, so the loss value is -TM[A] with damped negatives
    stats = make_learner(external="cispo").update([external_group(2)])
    a = 0.8660254 / (1 + 1e-4 / 0.5773503)  # (1 - 0.5) / (std + 1e-4), std = sqrt(1/3)
    assert stats["loss"] == pytest.approx(-(2 * a - 2 * 0.5 * a) / 4, rel=1e-4)
    undamped = make_learner(external="cispo", neg_damping=(1.0, 1.0, 1.0)).update([external_group(2)])
    assert undamped["loss"] == pytest.approx(0.0, abs=1e-6)


def test_external_objective_applies_to_peer_rows_only():
    """ftis on peers' rows drops far off-policy negative samples; our own rows are untouched."""
    far = [-9.0, -9.0, -9.0]  # the receiver is far more likely than this sampler: k3 is large
    local = TrainGroup([TrainSample(PROMPT, [3 + i, 4, 5], None, r) for i, r in enumerate(REWARDS)])
    stats = make_learner(external="ftis").update([local, external_group(0, logprobs=far)])
    assert stats["ext_t0_filtered_frac"] == pytest.approx(0.5)  # the two negative peer samples
    assert "filtered_frac" not in stats and stats["clip_frac"] == 0.0  # local grpo at ratio 1


def test_sender_logprobs_off_is_sapo_ratio_one_and_proximal_behavior_clips_to_the_sampler():
    lps = [-0.2, -0.2, -0.2]
    sapo = make_learner(external="grpo", sender_logprobs=False).update([external_group(0, logprobs=lps)])
    assert sapo["ext_t2_samples"] == 4 and sapo["ext_t2_ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    ppo = make_learner(external="grpo", proximal="behavior").update([external_group(0, logprobs=lps)])
    assert ppo["ext_t0_ratio_mean"] < 0.5 and ppo["ext_t0_clip_frac"] > 0  # r = exp(l - b), far below 1 - eps
    default = make_learner(external="grpo").update([external_group(0, logprobs=lps)])
    assert default["ext_t0_ratio_mean"] == pytest.approx(1.0, abs=1e-6)  # r against our own l^old


def test_policy_version_counts_optimizer_steps():
    lrn = make_learner()
    lrn.update([external_group(0, logprobs=[-1.0] * 3)])
    assert lrn.policy_version == 1
    lrn.cfg = lrn.cfg.model_copy(update={"epochs": 2, "minibatches": 2})
    lrn.update([external_group(2)])
    assert lrn.policy_version == 5
