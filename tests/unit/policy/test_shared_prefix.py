"""The shared-prefix path (policy/shared_prefix.py) against the plain one on the tiny Qwen2, float32:
the same per-token log-probs, loss and gradient of every parameter, within ATOL / RTOL.

Tolerance: atol 1e-5, rtol 1e-4 (torch.testing.assert_close). Max differences seen on the tiny
model (torch 2.13 CPU, transformers 5.23): log-probs 4.8e-7; gradients 3.8e-6 absolute (embed_tokens,
whose largest gradient entry is 12.7); through the learner, losses 2e-7 and gradients 4.7e-6 (the
second of four minibatch steps, after the first step moved the weights by float rounding apart).
In float64 with float64 norms the paths agree to 1e-15 relative (tolerance 1e-12): the shared path
is exact, and the float32 differences are rounding (summation order, kernel shapes). On SmolLM2 in float32 (30 layers) the
gradients of the two paths differ by up to 1.9e-4 relative (per-tensor norm; log-probs 7.6e-6), the
same order as the plain path's own float32 error against float64, which varies 10x with the
sequence length alone: outside this suite's tolerance, so measured by hand, not tested here.
The negative controls show that an off-by-one in the completions' positions (log-probs 2e-3 off,
gradients 0.11), or a row attached to another group's prompt (0.40, 10.3), is far outside it."""
import pytest
import torch

import policy.shared_prefix as shared_prefix
from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.logprobs import completion_logprobs, pad_batch, padded_positions
from policy.losses import make_objective
from policy.models import ModelConfig, load_policy
from policy.shared_prefix import group_layout, logprobs_over_shared_prompts, prompt_groups, row_chunks
from policy.types import TrainGroup, TrainSample

ATOL, RTOL = 1e-5, 1e-4
# three prompts of different lengths (so the batch left-pads two of them), G = 4 or 5 completions each
PROMPTS = ([1, 5, 13], [1, 7, 7, 2, 13], [1, 9, 4, 8, 11, 6, 13])
COMPLETION_LENGTHS = ((4, 1, 6, 3), (2, 5, 5, 3, 1), (6, 2, 4, 3))


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def tiny_model():
    return load_policy(ModelConfig(name="tiny")).model.eval()  # dropout off, as in the learner


def completion(row: int, length: int) -> list[int]:
    return [2 + (3 * row + 5 * t) % 14 for t in range(length)]


def mixed_batch():
    """Rows of three prompt groups with completions of unequal lengths, the groups interleaved (a
    minibatch's rows come in shuffled order), plus one row with a prompt of its own."""
    rows = [(p, completion(i * 7 + j, n)) for i, (p, lengths) in enumerate(zip(PROMPTS, COMPLETION_LENGTHS))
            for j, n in enumerate(lengths)]
    rows = rows[::2] + rows[1::2] + [([1, 3, 13], completion(99, 3))]
    prompts, completions = [p for p, _ in rows], [c for _, c in rows]
    ids, am, cm = pad_batch(prompts, completions, pad_id=0)  # [B, P+C], [B, P+C], [B, C]
    return ids, am, cm, prompt_groups(prompts)


def logprobs_and_grads(model, logprobs_of, cm: torch.Tensor):
    """(log-probs [B, C] at the completion tokens, every parameter's gradient) of a fixed weighted sum
    of the log-probs: a stand-in loss whose weights differ per token."""
    model.zero_grad(set_to_none=True)
    logp = logprobs_of()  # [B, C]
    weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1)).to(logp.dtype)  # [B, C]
    (logp * weights * cm).sum().backward()
    return logp.detach() * cm, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_logprobs_and_gradients_equal_the_plain_path():
    model = tiny_model()
    ids, am, cm, groups = mixed_batch()
    n_completion = cm.shape[1]
    plain = logprobs_and_grads(model, lambda: completion_logprobs(model, ids, am, n_completion, 0.7), cm)
    shared = logprobs_and_grads(
        model, lambda: shared_prefix.shared_prefix_logprobs(model, ids, am, n_completion, 0.7, groups), cm)
    assert_matches(shared[0], plain[0])
    assert plain[1].keys() == shared[1].keys()
    for name, grad in plain[1].items():
        assert_matches(shared[1][name], grad)


def float64_norm(self, hidden):
    """Qwen2RMSNorm without its float32 cast: in a float64 model every op is then float64."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def test_in_float64_the_paths_agree_to_float64_rounding(monkeypatch):
    """The proof that the shared path is exact, not merely close: with every op in float64 (the
    norms too, which transformers computes in float32), log-probs and gradients agree to 1e-12
    (seen: 1e-15 relative); what float32 shows above is rounding in a different summation order
    (the G rows' gradients summed before the prompt's backward rather than after it)."""
    from transformers.models.qwen2 import modeling_qwen2

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", float64_norm)
    model = tiny_model().double()
    ids, am, cm, groups = mixed_batch()
    cm = cm.double()  # [B, C]
    plain = logprobs_and_grads(model, lambda: completion_logprobs(model, ids, am, cm.shape[1], 0.7), cm)
    shared = logprobs_and_grads(
        model, lambda: shared_prefix.shared_prefix_logprobs(model, ids, am, cm.shape[1], 0.7, groups), cm)
    torch.testing.assert_close(shared[0], plain[0], atol=1e-12, rtol=1e-12)
    for name, grad in plain[1].items():
        torch.testing.assert_close(shared[1][name], grad, atol=1e-12, rtol=1e-10)


def wrong_inputs(ids, am, groups, mistake):
    """(positions [B, P+C], leaders [u], member_of [B]) with one deliberate mistake."""
    leaders, member_of = group_layout(groups)  # [u], [B]
    positions = padded_positions(am)  # [B, P+C]
    if mistake == "positions_off_by_one":
        positions = positions.clone()  # [B, P+C]
        positions[:, -1 - 6:] += 1  # the completion columns (C = 6) one position late
    else:  # "rows_on_the_next_prompt": every row continues the next group's prompt
        member_of = (member_of + 1) % leaders.numel()  # [B]
    return positions, leaders, member_of


@pytest.mark.parametrize("mistake", ["positions_off_by_one", "rows_on_the_next_prompt"])
def test_the_comparison_catches_a_wrong_prefix(mistake):
    """Negative control: the internal function, given a deliberately wrong argument, no longer
    matches, so the equality above is not a tolerance too wide to see such a bug."""
    model = tiny_model()
    ids, am, cm, groups = mixed_batch()
    assert cm.shape[1] == 6
    positions, leaders, member_of = wrong_inputs(ids, am, groups, mistake)
    plain, _ = logprobs_and_grads(model, lambda: completion_logprobs(model, ids, am, 6, 0.7), cm)
    wrong, _ = logprobs_and_grads(
        model, lambda: logprobs_over_shared_prompts(model, ids, am, positions, 6, 0.7, leaders, member_of), cm)
    assert (wrong - plain).abs().max() > 100 * ATOL
    with pytest.raises(AssertionError):
        assert_matches(wrong, plain)


def test_rows_without_a_shared_prompt_take_the_plain_path(monkeypatch):
    model = tiny_model()
    prompts, completions = [list(p) for p in PROMPTS], [completion(i, 3 + i) for i in range(3)]
    ids, am, cm = pad_batch(prompts, completions, pad_id=0)  # [3, P+C]
    monkeypatch.setattr(shared_prefix, "logprobs_over_shared_prompts", lambda *a: pytest.fail("shared path ran"))
    with torch.no_grad():
        shared = shared_prefix.shared_prefix_logprobs(model, ids, am, cm.shape[1], 1.0, prompt_groups(prompts))
        assert torch.equal(shared, completion_logprobs(model, ids, am, cm.shape[1], 1.0))  # [3, C]


def test_row_chunks_keep_a_group_together():
    groups = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])  # [12] three groups of 4, interleaved
    pieces = row_chunks(12, 3, groups)
    assert [sorted(groups[p].tolist()) for p in pieces] == [[0] * 4, [1] * 4, [2] * 4]
    assert [p.tolist() for p in row_chunks(5, 2, None)] == [[0, 1, 2], [3, 4]]  # unshared: contiguous
    leaders, member_of = group_layout(torch.tensor([2, 0, 2, 1]))  # [u], [4]
    assert leaders.tolist() == [1, 3, 0] and member_of.tolist() == [2, 0, 2, 1]


def train_groups() -> list[TrainGroup]:
    """Three groups of different prompt lengths, unequal completion lengths, mixed rewards."""
    rewards = ((1.0, 0.0, 0.0, 1.0), (0.0, 1.0, 1.0, 0.5, 0.0), (0.0, 0.0, 1.0, 0.0))
    return [TrainGroup(samples=[
        TrainSample(prompt_ids=list(prompt), completion_ids=completion(7 * i + j, n),
                    behavior_logprobs=[-2.0] * n, reward=r) for j, (n, r) in enumerate(zip(lengths, rs))])
        for i, (prompt, lengths, rs) in enumerate(zip(PROMPTS, COMPLETION_LENGTHS, rewards))]


def recorded_update(shared: bool, objective: str, **optim):
    """One learner update with shared_prefix on or off: (statistics, the gradient of each optimizer
    step, the number of shared-prompt forwards)."""
    cfg = OptimConfig(lr=1e-2, shared_prefix=shared, **optim)
    lrn = Learner(tiny_model(), make_objective(objective), cfg, pad_id=0, temperature=1.0,
                  off_policy=OffPolicyConfig(), completion_budget=8)
    grads, step = [], lrn.optimizer.step

    def recording_step(*args, **kwargs):  # the gradient each optimizer step is about to apply
        grads.append({n: p.grad.clone() for n, p in lrn.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    lrn.optimizer.step = recording_step
    calls, over_shared = [], shared_prefix.logprobs_over_shared_prompts
    shared_prefix.logprobs_over_shared_prompts = lambda *a: calls.append(1) or over_shared(*a)
    try:
        torch.manual_seed(0)  # the same minibatch order for both paths
        stats = lrn.update(train_groups())
    finally:
        shared_prefix.logprobs_over_shared_prompts = over_shared
    return stats, grads, len(calls)


# chunked: 12 rows x 13 columns = 156 tokens over 60 -> 3 row chunks (by-chunk backward); ftis filters
# rows: no-grad log-probs in chunks, then the model's backward chunk by chunk; minibatches: l^old first
@pytest.mark.parametrize("objective,optim", [
    ("grpo", {"backward_chunk_tokens": 0}),
    ("dr_grpo", {"backward_chunk_tokens": 60}),
    ("ftis", {"backward_chunk_tokens": 60}),
    ("grpo", {"epochs": 2, "minibatches": 2, "backward_chunk_tokens": 40}),
], ids=["whole", "chunked", "ftis_chunked", "minibatches_chunked"])
def test_learner_update_equals_the_plain_path(objective, optim):
    plain_stats, plain_grads, plain_calls = recorded_update(False, objective, **optim)
    stats, grads, calls = recorded_update(True, objective, **optim)
    assert plain_calls == 0 and calls > 0  # the shared path really ran
    assert stats["samples_trained"] == plain_stats["samples_trained"] >= 12  # of 13 (one at A = 0)
    assert stats["loss"] == pytest.approx(plain_stats["loss"], abs=ATOL, rel=RTOL)
    assert len(grads) == len(plain_grads) == optim.get("epochs", 1) * optim.get("minibatches", 1)
    for step_grads, plain_step in zip(grads, plain_grads):
        assert step_grads.keys() == plain_step.keys() and step_grads
        for name, grad in plain_step.items():
            assert_matches(step_grads[name], grad)
