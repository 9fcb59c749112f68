"""Per-token log-probs of completions: l_t = log pi(a_t | x, a_<t) on logits / T (policy/ALGORITHMS.md).

Batch layout (the one TRL uses): prompts LEFT-padded to P, completions RIGHT-padded to C, so every
completion starts at column P and the logits that predict it sit in one contiguous block.
Shapes: B = batch, P = longest prompt, C = longest completion, V = vocabulary.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

# Elements of float32 scratch per chunk in the log-softmax (64 MiB): bounds the temporary copy
# no matter how large B * C * V gets (SmolLM2's V = 49,152 dominates).
_CHUNK_ELEMENTS = 1 << 24


def pad_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Returns input_ids [B, P+C], attention_mask [B, P+C], completion_mask [B, C]."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    batch = len(prompts)
    prompt_len = max((len(p) for p in prompts), default=0)
    completion_len = max((len(c) for c in completions), default=0)
    input_ids = torch.full((batch, prompt_len + completion_len), pad_id, dtype=torch.long)  # [B, P+C]
    attention_mask = torch.zeros((batch, prompt_len + completion_len), dtype=torch.long)  # [B, P+C]
    completion_mask = torch.zeros((batch, completion_len), dtype=torch.long)  # [B, C]
    for row, (prompt, completion) in enumerate(zip(prompts, completions)):
        start = prompt_len - len(prompt)  # left padding: the prompt ends at column P
        end = prompt_len + len(completion)  # right padding: the completion starts at column P
        input_ids[row, start:prompt_len] = torch.tensor(prompt, dtype=torch.long)  # [len(prompt)]
        input_ids[row, prompt_len:end] = torch.tensor(completion, dtype=torch.long)  # [len(completion)]
        attention_mask[row, start:end] = 1  # [len(prompt) + len(completion)]
        completion_mask[row, : len(completion)] = 1  # [len(completion)]
    return input_ids, attention_mask, completion_mask


def completion_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    n_completion: int,
    temperature: float,
) -> Tensor:
    """log pi(a_t | prefix) at `temperature` for the last `n_completion` columns: [B, C].

    Carries a gradient when called with grad enabled. Values at padded completion positions are
    meaningless: multiply by the completion mask. `temperature` 0 (greedy) means T = 1.
    """
    batch = input_ids.shape[0]
    if n_completion == 0:
        return torch.zeros((batch, 0), dtype=torch.float32, device=input_ids.device)  # [B, 0]
    position_ids = padded_positions(attention_mask)  # [B, P+C]
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=n_completion + 1,  # only the positions that predict completion tokens
        use_cache=False,
    ).logits  # [B, C+1, V]
    # Column P-1+t predicts completion token t, so drop the prediction after the last column.
    logits = logits[:, :-1]  # [B, C, V]
    targets = input_ids[:, -n_completion:]  # [B, C]
    return selected_logprobs(logits, targets, temperature)  # [B, C]


def padded_positions(attention_mask: Tensor) -> Tensor:
    """Position ids [B, P+C] for attention_mask [B, P+C]: they count real tokens only, exactly as
    generate() computes them, so left padding does not shift the rotary positions of the prompt
    and completion (padding itself sits at 0 or repeats the last position: it is masked out)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, P+C]


def selected_logprobs(logits: Tensor, targets: Tensor, temperature: float) -> Tensor:
    """log_softmax(logits / T)[targets], computed in float32 (float64 for float64 logits), without
    keeping a float32 [B, C, V] copy alive for autograd: returns [B, C] for logits [B, C, V] and
    targets [B, C]."""
    inverse_temperature = 1.0 / temperature if temperature > 0 else 1.0
    return _SelectedLogSoftmax.apply(logits, targets, inverse_temperature)  # [B, C]


class _SelectedLogSoftmax(torch.autograd.Function):
    """y = z[target] - logsumexp(z) with z = float32(logits) / T, computed chunk by chunk.

    Plain autograd would keep a float32 copy of z alive for the backward of logsumexp (a second
    full [B, C, V] tensor, twice the size of bf16 logits). Here only the logits themselves are
    saved and the softmax is recomputed chunk by chunk in backward: dy/dlogits = (onehot - p) / T.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, inverse_temperature: float) -> Tensor:
        compute_dtype = _compute_dtype(logits)
        result = torch.empty(targets.shape, dtype=compute_dtype, device=logits.device)  # [B, C]
        for rows in _row_chunks(logits):
            scaled = logits[rows].to(compute_dtype) * inverse_temperature  # [b, C, V]
            chosen = scaled.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1)  # [b, C]
            result[rows] = chosen - scaled.logsumexp(-1)  # [b, C]
        ctx.save_for_backward(logits, targets)
        ctx.inverse_temperature = inverse_temperature
        return result  # [B, C]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output: Tensor):
        logits, targets = ctx.saved_tensors  # [B, C, V], [B, C]
        inverse_temperature = ctx.inverse_temperature
        compute_dtype = _compute_dtype(logits)
        grad_logits = torch.empty_like(logits)  # [B, C, V]
        for rows in _row_chunks(logits):
            scaled = logits[rows].to(compute_dtype) * inverse_temperature  # [b, C, V]
            grad_rows = grad_output[rows].to(compute_dtype).unsqueeze(-1)  # [b, C, 1]
            grad_scaled = scaled.softmax(-1).mul_(grad_rows).neg_()  # [b, C, V]: -p * g
            grad_scaled.scatter_add_(-1, targets[rows].unsqueeze(-1), grad_rows)  # [b, C, V]: + onehot * g
            grad_logits[rows] = grad_scaled.mul_(inverse_temperature).to(logits.dtype)  # [b, C, V]
        return grad_logits, None, None


def _compute_dtype(logits: Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 -> fp32; fp64 stays (gradcheck)


def _row_chunks(logits: Tensor) -> list[slice]:
    batch, completion_len, vocab = logits.shape
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, completion_len * vocab))
    return [slice(start, min(start + rows_per_chunk, batch)) for start in range(0, batch, rows_per_chunk)]
