"""A round's own completions in one generate call (node/train/rollouts.py RolloutSampler.sample): plain,
abstract-hinted and prefix-hinted groups come out of a single call of n = 1 rows, with the sizes,
flags and hint tokens of before, prefix rows cut to their room exactly as a call with that budget
would have sampled them; and the generator prefills each distinct prompt once however often it
repeats (policy/generation.py HFGenerator.shared_prefix_cache), without changing any sample."""
from __future__ import annotations

import pytest
import torch

import node.train.assembly
from node.train.assembly import build_parts
from node.train.groups import HintUse
from node.train.prompts import render_prompt
from node.train.rollouts import RolloutSampler
from policy.generation import HFGenerator
from policy.models import ModelConfig, load_policy
from policy.types import SamplingParams

from tests.support.tiny_node import tiny_cfg

MAX_NEW = 6
ABSTRACT = HintUse("l1", "m7")
SHORT, LONG = HintUse("prefix", "12"), HintUse("prefix", "1234")  # rooms 4 and 2: two budgets


class CountingGenerator:
    """The real generator, with every call's prompts, n and params kept."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.sampler_is_learner = inner.sampler_is_learner

    def generate(self, prompts, n, params):
        self.calls.append((prompts, n, params))
        return self.inner.generate(prompts, n, params)

    def refresh(self, policy_version):
        self.inner.refresh(policy_version)


def tiny_render(policy, question, hint=None, system_prompt=None):
    """render_prompt with an abstract hint the tiny model can read: its characters after the
    question (the tiny model has no chat template, node/train/prompts.py refuses one)."""
    ids = render_prompt(policy, question)
    return ids if hint is None else ids + policy.tokenizer(hint, add_special_tokens=False)["input_ids"]


def round_of(monkeypatch, temperature: float):
    monkeypatch.setattr(node.train.assembly, "render_prompt", tiny_render)  # SamplingContext.prompt's
    cfg = tiny_cfg(f"sampling.max_new_tokens={MAX_NEW}", "sampling.group_size=5", 'allocation.scheme="off"')
    parts = build_parts(cfg)
    parts.sampling.params = SamplingParams(temperature, MAX_NEW)  # 0 = greedy, which the config refuses
    counting = CountingGenerator(parts.sampling.generator)
    parts.sampling.generator = counting
    sampler = RolloutSampler(parts.sampling, cfg.sampling.group_size, cfg.allocation, parts.pass_rates, True)
    tasks = parts.source.batch(0, 5)
    hints = [None, ABSTRACT, SHORT, None, LONG]
    parts.sampling.take_work()
    groups, _ = sampler.sample(tasks, hints, 0)
    return parts, counting, tasks, hints, groups


def test_a_round_with_plain_abstract_and_prefix_hints_is_one_generate_call(monkeypatch):
    parts, counting, tasks, hints, groups = round_of(monkeypatch, 1.0)
    assert parts.sampling.take_work()["generate_calls"] == 1.0
    assert len(counting.calls) == 1
    prompts, n, params = counting.calls[0]
    assert n == 1 and params.max_new_tokens == MAX_NEW and len(prompts) == 5 * 5
    tok, eos = parts.policy.tokenizer, parts.policy.tokenizer.eos_token_id
    cut = 0
    for task, hint, group in zip(tasks, hints, groups):
        plain_prompt = render_prompt(parts.policy, task.question)
        assert len(group.rollouts) == 5 and group.hint == hint
        assert group.hinted == ([] if hint is None else [False, True, True, True, True])
        assert group.rollouts[0].prompt_ids == plain_prompt and group.rollouts[0].hint_tokens == 0
        for rollout, hinted in zip(group.rollouts, group.hinted or [False] * 5):
            assert len(rollout.logprobs) == len(rollout.offsets) == len(rollout.completion_ids)
            assert rollout.text == tok.decode(rollout.completion_ids, skip_special_tokens=True)
            if not hinted or hint.level != "prefix":
                expected = tiny_render(parts.policy, task.question, hint.text if hinted else None)
                assert rollout.prompt_ids == expected and rollout.hint_tokens == 0
                assert len(rollout.completion_ids) <= MAX_NEW
                continue
            prefix = tok(hint.text, add_special_tokens=False)["input_ids"]
            room = MAX_NEW - len(prefix)
            generated = rollout.completion_ids[len(prefix):]
            assert rollout.prompt_ids == plain_prompt and rollout.completion_ids[:len(prefix)] == prefix
            assert rollout.hint_tokens == len(prefix) and rollout.logprobs[:len(prefix)] == [0.0] * len(prefix)
            assert 1 <= len(generated) <= room
            assert rollout.truncated == (generated[-1] != eos)  # within its room: ended, else truncated
            cut += len(generated) == room and generated[-1] != eos
    assert cut  # some prefix rows ran past their room in the call and were cut (seeded round)


def test_prefix_rows_cut_to_their_room_are_what_a_call_with_that_budget_samples(monkeypatch):
    """Greedy decoding: every row of the merged call equals the separate call of before (plain
    prompt with n = G, hinted prompt with n = G-1, prefix rows with budget max_new - len(prefix))."""
    parts, _, tasks, hints, groups = round_of(monkeypatch, 0.0)
    generator, tok = parts.sampling.generator.inner, parts.policy.tokenizer
    for task, hint, group in zip(tasks, hints, groups):
        plain_prompt = render_prompt(parts.policy, task.question)
        (unhinted, *_), = generator.generate([plain_prompt], 5, SamplingParams(0.0, MAX_NEW))
        expected = [unhinted] * (5 if hint is None else 1)
        if hint is not None and hint.level == "prefix":
            prefix = tok(hint.text, add_special_tokens=False)["input_ids"]
            (alone,) = generator.generate([plain_prompt + prefix], 1, SamplingParams(0.0, MAX_NEW - len(prefix)))[0]
            expected += [alone] * 4
        elif hint is not None:
            hinted_prompt = tiny_render(parts.policy, task.question, hint.text)
            expected += generator.generate([hinted_prompt], 4, SamplingParams(0.0, MAX_NEW))[0]
        for ours, reference in zip(group.rollouts, expected, strict=True):
            forced = ours.hint_tokens
            assert ours.completion_ids[forced:] == reference.completion_ids
            assert ours.truncated == reference.truncated
            torch.testing.assert_close(torch.tensor(ours.logprobs[forced:]), torch.tensor(reference.logprobs),
                                       atol=1e-5, rtol=0)
    assert any(r.truncated and r.hint_tokens for g in groups for r in g.rollouts)  # the cut was exercised


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(init_seed=0))


def encode(policy, texts):
    return [[policy.tokenizer.bos_token_id, *policy.tokenizer.encode(text)] for text in texts]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_repeated_prompts_are_prefilled_once_and_sample_as_one_prompt_with_n(tiny, monkeypatch, temperature):
    """Rows of repeated prompts (n = 1) prefill each distinct prompt once per batch, and for a fixed
    seed give exactly the completions and log-probs of the same prompts asked with n; greedy, those
    of the path without the shared prefill and of separate calls per prompt too."""
    prompts = encode(tiny, ["1+2=", "345+67=", "m9=", "8+8+8+8+8="])  # lengths 5, 8, 4, 11
    rows = [p for p in prompts for _ in range(3)]  # max_batch 5: [0 0 0 1 1][1 2 2 2 3][3 3]
    params = SamplingParams(temperature, 8, seed=3)
    generator = HFGenerator(tiny.model, tiny.tokenizer, max_batch=5)
    prefill_rows = []

    def record(module, args, kwargs):
        cache = kwargs.get("past_key_values")
        if cache is not None and cache.get_seq_length() == 0:  # the shared prefill, not a decode step
            prefill_rows.append(kwargs["input_ids"].shape[0])

    hook = tiny.model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        merged = [group[0] for group in generator.generate(rows, 1, params)]
    finally:
        hook.remove()
    assert prefill_rows == [2, 3, 1]  # distinct prompts per batch, not its 5, 5, 2 rows
    # what the compute clock charges: each batch runs as many decode steps as its longest completion needs
    longest = [max(len(r.completion_ids) for r in merged[a:b]) for a, b in ((0, 5), (5, 10), (10, 12))]
    assert generator.work["prompts_prefilled"] == 6 and sum(longest) <= generator.work["decode_steps"] <= 3 * 8
    grouped = [r for group in generator.generate(prompts, 3, params) for r in group]
    references = [grouped]
    if temperature == 0.0:
        references.append([r for p in prompts for r in generator.generate([p], 3, params)[0]])
        monkeypatch.setattr(HFGenerator, "shared_prefix_cache", lambda self, prompts, owners: None)
        references.append([group[0] for group in generator.generate(rows, 1, params)])
    for reference in references:
        for ours, theirs in zip(merged, reference, strict=True):
            assert ours.completion_ids == theirs.completion_ids and ours.prompt_ids == theirs.prompt_ids
            torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(theirs.logprobs), atol=1e-5, rtol=0)
    if temperature > 0:
        assert [r.logprobs for r in merged] == [r.logprobs for r in grouped]  # same batches: bit for bit
        assert len({tuple(r.completion_ids) for r in merged}) > 4  # repeated rows still sample apart
