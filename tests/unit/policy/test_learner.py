"""The learner on the real tiny model: advantages, masks, several steps per round, LoRA, learning."""
import pytest
import torch

from node.train.loop import Node
from node.observe.metrics import RoundTable, read_metrics
from policy.checkpoint import latest_checkpoint, latest_checkpoint_path, latest_round, load_weights, save_checkpoint
from policy.learner import Learner, OffPolicyConfig, OptimConfig, apply_lora
from policy.losses import make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TrainGroup, TrainSample
from tests.unit.policy.test_learner_external import CLAIMS

PROMPT = [1, 5, 13]  # bos '2' '='


def group(rewards, completion_len=3, behavior=True, loss_mask=None):
    samples = []
    for i, r in enumerate(rewards):
        ids = [3 + (i + t) % 10 for t in range(completion_len)]
        samples.append(TrainSample(prompt_ids=PROMPT, completion_ids=ids,
                                   behavior_logprobs=[-2.0] * completion_len if behavior else None,
                                   reward=r, loss_mask=loss_mask))
    return TrainGroup(samples=samples)


def learner(objective="grpo", **optim):
    policy = load_policy(ModelConfig(name="tiny"))
    cfg = OptimConfig(**{"lr": 1e-2, **optim})
    model = apply_lora(policy.model, cfg)
    claims = OffPolicyConfig(**CLAIMS)  # the external rows' machinery under test
    return Learner(model, make_objective(objective), cfg, pad_id=0, temperature=1.0, off_policy=claims), policy


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_zero_advantage_groups_are_skipped_and_change_nothing():
    lrn, policy = learner()
    before = params(lrn.model)
    stats = lrn.update([group([1.0, 1.0, 1.0, 1.0]), group([0.0, 0.0, 0.0, 0.0])])
    assert stats["groups_zero_adv"] == 2 and stats["samples_trained"] == 0
    assert all(torch.equal(before[n], p) for n, p in lrn.model.named_parameters())


def test_one_step_is_on_policy_and_moves_weights():
    lrn, _ = learner()
    before = params(lrn.model)
    stats = lrn.update([group([1.0, 0.0, 0.0, 1.0], behavior=False)])
    assert stats["optimizer_steps"] == 1 and stats["ratio_mean"] == pytest.approx(1.0)
    assert any(not torch.equal(before[n], p) for n, p in lrn.model.named_parameters())


def test_several_minibatch_steps_move_ratios_away_from_one():
    lrn, _ = learner(epochs=2, minibatches=2)
    stats = lrn.update([group([1.0, 0.0, 0.0, 1.0]), group([0.0, 1.0, 1.0, 1.0])])
    assert stats["optimizer_steps"] == 4
    assert abs(stats["ratio_max"] - 1.0) > 1e-3  # l^old stayed frozen while the weights moved


def test_mc_excludes_exactly_one_pivot_per_group():
    lrn, _ = learner("mc(grpo)")
    stats = lrn.update([group([1.0, 0.0, 0.0, 0.0, 1.0])])  # G+1 = 5 samples, median 0
    # 4 rows: the 2 others at the median (A = 0) are counted but not forwarded (grpo is inert there)
    assert stats["samples_trained"] == 2 and stats["zero_adv_rows_skipped"] == 2


def test_masked_tokens_are_not_trained():
    lrn, _ = learner()
    stats = lrn.update([group([1.0, 0.0, 1.0, 0.0], completion_len=4, loss_mask=[0, 0, 1, 1])])
    assert stats["tokens_trained"] == 4 * 2  # hint-like prefix tokens never enter the loss


def test_lora_trains_only_adapters_and_checkpoints_round_trip(tmp_path):
    lrn, policy = learner(lora_rank=4)
    trainable = {n for n, p in lrn.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    base_before = {n: p.clone() for n, p in lrn.model.named_parameters() if not p.requires_grad}
    lrn.update([group([1.0, 0.0, 0.0, 1.0])])
    assert all(torch.equal(base_before[n], p) for n, p in lrn.model.named_parameters() if not p.requires_grad)
    save_checkpoint(tmp_path, 0, lrn.model, policy.tokenizer, lrn.optimizer, {}, files={"exchange.json": "{}"})
    # an extra file travels inside the checkpoint and does not rename it (LATEST once named the file)
    assert latest_checkpoint_path(tmp_path).name == "round-000000" and latest_round(tmp_path) == 0
    assert (latest_checkpoint_path(tmp_path) / "exchange.json").read_text() == "{}"
    fresh, _ = learner(lora_rank=4)
    load_weights(fresh.model, latest_checkpoint(tmp_path))
    for (n, a), (_, b) in zip(lrn.model.named_parameters(), fresh.model.named_parameters()):
        assert torch.equal(a, b), n


@pytest.mark.slow
def test_tiny_preset_learns_from_scratch(tmp_path, tiny_config):
    """The issue's bar on a shorter run: last rounds' reward at least 3x the first rounds'."""
    cfg = tiny_config("run.rounds=200", "run.checkpoint_every=200")
    node = Node(cfg, tmp_path)
    node.run(200, RoundTable("learn", quiet=True))
    rewards = [r["reward_mean"] for r in read_metrics(tmp_path)]
    first, last = sum(rewards[:20]) / 20, sum(rewards[-20:]) / 20
    assert last >= max(3 * first, 0.5), (first, last)


def peer_group(rewards, completion_len=3, tier=0):
    """A peer's group (tier 0: its claimed log-probs, which the learner bounds by ours)."""
    return TrainGroup(samples=[
        TrainSample(prompt_ids=PROMPT, completion_ids=[4 + (i + t) % 9 for t in range(completion_len)],
                    behavior_logprobs=[-1.5 - 0.5 * t for t in range(completion_len)], reward=r, tier=tier)
        for i, r in enumerate(rewards)])


# ftis filters rows (its denominators read every row's current log-probs): the loss sees the whole
# minibatch, then the backward runs chunk by chunk; every other objective aggregates chunk by chunk
@pytest.mark.parametrize("objective,external", [("grpo", None), ("dapo", None), ("gspo", None), ("dr_grpo", None),
                                                ("cispo", None), ("minpro", None), ("prefix", None),
                                                ("tis(grpo)", None), ("ftis", None), ("grpo", "minpro"),
                                                ("dr_grpo", "ftis")])
def test_chunked_backward_gives_the_same_step(objective, external):
    """backward_chunk_tokens splits the backward into row chunks: same loss and (to float rounding)
    the same gradient as one backward over all rows, with peers' rows (external objective) too."""
    groups = [group([1.0, 0.0, 0.0, 1.0], completion_len=4), group([0.0, 1.0, 1.0, 1.0], completion_len=2),
              group([0.5, 0.0, 1.0, 0.0], completion_len=3)]
    if external is not None:
        groups.append(peer_group([1.0, 0.0, 0.0, 0.0], completion_len=3))
    grads = {}

    def recording(lrn, key):  # the gradient each optimizer step is about to apply
        step = lrn.optimizer.step

        def wrapped(*args, **kwargs):
            grads[key] = {n: p.grad.clone() for n, p in lrn.model.named_parameters() if p.grad is not None}
            return step(*args, **kwargs)
        lrn.optimizer.step = wrapped
        return lrn

    def build(chunk_tokens):
        lrn = learner(objective, backward_chunk_tokens=chunk_tokens)[0]
        lrn.completion_budget = 8  # dr_grpo's L_norm (the node passes max_new_tokens)
        if external is not None:
            lrn.external_objective = make_objective(external)
        return lrn

    whole = recording(build(0), "whole")
    chunked = recording(build(20), "chunked")  # 84 tokens -> 5 chunks
    assert chunked._backward_chunks(torch.Size([12, 7])) == 5
    by_chunk = []
    chunked._backward_by_chunk = lambda *a, f=chunked._backward_by_chunk: by_chunk.append(1) or f(*a)
    stats_whole, stats_chunked = whole.update(groups), chunked.update(groups)
    assert bool(by_chunk) == (external != "ftis" and objective != "ftis")  # which path ran
    if external is not None:
        assert stats_chunked["ext_t0_samples"] == stats_whole["ext_t0_samples"] == 4
    assert stats_chunked["loss"] == pytest.approx(stats_whole["loss"], abs=1e-7)
    assert stats_chunked["grad_norm"] == pytest.approx(stats_whole["grad_norm"], rel=1e-5)
    assert grads["whole"].keys() == grads["chunked"].keys() and grads["whole"]
    for name, grad in grads["whole"].items():
        assert torch.allclose(grads["chunked"][name], grad, rtol=1e-4, atol=1e-7), name


def test_a_nonfinite_gradient_skips_the_step_instead_of_poisoning_the_weights():
    # One SmolLM2 node of 24 on an H200 took a NaN gradient step and every later output was NaN.
    lrn, _ = learner()
    before, version = params(lrn.model), lrn.policy_version
    trainable = next(p for p in lrn.model.parameters() if p.requires_grad)
    hook = trainable.register_hook(lambda grad: grad * float("nan"))
    stats = lrn.update([group([1.0, 0.0, 0.0, 1.0], behavior=False)])
    hook.remove()
    assert stats["skipped_step_frac"] == 1.0 and stats["optimizer_steps"] == 0.0
    assert lrn.policy_version == version
    assert all(torch.equal(before[n], p) for n, p in lrn.model.named_parameters())

    stats = lrn.update([group([1.0, 0.0, 0.0, 1.0], behavior=False)])  # the next round trains as usual
    assert stats["skipped_step_frac"] == 0.0 and stats["optimizer_steps"] >= 1.0
    assert all(torch.isfinite(p).all() for p in lrn.model.parameters())
    assert any(not torch.equal(before[n], p) for n, p in lrn.model.named_parameters())
