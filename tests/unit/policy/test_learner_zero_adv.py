"""Rows at advantage exactly 0 cost nothing: on the real tiny model, under an objective whose term is
0 with a zero gradient at A = 0 (`zero_advantage_inert`), such a row is never forwarded, yet counts
in the denominators, so the gradient is the one of forwarding it at advantage 0 (policy/selection.py
`skip_zero_rows`, policy/ALGORITHMS.md "Peers' failures dropped")."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from policy.advantages import group_advantages
from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.loss_knobs import OBJECTIVE_KNOBS
from policy.losses import OBJECTIVES, LossInputs, make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TrainGroup
from tests.unit.policy.test_learner_drop import build, forwarded_completions, relative_gap, sample

INERT = ["grpo", "dr_grpo", "dapo", "gspo", "cispo", "mc(grpo)", "tis(dapo)"]
NOT_INERT = ["ftis", "mc(ftis)"]
FLAT = [[3, 4], [4, 5, 6], [5, 6, 7, 8], [6, 3]]  # a flat group's completions (reward 0 each)
AT_MEAN = [[7, 8, 9], [8, 9, 10, 11], [9, 10], [10, 11, 12]]  # rewards [1, 0, 0.5, 0.5]
PEER_FLAT = [[11, 12, 3], [12, 3, 4, 5], [3, 4, 5]]  # a peer's group, all correct


class ForwardedAtZero(Learner):
    """The former selection: every row at A = 0 forwarded (peers' failures still dropped)."""

    def _select(self, groups):
        sel = super()._select(groups)
        return dataclasses.replace(sel, dropped=[d and not z for d, z in zip(sel.dropped, sel.zero_adv)])


def groups() -> list[TrainGroup]:
    """A flat group of ours (kept with skip_zero_advantage = false), one of ours with two rows at
    the mean (under mc: one at the median after the pivot), a group without a zero, and a peer's flat
    group of correct samples (trained by the external objective)."""
    return [TrainGroup([sample(c, 0.0) for c in FLAT]),
            TrainGroup([sample(c, r) for c, r in zip(AT_MEAN, [1.0, 0.0, 0.5, 0.5])]),
            TrainGroup([sample([4, 6, 8], 1.0), sample([5, 7], 0.0), sample([6, 8, 10, 12], 0.0)]),
            TrainGroup([sample(c, 1.0, tier=2, correct=True) for c in PEER_FLAT])]


def zero_rows(spec: str) -> set[tuple[int, ...]]:
    """The completions at A = 0 exactly under spec's advantage kind (mc: a pivot is no row at all)."""
    kind = make_objective(spec).advantage
    rows = set()
    for group in groups():
        adv, keep = group_advantages(torch.tensor([s.reward for s in group.samples]), kind)  # [G], [G]
        rows |= {tuple(s.completion_ids) for s, a, k in zip(group.samples, adv.tolist(), keep.tolist()) if k and a == 0}
    return rows


def rows_forwarded(learner: Learner) -> int:
    return sum(ids.shape[0] for ids in learner.forwarded)


@pytest.mark.parametrize("optim", [{}, {"epochs": 2, "minibatches": 3, "backward_chunk_tokens": 24}],
                         ids=["one_step", "minibatches_chunked"])
@pytest.mark.parametrize("spec", INERT)
def test_zero_advantage_rows_are_not_forwarded_and_the_gradient_is_unchanged(spec, optim):
    # no clipping: a clipped gradient would hide a wrong denominator (a uniform scale)
    optim = {"skip_zero_advantage": False, "grad_clip": 1e9, **optim}
    skipping, forwarding = build(Learner, spec, optim), build(ForwardedAtZero, spec, optim)
    torch.manual_seed(1)  # the same minibatches
    stats = skipping.update(groups())
    torch.manual_seed(1)
    ref = forwarding.update(groups())
    zero = zero_rows(spec)
    assert stats["zero_adv_rows_skipped"] == len(zero) and "zero_adv_rows_skipped" not in ref
    assert stats["samples_trained"] + len(zero) == ref["samples_trained"] and stats["groups_zero_adv"] == 0
    assert not forwarded_completions(skipping) & zero and zero <= forwarded_completions(forwarding)
    assert rows_forwarded(skipping) * ref["samples_trained"] == rows_forwarded(forwarding) * stats["samples_trained"]
    assert len(skipping.grads) == len(forwarding.grads) == optim.get("epochs", 1) * optim.get("minibatches", 1)
    first, first_ref = skipping.grads[0], forwarding.grads[0]  # the same weights: float rounding only
    assert first.keys() == first_ref.keys() and first
    assert all(torch.allclose(first[n], g, rtol=1e-4, atol=1e-6) for n, g in first_ref.items())
    gaps = [relative_gap(step, step_ref) for step, step_ref in zip(skipping.grads, forwarding.grads)]
    assert gaps[0] < 1e-5 and max(gaps) < 2e-4, gaps  # later steps: AdamW carries the rounding into the weights
    assert stats["loss"] == pytest.approx(ref["loss"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("spec", NOT_INERT)
def test_an_objective_that_is_not_inert_forwards_its_zero_advantage_rows(spec):
    learner = build(Learner, spec, {"skip_zero_advantage": False})
    stats = learner.update(groups())
    assert "zero_adv_rows_skipped" not in stats and zero_rows(spec) <= forwarded_completions(learner)
    assert stats["samples_trained"] == rows_forwarded(learner) == sum(len(g.samples) for g in groups()) - (
        spec.startswith("mc(") * len(groups()))  # mc: one pivot per group is no row


def test_each_row_follows_the_objective_that_trains_it():
    """ftis here, grpo for peers: our rows at A = 0 are forwarded, the peer's are not."""
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    learner = Learner(policy.model, make_objective("ftis"), OptimConfig(lr=1e-2, skip_zero_advantage=False),
                      pad_id=0, temperature=1.0, external_objective=make_objective("grpo"),
                      off_policy=OffPolicyConfig(peer_failures="drop"), completion_budget=6)
    stats = learner.update(groups())
    assert stats["zero_adv_rows_skipped"] == len(PEER_FLAT) and "ext_t2_samples" not in stats
    assert stats["samples_trained"] == len(FLAT) + len(AT_MEAN) + 3


def test_the_default_skips_flat_groups_whole_and_still_leaves_out_rows_at_the_mean():
    learner = build(Learner, "grpo")
    stats = learner.update(groups())
    assert stats["groups_zero_adv"] == 2 and stats["zero_adv_rows_skipped"] == 2
    assert stats["samples_trained"] == rows_forwarded(learner) == 2 + 3


@pytest.mark.parametrize("spec", [f"{name}(grpo)" if cls.wrapper else name for name, cls in OBJECTIVES.items()])
def test_an_inert_objectives_term_and_gradient_are_zero_at_advantage_zero(spec):
    """The trait's promise, on random off-policy inputs: a row at A = 0 gives a term of exactly 0
    and a gradient of exactly 0 next to rows that train; every objective declares the trait."""
    objective = make_objective(spec)
    assert "zero_advantage_inert" in vars(OBJECTIVE_KNOBS[objective.name]) or objective.wrapper
    if not objective.zero_advantage_inert:
        return
    gen = torch.Generator().manual_seed(0)
    old, beh = -torch.rand(3, 5, generator=gen) * 3, -torch.rand(3, 5, generator=gen) * 3  # [3, 5], [3, 5]
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.float32)  # [3, 5]
    for off_policy in (False, True):  # ratios of 1 to l_old (the other rows train), then far from 1
        logp = (old - torch.rand(3, 5, generator=gen) * off_policy).requires_grad_()  # [3, 5]
        x = LossInputs(logp, old, beh, mask, torch.tensor([1.5, 0.0, -0.7]), completion_budget=5.0)
        term, _ = objective.token_loss(x)  # [3, 5]
        objective.aggregate(term, x).backward()
        assert torch.equal(term[1], torch.zeros(5)) and torch.equal(logp.grad[1], torch.zeros(5))
        assert off_policy or bool((logp.grad[0] != 0).any())
