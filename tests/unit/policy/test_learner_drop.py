"""loss.off_policy.peer_failures = "drop" on the real tiny model: only a peer's correct samples
train, a peer's group without one is skipped (counted), and the dropped rows are never forwarded
while the gradient stays the one of training them at advantage 0 (policy/selection.py,
policy/ALGORITHMS.md "Peers' failures dropped")."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from node.train.groups import ScoredGroup, compose
from node.tasks.synthetic import SyntheticSource
from policy.advantages import group_advantages
from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.logprobs import completion_logprobs, pad_batch
from policy.losses import OBJECTIVES, make_objective
from policy.models import ModelConfig, load_policy
from policy.types import Rollout, TrainGroup, TrainSample

PROMPT = [1, 5, 13]  # bos '2' '='
SPECS = [f"{name}(grpo)" if cls.wrapper else name for name, cls in OBJECTIVES.items()]


class KeptAtZero(Learner):
    """The former drop: the same rows and advantages, the dropped rows forwarded at advantage 0."""

    def _select(self, groups):
        sel = super()._select(groups)
        return dataclasses.replace(sel, dropped=[False] * len(sel.dropped))


def build(cls=Learner, spec="grpo", optim=None, **off_policy) -> Learner:
    """A learner that records, per optimizer step, the gradient it applies and, per log-prob
    computation (a forward pass of its rows), the input ids."""
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    learner = cls(policy.model, make_objective(spec), OptimConfig(lr=1e-2, **(optim or {})), pad_id=0,
                  temperature=1.0, external_objective=make_objective(spec),
                  off_policy=OffPolicyConfig(**{"peer_failures": "drop", **off_policy}), completion_budget=6)
    learner.grads, learner.forwarded = [], []
    step = learner.optimizer.step

    def recording_step(*args, **kwargs):
        learner.grads.append({n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    logprobs = learner._logprobs

    def recording_logprobs(input_ids, *args):  # every forward of the update runs here, on whole rows [b, P+C]
        learner.forwarded.append(input_ids.clone())  # (the model itself sees a group's prompt once: shared_prefix)
        return logprobs(input_ids, *args)

    learner._logprobs = recording_logprobs
    return learner


def forwarded_completions(learner) -> set[tuple[int, ...]]:
    """The completions of every row the model was run on (pad id 0 stripped, the prompt cut off)."""
    return {tuple(row[row != 0].tolist()[len(PROMPT):]) for ids in learner.forwarded for row in ids}


def sample(completion, reward, tier=None, correct=None, logprobs=None, loss_mask=None) -> TrainSample:
    return TrainSample(PROMPT, list(completion), logprobs, reward, loss_mask=loss_mask, tier=tier, correct=correct)


def ours() -> TrainGroup:
    return TrainGroup([sample([4, 5, 6, 7], 1.0), sample([5, 6], 0.0), sample([6, 7, 8], 0.5, loss_mask=[0, 1, 1]),
                       sample([7, 8, 9, 10, 11], 0.0)])


def mixed_groups() -> list[TrainGroup]:
    """Ours; a peer's group of 6 (each row counts 4/6 of one) with partial credit (0.6: formatted
    but wrong, correct only at 1.0); one of ours merged with a peer's tier-0 samples."""
    completions = [[8, 9], [9, 10, 11, 12, 3], [10, 11, 12], [11, 12], [12, 3, 4, 5, 6, 7], [3, 9]]
    peer = TrainGroup([sample(c, r, tier=2, correct=r == 1.0)
                       for c, r in zip(completions, [1.0, 0.6, 0.0, 0.0, 1.0, 0.6])])
    merged = TrainGroup([sample([4, 9], 0.0), sample([5, 10, 3], 1.0), sample([6, 11], 0.0),
                         sample([7, 12, 4], 1.0, tier=0, correct=True, logprobs=[-1.0, -2.0, -1.5]),
                         sample([8, 3], 0.6, tier=0, correct=False, logprobs=[-0.5, -0.7])])
    return [ours(), peer, merged]


@pytest.mark.parametrize("optim", [{}, {"epochs": 2, "minibatches": 2, "backward_chunk_tokens": 24},
                                   {"minibatches": 64}], ids=["one_step", "minibatches_chunked", "one_row_each"])
@pytest.mark.parametrize("spec", SPECS)
def test_dropped_rows_are_not_forwarded_and_the_gradient_is_unchanged(spec, optim):
    """Every objective's aggregation (TM, SMTM, CN, GSPO's sequence mean, wrappers) still divides by
    the dropped rows' tokens / rows / row weights: each step's gradient is the one of the same
    minibatch with the dropped rows forwarded at advantage 0, though far fewer rows are forwarded.
    One row per minibatch: a dropped row's step has the zero gradient it had at advantage 0."""
    dropping, kept = build(Learner, spec, optim), build(KeptAtZero, spec, optim)
    torch.manual_seed(1)  # the same minibatches
    stats = dropping.update(mixed_groups())
    torch.manual_seed(1)
    kept_stats = kept.update(mixed_groups())
    assert stats["ext_failures_dropped"] >= 3 and "ext_failures_dropped" not in kept_stats
    skipped = stats["ext_failures_dropped"] + stats.get("zero_adv_rows_skipped", 0.0)  # mc: our rows at the median
    assert stats["samples_trained"] + skipped == kept_stats["samples_trained"]
    rows, kept_rows = (sum(ids.shape[0] for ids in lrn.forwarded) for lrn in (dropping, kept))
    assert rows < kept_rows and rows * kept_stats["samples_trained"] == kept_rows * stats["samples_trained"]
    assert stats["tokens_trained"] < kept_stats["tokens_trained"]
    assert len(dropping.grads) == len(kept.grads) == min(kept_stats["samples_trained"],
                                                         optim.get("epochs", 1) * optim.get("minibatches", 1))
    assert all(step.keys() == kept_step.keys() and step for step, kept_step in zip(dropping.grads, kept.grads))
    gaps = [relative_gap(step, kept_step) for step, kept_step in zip(dropping.grads, kept.grads)]
    # the first step starts from the same weights: float rounding only (padding to fewer rows); AdamW
    # then turns that rounding into slightly different weights for the later steps
    assert gaps[0] < 1e-5 and max(gaps) < 2e-4, gaps
    assert stats["loss"] == pytest.approx(kept_stats["loss"], rel=1e-4, abs=1e-7)


def relative_gap(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """|g - g_ref| / |g_ref| over every parameter's gradient at once."""
    diff = torch.cat([(grads[name] - ref).flatten() for name, ref in reference.items()])  # [n_params]
    norm = torch.cat([ref.flatten() for ref in reference.values()]).norm()  # []
    return float(diff.norm() / norm) if norm > 0 else float(diff.norm())  # a zero gradient must stay exactly 0


def success_logprob(learner: Learner, train_sample: TrainSample) -> float:
    ids, am, cm = pad_batch([train_sample.prompt_ids], [train_sample.completion_ids], 0)
    with torch.no_grad():
        return float((completion_logprobs(learner.model, ids, am, cm.shape[1], 1.0) * cm).sum())


def test_a_peers_wrong_answer_above_its_groups_mean_is_not_trained_its_right_one_is():
    """Partial credit: the peer's formatted wrong answer (0.6) sits above the group's baseline, so
    the former drop (A < 0 only) trained it. The verifier's verdict travels from the scored group
    (node/train/groups.py) to the learner, which trains the correct answer alone."""
    task = SyntheticSource({"copy": 1.0}, seed=0).batch(0, 1)[0]
    completions = [[3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    rollouts = [Rollout(prompt_ids=PROMPT, completion_ids=c, logprobs=None, text="", offsets=[], truncated=False,
                        tier=2) for c in completions]
    scored = ScoredGroup(task, rollouts, rewards=[1.0, 0.6, 0.0, 0.0], correct=[True, False, False, False],
                         origin="peer")
    (peer,), _ = compose([], [scored], "sapo")
    assert [s.correct for s in peer.samples] == [True, False, False, False]
    adv, _ = group_advantages(torch.tensor([1.0, 0.6, 0.0, 0.0]), "mean_std", torch.full((4,), 0.5))  # tier 2
    assert float(adv[1]) > 0.1  # the wrong answer is above the baseline

    learner = build()
    before = success_logprob(learner, peer.samples[0])
    stats = learner.update([peer])
    assert forwarded_completions(learner) == {(3, 4, 5)}  # the wrong answer (6, 7, 8) is never forwarded
    assert stats["ext_t2_samples"] == stats["samples_trained"] == 1 and stats["ext_failures_dropped"] == 3
    assert success_logprob(learner, peer.samples[0]) > before + 1e-3
    trained_whole = build(peer_failures="train")
    assert trained_whole.update([peer])["ext_t2_samples"] == 4 and len(forwarded_completions(trained_whole)) == 4


def test_a_peer_group_without_a_correct_sample_is_skipped_and_counted():
    """Formatted wrong answers only: skipped whole like a zero-advantage group (not even in the
    denominators: our own samples train exactly as alone). A sample without a verdict is not
    correct."""
    wrong = TrainGroup([sample(c, r, tier=2, correct=False)
                        for c, r in zip([[8, 9], [9, 10, 11], [10, 11, 12], [11, 12]], [0.6, 0.6, 0.0, 0.0])])
    with_peer, alone = build(), build()
    torch.manual_seed(1)  # the same row order
    stats = with_peer.update([ours(), wrong])
    torch.manual_seed(1)
    alone_stats = alone.update([ours()])
    assert stats["ext_groups_no_correct"] == 1 and "ext_groups_no_correct" not in alone_stats
    assert stats["samples_trained"] == 4 and "ext_t2_samples" not in stats and "ext_failures_dropped" not in stats
    assert forwarded_completions(with_peer) == forwarded_completions(alone)
    assert all(torch.equal(with_peer.grads[0][n], g) for n, g in alone.grads[0].items())

    unknown = TrainGroup([sample(s.completion_ids, r, tier=2) for s, r in zip(wrong.samples, [1.0, 0.6, 0.0, 0.0])])
    assert build().update([unknown]) == {"groups_zero_adv": 0.0, "samples_trained": 0.0, "ext_groups_no_correct": 1.0}
    assert build(peer_failures="train").update([ours(), wrong])["ext_t2_samples"] == 4  # only drop skips it
