"""What a peer's claims can buy (policy/ALGORITHMS.md, "What a peer's claims can buy").

Property tests over the loss menu: whatever behavior log-probs b a peer claims, its tokens get no
more gradient than the ratio-1 (tier 2) treatment of the same text, except the documented PPO
allowance; whatever group size it sends, its group brings no more advantage mass than a group of
ours. Then each defect of the review as a learner-level test on the real tiny model.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy.advantages import group_advantages, group_size_weight
from policy.learner import Learner, OffPolicyConfig, OptimConfig, resolve_claims
from policy.losses import LossInputs, make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TIER_EXACT, TIER_PROXY, TrainGroup, TrainSample
from tests.unit.policy.test_learner_external import CLAIMS

# Every objective a node may use for peers' rows (mc(...) is refused there by the config), with the
# per-token allowance U (in units of |A| / tokens) a claim may reach where the tier-2 row was clipped.
PPO_LIKE = {"grpo": 1.2, "dr_grpo": 1.2, "dapo": 1.28, "gspo": 1 + 4e-4,
            "tis(grpo)": 1.2, "tis(dapo)": 1.28, "tis(gspo)": 1 + 4e-4}
RATIO_FORM = ("minpro", "cispo", "prefix", "ftis")
EXTERNAL_MENU = (*RATIO_FORM, *PPO_LIKE)


def token_gradient(objective, l_old, l, behavior, tier, advantage, mask, proximal):
    """|dL/dl| per token [T] of one row through the learner's own claim handling."""
    logp = l.clone().requires_grad_()  # [1, T]
    beh, old, _ = resolve_claims(behavior, l_old, tier, mask, proximal)  # [1, T]
    x = LossInputs(logp=logp, old_logp=old, behavior_logp=beh, mask=mask, advantages=advantage,
                   completion_budget=float(mask.shape[1]))
    loss, _ = objective.loss(x)
    loss.backward()
    return logp.grad.abs()[0]  # [T]


@st.composite
def peer_rows(draw):
    n = draw(st.integers(1, 24))
    floats = lambda lo, hi: st.lists(st.floats(lo, hi, allow_nan=False, width=32), min_size=n, max_size=n)  # noqa: E731
    l_old = torch.tensor([draw(floats(-8.0, -0.125))])  # [1, T]
    drift = torch.tensor([draw(floats(-0.25, 0.25))])  # [1, T] l moves a little within one update
    honest = draw(st.booleans())  # a claim near our own numbers, or anything at all
    claim = l_old + torch.tensor([draw(floats(-0.5, 0.5))]) if honest else torch.tensor([draw(floats(-30.0, 0.0))])
    mask = torch.tensor([[1.0] * n])
    if n > 2:  # a hinted prefix: untrainable
        mask[0, : draw(st.integers(0, n - 1))] = 0.0
    a = draw(st.sampled_from([-2.5, -0.4, 0.3, 2.5]))
    return l_old, (l_old + drift).clamp(max=0.0), claim.clamp(max=0.0), mask, torch.tensor([a])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=peer_rows(), spec=st.sampled_from(EXTERNAL_MENU), proximal=st.sampled_from(["receiver", "behavior"]))
def test_a_claim_never_buys_more_gradient_than_the_ratio_one_treatment(rows, spec, proximal):
    l_old, l, claim, mask, a = rows
    objective = make_objective(spec)
    exact, proxy = torch.tensor([TIER_EXACT]), torch.tensor([TIER_PROXY])
    g_claim = token_gradient(objective, l_old, l, claim, exact, a, mask, proximal)  # [T]
    g_tier2 = token_gradient(objective, l_old, l, torch.full_like(claim, math.nan), proxy, a, mask, proximal)  # [T]
    n_tok = float(mask.sum()) if spec not in ("dr_grpo",) else float(mask.shape[1])
    allowance = PPO_LIKE.get(spec, 0.0) * abs(float(a)) / n_tok if proximal == "behavior" else 0.0
    bound = torch.maximum(g_tier2, torch.full_like(g_tier2, allowance)) * (1 + 1e-5) + 1e-7  # [T]
    assert bool((g_claim <= bound).all()), (spec, proximal, g_claim.tolist(), g_tier2.tolist())
    assert float(g_claim.norm()) <= float(bound.norm()) + 1e-6


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 32), spec=st.sampled_from(["minpro", "cispo", "ftis"]), sd=st.sampled_from([0.0, 0.01, 0.05]),
       seed=st.integers(0, 2**16))
def test_on_policy_claims_get_weight_one_within_their_noise(n, spec, sd, seed):
    """(prefix, the exact product kept for study, accumulates the noise of every earlier token.)"""
    g = torch.Generator().manual_seed(seed)
    l_old = -torch.rand(1, n, generator=g) * 5  # [1, T]
    claim = (l_old + sd * torch.randn(1, n, generator=g)).clamp(max=0.0)  # an honest sampler, numeric noise
    mask, a = torch.ones(1, n), torch.tensor([1.0])
    grad = token_gradient(make_objective(spec), l_old, l_old, claim, torch.tensor([TIER_EXACT]), a, mask, "receiver")
    weight = grad * n  # [T] |dL/dl| / (|A| / n): 1 for an on-policy token
    assert float(weight.mean()) == pytest.approx(1.0, abs=4 * sd + 1e-5)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 64), group=st.sampled_from([4, 8]), kind=st.sampled_from(["mean_std", "mean"]),
       rewards=st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=64, max_size=64))
def test_a_peer_group_brings_no_more_advantage_mass_or_rows_than_ours(n, group, kind, rewards):
    adv, _ = group_advantages(torch.tensor(rewards[:n]), kind)  # [n]
    rows, scale = group_size_weight(n, group, kind)
    assert rows <= 1.0 and scale <= 1.0 and rows * n <= group + 1e-9  # never more rows in a denominator than ours
    # the largest mass a group of ours can carry: sqrt(G (G - 1)) with std scaling, G / 2 without
    best = math.sqrt(group * (group - 1)) if kind == "mean_std" else group / 2
    assert rows * scale * float(adv.abs().sum()) <= best + 1e-3


@pytest.mark.parametrize("kind", ["mean_std", "mean"])
def test_a_group_of_64_weighs_exactly_its_group_of_8(kind):
    eight = torch.tensor([1.0] + [0.0] * 7)  # one right among 8
    rows, scale = group_size_weight(64, 8, kind)
    mass8 = float(group_advantages(eight, kind)[0].abs().sum())
    mass64 = rows * scale * float(group_advantages(eight.repeat(8), kind)[0].abs().sum())
    assert mass64 == pytest.approx(mass8, rel=1e-3)
    lone = torch.tensor([1.0] + [0.0] * 63)  # one right among 64: A = 7.87 on that row before
    assert rows * scale * float(group_advantages(lone, kind)[0].max()) < 1.0


# ------------------------------------------------------------------------------------------------
# The learner on the tiny model
# ------------------------------------------------------------------------------------------------

PROMPT = [1, 5, 13]


def make_learner(local="grpo", external="minpro", group_size=None, optim=None, **off_policy):
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return Learner(policy.model, make_objective(local), optim or OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                   external_objective=make_objective(external), off_policy=OffPolicyConfig(**{**CLAIMS, **off_policy}),
                   completion_budget=3, group_size=group_size)


def peer_group(rewards, tier=TIER_PROXY, logprobs=None, distinct=8):
    return TrainGroup([TrainSample(PROMPT, [3 + i % distinct, 4, 5], logprobs, r, tier=tier)
                       for i, r in enumerate(rewards)])


def own_group(rewards=(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0)):
    return TrainGroup([TrainSample(PROMPT, [6 + i % 4, 7, 4], None, r) for i, r in enumerate(rewards)])


def test_learner_trains_a_group_of_64_as_it_trains_its_group_of_8():
    """Eight copies of the same 8 completions: before, the 64-row group had 8x the rows of a slot
    (diluting our own rows) and its own advantages; now the update is the same."""
    one_in_8 = [1.0] + [0.0] * 7
    small = make_learner(group_size=8).update([own_group(), peer_group(one_in_8)])
    big = make_learner(group_size=8).update([own_group(), peer_group(one_in_8 * 8)])
    assert big["loss"] == pytest.approx(small["loss"], rel=1e-4, abs=1e-6)
    assert big["grad_norm"] == pytest.approx(small["grad_norm"], rel=1e-4)


def test_every_group_uses_the_local_advantage_kind():
    """Local dr_grpo (A = R - mean) with external minpro: a peer group used mean/std and weighed
    2.8x ours; the same rewards through either path now give the same update."""
    rewards = [1.0, 0.0, 0.0, 0.0]
    as_peer = make_learner(local="dr_grpo", neg_damping=1.0).update([peer_group(rewards, distinct=4)])
    ours = TrainGroup([TrainSample(PROMPT, [3 + i, 4, 5], None, r) for i, r in enumerate(rewards)])
    as_ours = make_learner(local="dr_grpo", external="dr_grpo").update([ours])
    assert as_peer["grad_norm"] == pytest.approx(as_ours["grad_norm"], rel=1e-4)


def test_ppo_with_the_behavior_proximal_bounds_a_claimed_improbability():
    """grpo on peers' rows with proximal = behavior: wrong rows claiming b = -20 had an unbounded
    ratio for A < 0 (gradient norm 8.1e7 before clipping, vs 0.92 honest)."""
    rewards = [1.0, 0.0, 0.0, 0.0]
    liar = make_learner(external="grpo", proximal="behavior", neg_damping=1.0).update(
        [peer_group(rewards, tier=TIER_EXACT, logprobs=[-20.0] * 3, distinct=4)])
    honest = make_learner(external="grpo", proximal="behavior", neg_damping=1.0).update(
        [peer_group(rewards, distinct=4)])
    assert liar["grad_norm"] <= honest["grad_norm"] * 1.01
    assert liar["ext_claims_bounded_frac"] == pytest.approx(1.0)


def test_dual_clip_bounds_the_negative_branch():
    ratio = torch.tensor([[math.exp(8.0), 1.0]], requires_grad=True)  # [1, 2]
    logp = torch.log(ratio.detach()).requires_grad_()  # [1, 2]
    x = LossInputs(logp=logp, old_logp=torch.zeros(1, 2), behavior_logp=torch.zeros(1, 2), mask=torch.ones(1, 2),
                   advantages=torch.tensor([-1.0]))
    make_objective("grpo").loss(x)[0].backward()
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0  # e^8 > 3: the dual clip holds it
    logp.grad = None
    make_objective("grpo", dual_clip=None).loss(x)[0].backward()
    assert float(logp.grad[0, 0]) == pytest.approx(math.exp(8.0) / 2, rel=1e-4)  # the old, unbounded branch


def test_minpro_dead_zone_ignores_on_policy_noise_and_keeps_a_real_shift():
    g = torch.Generator().manual_seed(0)
    l = torch.zeros(64, 512)
    mask, a = torch.ones(64, 512), torch.ones(64)
    noisy = LossInputs(l, l, l - 0.1 * torch.randn(64, 512, generator=g), mask, a)
    exact = make_objective("minpro", dead_zone=0.0).weights(noisy)[:, 448:].mean()
    robust = make_objective("minpro").weights(noisy)[:, 448:].mean()
    assert exact < 0.8 and robust > 0.95  # was 0.74: long rows muted by noise alone
    shifted_b = l - 0.1 * torch.randn(64, 512, generator=g)  # [64, 512]
    shifted_b[:, 100] = 2.0  # one token the sampler was far surer of than we are: log rho = -2
    shifted = LossInputs(l, l, shifted_b, mask, a)
    assert make_objective("minpro").weights(shifted)[:, 200:].mean() < 0.3  # every later token muted


def test_a_failure_after_some_steps_does_not_train_our_samples_twice():
    learner = make_learner(optim=OptimConfig(lr=1e-2, minibatches=2))
    calls = {"n": 0}
    inner = learner._loss

    def fail_on_second(x, tier, present=None):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return inner(x, tier, present)

    learner._loss = fail_on_second
    stats = learner.update([own_group(), peer_group([1.0, 0.0, 0.0, 1.0], distinct=4)])
    assert stats["external_update_failed"] == 1.0 and stats["optimizer_steps"] == 1.0
    assert learner.policy_version == 1  # before: 1 + two more steps on our own samples again


def test_dropout_is_off_in_the_update():
    """With dropout > 0, l^old and the loss's l drew different masks: ratio != 1 on-policy."""
    learner = make_learner(optim=OptimConfig(lr=1e-2, minibatches=2))
    for module in learner.model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    learner.model.train()
    seen = []
    inner = learner._loss
    learner._loss = lambda x, tier, present=None: (seen.append((x.logp.detach().clone(), x.old_logp.clone())), inner(x, tier, present))[1]
    learner.update([own_group()])
    logp, old = seen[0]  # the first step: the weights are still those l^old was computed with
    assert torch.allclose(logp, old, atol=1e-6)


def test_a_reward_spread_below_the_floor_is_not_blown_up():
    adv, _ = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.999]))
    assert float(adv.abs().max()) < 0.1  # was 1.25: rounding noise of a scorer as a full-size signal
    adv, _ = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert float(adv[0]) == pytest.approx(0.8659, abs=1e-4)  # numeric check 4 is untouched


def test_damping_keeps_a_peer_group_zero_sum():
    rewards = torch.tensor([1.0] + [0.0] * 7)
    kappa = torch.tensor([0.5] * 8)
    adv, _ = group_advantages(rewards, "mean_std", kappa)
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-6)  # was +1.24 for damping after normalising
    assert float(adv[0]) > 0 and bool((adv[1:] < 0).all())
    assert torch.equal(group_advantages(rewards, "mean_std", torch.ones(8))[0], group_advantages(rewards)[0])



def test_under_the_default_damping_shipping_logprobs_buys_no_weight():
    """The same peer group as tier 0 (log-probs shipped: an exact claim or a lie of improbability,
    which the bound turns into ratio 1) and as tier 2 (nothing shipped) trains identically under
    the default config. With the former per-tier damping (1.0, 0.5, 0.5), tier 0's update had
    1.25x the gradient norm of tier 2's here: its failures were undamped in the baseline."""
    rewards = [1.0, 0.0, 0.0, 0.0]
    tier0 = make_learner().update([peer_group(rewards, tier=TIER_EXACT, logprobs=[-20.0] * 3, distinct=4)])
    tier2 = make_learner().update([peer_group(rewards, distinct=4)])
    assert tier0["grad_norm"] == pytest.approx(tier2["grad_norm"], rel=1e-4)


def test_a_per_tier_damping_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="one weight for every tier"):
        OffPolicyConfig(neg_damping=(1.0, 0.5, 0.5))


class LossWatch(Learner):
    """A Learner seen through its extension point, as scripts/experiments/peer_influence.py sees it:
    |dL/dl| summed over our tokens and over the peer's, for each backward."""

    def observe_loss(self, x, tier, loss):
        grad = torch.autograd.grad(loss, x.logp, retain_graph=True)[0].abs() * x.mask  # [b, C]
        peer = tier >= 0  # [b]
        self.seen = [*getattr(self, "seen", []), (float(grad[~peer].sum()), float(grad[peer].sum()))]


@pytest.mark.parametrize("chunk_tokens", [0, 8])
def test_the_extension_point_sees_the_gradient_the_update_applies(chunk_tokens):
    """observe_loss gets a graph over the log-probs, whole or a chunk's share at a time (8 tokens: a
    row or two a chunk); the sums of its gradients are the same either way, and the weights still move."""
    def watch(tokens):
        torch.manual_seed(0)
        model = load_policy(ModelConfig(name="tiny")).model
        return LossWatch(model, make_objective("grpo"), OptimConfig(lr=1e-2, backward_chunk_tokens=tokens,
                                                                    shared_prefix=False),
                         pad_id=0, temperature=1.0, completion_budget=3, group_size=8,
                         off_policy=OffPolicyConfig(**CLAIMS))

    groups = [own_group(), peer_group([1.0] + [0.0] * 7)]
    whole, observed = watch(0), watch(chunk_tokens)
    before = [p.detach().clone() for p in observed.params]
    whole.update(groups)
    observed.update(groups)
    assert len(whole.seen) == 1 and (len(observed.seen) > 1) == (chunk_tokens > 0)
    ours, peers = (sum(seen[i] for seen in observed.seen) for i in (0, 1))
    assert ours == pytest.approx(whole.seen[0][0], abs=1e-6) and peers == pytest.approx(whole.seen[0][1], abs=1e-6)
    assert peers > 0.0 and any(not torch.equal(a, b) for a, b in zip(before, observed.params))
