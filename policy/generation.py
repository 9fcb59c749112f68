"""Rollout generation: the Generator interface, the HF `generate` backend (in-process, CPU or GPU)
and the helpers every backend shares (vLLM, in its own process: policy/vllm_backend.py; the choice
between them: policy/backends.py).

Every backend returns, per completion, the token ids, the behavior log-probs b_t at the sampling
temperature (policy/ALGORITHMS.md: computed on logits / T, so the on-policy ratio is exactly 1), the
decoded text and each token's character span in that text. The HF backends (HFGenerator and its
sampling-copy subclass) also give each completion's mean per-token entropy of the distribution its
tokens were drawn from (TokenSampler); vLLM gives none (Rollout.entropy None).

Temperature 0 means greedy decoding; its log-probs are those of the untempered model (T = 1),
and `completion_logprobs(..., temperature=0)` uses the same convention.
"""
from __future__ import annotations

import collections
import contextlib
from typing import TYPE_CHECKING, Protocol

import torch
from tokenizers.decoders import DecodeStream
from torch import Tensor
from transformers import DynamicCache, GenerationConfig, LogitsProcessor, LogitsProcessorList

from policy.logprobs import pad_batch
from policy.types import Rollout, SamplingParams

if TYPE_CHECKING:
    from policy.models import LoadedPolicy


class StaleWeightsError(RuntimeError):
    """A generator sampled with other weights than the policy about to be trained on its rollouts."""


class Generator(Protocol):
    # True when the rollouts' behavior log-probs come from the learner's own forward pass (same
    # weights, same precision); False for a sampling copy or vLLM: the node then corrects with tis
    sampler_is_learner: bool

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Rollout]]:
        """n completions for each prompt, in prompt order."""
        ...

    def refresh(self, policy_version: int) -> None:
        """Called after every optimizer step: the next `generate` must use the new weights, and its
        rollouts carry `policy_version`."""
        ...


class HFGenerator:
    """Batched `model.generate` over all prompts x n, left padded, plain temperature sampling.

    Shares the weights of the training model, so `refresh()` only records the policy version.
    """

    sampler_is_learner = True

    def __init__(self, model, tokenizer, max_batch: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        self.eos_ids = eos_token_ids(model, tokenizer)
        pad_id = tokenizer.pad_token_id
        self.pad_id = pad_id if pad_id is not None else self.eos_ids[0]
        self.policy_version = 0
        # work done so far, for whoever charges it (node/testnet/clock.py): decode steps (a batch runs
        # as many as its longest completion needs, every row alike) and prompts prefilled (distinct
        # prompts, per batch)
        self.work: collections.Counter = collections.Counter()

    def refresh(self, policy_version: int) -> None:
        self.policy_version = policy_version

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Rollout]]:
        validate_request(prompts, n, params)
        owners = [index for index in range(len(prompts)) for _ in range(n)]  # row -> its prompt
        rollouts: list[Rollout] = []
        with _eval_mode(self.model), _seeded(params.seed, self.model.device):
            for start in range(0, len(owners), self.max_batch):
                rollouts.extend(self._generate_batch(prompts, owners[start : start + self.max_batch], params))
        return [rollouts[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _generate_batch(self, prompts: list[list[int]], owners: list[int], params: SamplingParams) -> list[Rollout]:
        device = self.model.device
        rows = [prompts[index] for index in owners]
        self.work["prompts_prefilled"] += len({tuple(row) for row in rows})
        input_ids, attention_mask, _ = pad_batch(rows, [[] for _ in rows], self.pad_id)  # [B, P]
        recorder = TokenSampler(params.temperature)
        with _without_model_generation_defaults(self.model):
            sequences = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                past_key_values=self.shared_prefix_cache(prompts, owners),
                generation_config=self.generation_config(params),
                logits_processor=LogitsProcessorList([recorder]),
            )  # [B, P+S]
        new_tokens = sequences[:, input_ids.shape[1] :]  # [B, S]
        self.work["decode_steps"] += new_tokens.shape[1]
        recorded = torch.stack((recorder.finish(new_tokens), recorder.finish_entropy(new_tokens)))  # [2, B, S]
        # One transfer to Python lists; the per-row work left is string decoding.
        logprobs, entropies = recorded.tolist()
        return [
            build_rollout(self.tokenizer, prompt, tokens, row_logprobs, self.eos_ids, params.max_new_tokens,
                          self.policy_version, row_entropies)
            for prompt, tokens, row_logprobs, row_entropies in zip(rows, new_tokens.tolist(), logprobs, entropies)
        ]

    def shared_prefix_cache(self, prompts: list[list[int]], owners: list[int]) -> DynamicCache | None:
        """KV cache of every row's prompt but its last token, computed once per distinct prompt.

        The rows of a prompt share it, so the prefill runs on the distinct prompts of the batch
        and its keys/values are then copied out to the rows. Distinct by content, not by index:
        a caller that passes every row as its own prompt with n = 1 (node/train/rollouts.py merges a
        round's plain and hinted completions into one call so) pays no extra prefill. `generate`
        sees a cache shorter than `input_ids` and feeds only the last prompt column (it must run
        through the model anyway: its logits give the first token). The layout is the rows' one
        (left padded to the same width P), so masks and positions line up column for column. A
        subclass may override it, as generation_config (scripts/bench/policy/generation.py does).
        """
        slot: dict[tuple[int, ...], int] = {}  # distinct prompt content -> its row in the prefill
        keys = [tuple(prompts[index]) for index in owners]
        for key in keys:
            slot.setdefault(key, len(slot))
        distinct = [list(key) for key in slot]
        input_ids, attention_mask, _ = pad_batch(distinct, [[] for _ in distinct], self.pad_id)  # [U, P]
        if input_ids.shape[1] < 2:
            return None  # one-token prompts: nothing to share
        device = self.model.device
        input_ids = input_ids[:, :-1].to(device)  # [U, P-1]
        attention_mask = attention_mask[:, :-1].to(device)  # [U, P-1]
        # Positions count real tokens only, as generate() and policy/logprobs.py compute them.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [U, P-1]
        cache = DynamicCache(config=self.model.config)
        with torch.no_grad():
            # The decoder alone: the prefix's logits are never used, and the output layer on the
            # sliced last position ([U, 1, d], not contiguous) went through a batched matmul that
            # copied its whole weight U times (SmolLM2: 8 x 49,152 x 576, seconds per call).
            self.model.get_decoder()(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
        cache.batch_select_indices(torch.tensor([slot[key] for key in keys], device=device))  # [B, heads, P-1, d] per layer
        return cache

    def generation_config(self, params: SamplingParams) -> GenerationConfig:
        """Greedy mode and nothing else: TokenSampler (the only logits processor besides HF's
        min_new_tokens, when set) picks each token, so no HF warper (its global default top_k=50
        among them) may reshape the distribution before it."""
        return GenerationConfig(
            do_sample=False,
            max_new_tokens=params.max_new_tokens,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids,
            bos_token_id=self.tokenizer.bos_token_id,
        )


class TokenSampler(LogitsProcessor):
    """Picks every token itself and records its log-prob, log_softmax(raw_logits / T)[token], and
    the entropy of the distribution it was drawn from, softmax(raw_logits / T) (0 at T = 0).

    `generate` runs in greedy mode with this as its last logits processor: it returns scores that
    are -inf everywhere but at the token it picked, so HF's argmax takes exactly that token.
    T > 0: one exact draw from softmax(logits / T) per row by inverse CDF (one uniform number,
    a cumulative sum and a binary search). HF's own sampling (`torch.multinomial`) draws an
    exponential variable for every one of the V entries of every row: on SmolLM2 (V = 49,152,
    64 rows) that alone was a fifth of a decode step on a CPU. T = 0: argmax, with the untempered
    model's log-prob. Scores arrive as float32 after HF's own processors (min_new_tokens' eos
    mask in the benchmark), so what is recorded is the distribution the token was drawn from.
    """

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.inverse_temperature = 1.0 / temperature if temperature > 0 else 1.0
        self.per_step: list[Tensor] = []  # one [B] tensor per generated column
        self.per_step_entropy: list[Tensor] = []  # one [B] tensor per generated column

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        scaled = scores.float()  # [B, V]; HF hands over float32 logits of its own: no copy
        if self.inverse_temperature != 1.0:
            scaled = scaled * self.inverse_temperature  # [B, V], a new tensor
        log_normalizer = scaled.logsumexp(-1, keepdim=True)  # [B, 1]
        if self.temperature > 0:
            cumulative = (scaled - log_normalizer).exp_().cumsum_(-1)  # [B, V]
            draw = torch.rand(scaled.shape[0], 1, device=scaled.device) * cumulative[:, -1:]  # [B, 1]
            # right=True: the first entry whose cumulative mass exceeds the draw (zero-probability
            # entries, whose cumulative mass equals their predecessor's, are never picked)
            token = torch.searchsorted(cumulative, draw, right=True).clamp_(max=scaled.shape[1] - 1)  # [B, 1]
        else:
            token = scaled.argmax(-1, keepdim=True)  # [B, 1]
        self.per_step.append((scaled.gather(1, token) - log_normalizer).squeeze(1))  # [B]
        if self.temperature > 0:
            self.per_step_entropy.append(_entropy_in_place(scaled, log_normalizer, cumulative))  # [B]
        else:  # greedy picks from a point mass: entropy exactly 0, and no [B, V] softmax to pay for
            self.per_step_entropy.append(torch.zeros(scaled.shape[0], device=scaled.device))  # [B]
        # in place (scaled may be scores itself, it is read no more): no new [B, V] tensor per step
        return scores.fill_(float("-inf")).scatter_(1, token, 0.0)  # [B, V]

    def finish(self, new_tokens: Tensor) -> Tensor:
        """Log-probs [B, S] for the generated tokens [B, S] returned by `generate` (rows that
        stopped hold pad tokens after their eos; their values there are never used)."""
        return _stack_steps(self.per_step, new_tokens)

    def finish_entropy(self, new_tokens: Tensor) -> Tensor:
        """Entropy [B, S] (nats) of the distribution each generated token [B, S] was drawn from,
        softmax(logits / T) after HF's own processors; 0 at T = 0 (greedy: a point mass)."""
        return _stack_steps(self.per_step_entropy, new_tokens)


def _entropy_in_place(scaled: Tensor, log_normalizer: Tensor, spent: Tensor) -> Tensor:
    """-sum_v p_v log p_v per row [B] of softmax(scaled [B, V]), log Z [B, 1] given. Overwrites
    `scaled` (its sampled entries already read) and `spent` (the cumulative sums, searched already):
    one exp pass and no new [B, V] tensor, as the sampler itself."""
    log_probs = scaled.sub_(log_normalizer)  # [B, V]
    probs = torch.exp(log_probs, out=spent)  # [B, V]
    # nansum: an entry HF masked to -inf has p = 0 and 0 * -inf = NaN; its term is 0
    return probs.mul_(log_probs).nansum(-1).neg_().clamp_(min=0.0)  # [B]


def _stack_steps(per_step: list[Tensor], new_tokens: Tensor) -> Tensor:
    """The recorded [B] tensors of the first S steps as [B, S], S = new_tokens.shape[1]."""
    steps = new_tokens.shape[1]
    if len(per_step) < steps:
        raise RuntimeError(f"recorded {len(per_step)} steps for {steps} generated tokens")
    if steps == 0:
        return torch.zeros(new_tokens.shape, dtype=torch.float32, device=new_tokens.device)  # [B, 0]
    return torch.stack(per_step[:steps], dim=1)  # [B, S]


def build_rollout(
    tokenizer,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    eos_ids: list[int],
    max_new_tokens: int,
    policy_version: int | None = None,
    entropies: list[float] | None = None,
) -> Rollout:
    """Cut after the first eos (kept, with its log-prob: the policy chose to stop), decode.
    `entropies` (per generated token, None when the backend has none) become the kept tokens' mean."""
    eos = set(eos_ids)
    length = next((i + 1 for i, token in enumerate(tokens) if token in eos), len(tokens))
    ended = length > 0 and tokens[length - 1] in eos
    completion = tokens[:length]
    text, offsets = decode_with_offsets(tokenizer, completion)
    return Rollout(
        prompt_ids=list(prompt),
        completion_ids=completion,
        logprobs=logprobs[:length],
        text=text,
        offsets=offsets,
        truncated=not ended and length >= max_new_tokens,
        policy_version=policy_version,
        entropy=sum(entropies[:length]) / length if entropies is not None and length > 0 else None,
    )


def decode_with_offsets(tokenizer, token_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decode incrementally (special tokens skipped) and record each token's span in the text.

    Uses the tokenizers library's streaming decoder, which holds back bytes until they form whole
    characters: a token ending inside a multi-byte character gets an empty span and the token
    completing it gets the whole character. By construction the spans tile the text:
    "".join(text[s:e] for s, e in offsets) == text; special tokens get empty spans.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise TypeError(f"{type(tokenizer).__name__} has no backend tokenizer; a fast tokenizer is required")
    stream = DecodeStream(skip_special_tokens=True)
    pieces, offsets, cursor = [], [], 0
    for token_id in token_ids:
        piece = stream.step(backend, token_id) or ""
        pieces.append(piece)
        offsets.append((cursor, cursor + len(piece)))
        cursor += len(piece)
    return "".join(pieces), offsets


def eos_token_ids(model, tokenizer) -> list[int]:
    """Union of the tokenizer's eos and the model's generation eos (chat models often add one)."""
    ids: list[int] = []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    configured = configured if isinstance(configured, list) else [configured]
    for candidate in [tokenizer.eos_token_id, *configured]:
        if candidate is not None and candidate not in ids:
            ids.append(int(candidate))
    if not ids:
        raise ValueError("neither the tokenizer nor the model defines an eos token")
    return ids


def validate_request(prompts: list[list[int]], n: int, params: SamplingParams) -> None:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature}")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if any(len(prompt) == 0 for prompt in prompts):
        raise ValueError("empty prompt: every prompt needs at least one token (e.g. bos)")


@contextlib.contextmanager
def _without_model_generation_defaults(model):
    """HF fills every field our config leaves unset from `model.generation_config` (checkpoints
    ship top_k, top_p, repetition_penalty, suppress_tokens...): any of them would make the
    sampling distribution differ from log_softmax(logits / T). Hide it for the duration of the call."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


@contextlib.contextmanager
def _eval_mode(model):
    """Dropout off while sampling; the previous train/eval mode comes back afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """With a seed: a private RNG stream (the global one is restored afterwards). Without: the
    global RNG, so consecutive calls draw fresh samples."""
    if seed is None:
        yield
        return
    cuda_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        yield
