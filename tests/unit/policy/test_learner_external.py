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


# the claims machinery under test: peers' log-probs used, their failures trained (the defaults ignore
# claims and drop failures)
CLAIMS = {"sender_logprobs": True, "peer_failures": "train"}


def make_learner(local="grpo", external="minpro", **off_policy):
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return Learner(policy.model, make_objective(local), OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                   external_objective=make_objective(external), off_policy=OffPolicyConfig(**{**CLAIMS, **off_policy}),
                   completion_budget=3)


def external_group(tier, logprobs=None, alignment=None, rewards=REWARDS):
    """A peer's group; our verifier found the samples of reward 1 correct."""
    samples = [TrainSample(PROMPT, [3 + i, 4 + i, 5 + i], logprobs, r, tier=tier, alignment=alignment,
                           correct=r == 1.0) for i, r in enumerate(rewards)]
    return TrainGroup(samples)


def identity_plan(logprobs):
    """Each receiver token its own segment: tier 1 that must reproduce tier 0 exactly."""
    return SegmentPlan(token_segment=(0, 1, 2), sender_sums=tuple(logprobs))


def test_tier1_alignment_reproduces_tier0_when_segments_are_single_tokens():
    lps = [-0.5, -1.5, -2.5]
    same = {"neg_damping": 1.0}  # peers' failures are damped by default
    tier0 = make_learner(**same).update([external_group(0, logprobs=lps)])
    tier1 = make_learner(**same).update([external_group(1, alignment=identity_plan(lps))])
    assert tier0["ext_t0_samples"] == tier1["ext_t1_samples"] == 4
    assert tier1["ext_t1_ratio_mean"] == pytest.approx(tier0["ext_t0_ratio_mean"], rel=1e-5)
    assert tier1["ext_t1_ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # a real behavior ratio
    assert tier1["loss"] == pytest.approx(tier0["loss"], rel=1e-5)


@pytest.mark.parametrize("tier", [0, 1])
def test_a_claim_of_near_certainty_keeps_its_small_weight_and_is_never_promoted(tier):
    """The old trust gate demoted a sender claiming far more likelihood than we find to tier 2,
    i.e. ratio 1 and full weight (mean minpro weight 0.216 at a gap of -0.99 nat/byte, 1.000 at
    -1.01). A claim is now kept in its tier, where its weight stays small."""
    claim = [-0.001] * 3  # the receiver (tiny, untrained) finds each token ~e^-2.6
    group = external_group(tier, logprobs=claim if tier == 0 else None,
                           alignment=identity_plan(claim) if tier == 1 else None)
    stats = make_learner().update([group])
    assert stats[f"ext_t{tier}_samples"] == 4 and "ext_t2_samples" not in stats
    assert stats[f"ext_t{tier}_weight_mean"] < 0.2


@pytest.mark.parametrize("tier", [0, 1])
@pytest.mark.parametrize("external", ["minpro", "cispo", "prefix", "ftis"])
def test_a_claim_of_improbability_buys_no_more_than_tier_2(tier, external):
    """Claiming b = -20 (the text was very unlikely for the sender) made rho huge: minpro's rows hit
    its cap 1.28, prefix and ftis 2.0. Claims are bounded by our own l^old, so the row gets what
    the ratio-1 treatment of the same text gets (weight 1 at the first step), never more."""
    claim = [-20.0] * 3
    group = external_group(tier, logprobs=claim if tier == 0 else None,
                           alignment=identity_plan(claim) if tier == 1 else None)
    undamped = {"neg_damping": 1.0}  # compare the weights alone
    liar = make_learner(external=external, **undamped).update([group])
    tier2 = make_learner(external=external, **undamped).update([external_group(2)])
    assert liar[f"ext_t{tier}_weight_mean"] <= tier2["ext_t2_weight_mean"] + 1e-6
    assert liar[f"ext_t{tier}_weight_mean"] == pytest.approx(1.0, abs=1e-6)
    assert liar["ext_claims_bounded_frac"] == pytest.approx(1.0)
    assert liar["grad_norm"] <= tier2["grad_norm"] * (1 + 1e-4)


def test_damped_failures_of_a_peer_group_leave_no_net_push():
    """kappa 0.5 on a tier-2 group [1, 0, 0, 1]: the damped rows count half in the baseline too, so
    the advantages still sum to 0 (damping after normalising left a net +A: a 1-of-8 peer group
    kept +1.24). At ratio 1 the loss value is -TM[A] = 0."""
    stats = make_learner(external="cispo").update([external_group(2)])
    assert stats["loss"] == pytest.approx(0.0, abs=1e-6)
    damped = make_learner(external="cispo").update([external_group(2, rewards=[1.0] + [0.0] * 7)])
    assert damped["loss"] == pytest.approx(0.0, abs=1e-6)


def test_external_objective_applies_to_peer_rows_only():
    """ftis on peers' rows drops far off-policy negative samples; our own rows are untouched."""
    far = [-0.01, -0.01, -0.01]  # the sampler was far surer than the receiver is: k3 is large
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


# --- loss.off_policy.peer_failures = "drop": a peer's failures are not trained on ---------------

from policy.logprobs import completion_logprobs, pad_batch  # noqa: E402
from policy.types import TIERS  # noqa: E402


class RecordingLearner(Learner):
    """A real Learner that keeps, per minibatch, dL/dlogp of every row with its advantage and tier."""

    def _loss(self, x, tier, present=None):
        x.logp.retain_grad()
        self.seen = getattr(self, "seen", []) + [(x, tier)]
        return super()._loss(x, tier, present)

    def pushes(self, tiers) -> list[tuple[float, torch.Tensor]]:
        """(advantage, per-token push -dL/dlogp on trainable tokens) of each row of the given tiers."""
        out = []
        for x, tier in self.seen:
            for row in range(len(tier)):
                if int(tier[row]) in tiers:
                    m = x.mask[row] > 0
                    out.append((float(x.advantages[row]), -x.logp.grad[row][m]))
        return out


def recording_learner(local="grpo", **off_policy) -> RecordingLearner:
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return RecordingLearner(policy.model, make_objective(local), OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                            external_objective=make_objective("minpro"), off_policy=OffPolicyConfig(**{**CLAIMS, **off_policy}),
                            completion_budget=3)


def local_group(rewards=(1.0, 0.0, 1.0, 0.0)):
    return TrainGroup([TrainSample([1, 6, 13], [4 + i, 5, 6], None, r) for i, r in enumerate(rewards)])


def success_logprob(learner: Learner, sample: TrainSample) -> float:
    ids, am, cm = pad_batch([sample.prompt_ids], [sample.completion_ids], 0)
    with torch.no_grad():
        return float((completion_logprobs(learner.model, ids, am, cm.shape[1], 1.0) * cm).sum())


@pytest.mark.parametrize("tier", [0, 2])
def test_drop_trains_a_peer_groups_successes_only_and_leaves_local_samples_alone(tier):
    peer = external_group(tier, logprobs=[-1.0] * 3 if tier == 0 else None)  # rewards [1, 0, 0, 1]
    drop = make_learner(peer_failures="drop").update([local_group(), peer])
    train = make_learner(peer_failures="train").update([local_group(), peer])
    assert train["samples_trained"] == 8
    assert drop["samples_trained"] == 4 + 2  # all local samples (their failures too) + the peer's 2 successes
    assert drop[f"ext_t{tier}_samples"] == 2 and train[f"ext_t{tier}_samples"] == 4
    # a local-only batch is the same under both settings
    assert make_learner(peer_failures="drop").update([local_group()]) == \
        make_learner(peer_failures="train").update([local_group()])


def test_drop_moves_the_peers_success_up():
    peer = external_group(2)
    learner = make_learner(peer_failures="drop")
    success = peer.samples[0]
    before = success_logprob(learner, success)
    learner.update([peer])
    assert success_logprob(learner, success) > before + 1e-3


@pytest.mark.parametrize("local", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("rewards", [[1.0, 0.0, 0.0, 1.0], [1.0] + [0.0] * 7])
def test_drop_never_pushes_a_peer_token_harder_than_the_ratio_one_treatment(local, rewards):
    """Dropping a peer's failures must not raise the weight of what remains: with the failures
    gone from the aggregation's denominator, a 1-of-8 peer success was pushed 8x as hard as at
    ratio 1 with the whole group trained (and every local token harder too)."""
    groups = [local_group(), external_group(2, rewards=rewards)]
    drop, train = recording_learner(local, peer_failures="drop"), recording_learner(local, peer_failures="train")
    drop.update(groups)
    train.update(groups)
    peer_drop = [p for a, p in drop.pushes(TIERS) if a > 0]
    peer_train = [p for a, p in train.pushes(TIERS) if a > 0]
    assert len(peer_drop) == len(peer_train) == (2 if rewards[3] else 1)
    assert all(p.min() > 0 for p in peer_drop)  # the success is pushed up ...
    assert max(float(p.max()) for p in peer_drop) <= max(float(p.max()) for p in peer_train) * (1 + 1e-5)  # ... no harder
    assert all(float((p < 0).sum()) == 0 for a, p in drop.pushes(TIERS))  # nothing of the peer's is pushed down
    local_drop = sorted(float(p.abs().sum()) for _, p in drop.pushes([-1]))
    local_train = sorted(float(p.abs().sum()) for _, p in train.pushes([-1]))
    assert local_drop == pytest.approx(local_train, rel=1e-5)  # our own samples are unaffected
