"""Shared-prefix log-probs: a GRPO group's prompt runs through the model once, not G times.

The rows of one group share their prompt token ids, so in the padded batch (policy/logprobs.py:
prompts left-padded to P, completions right-padded to C) their first P columns, ids and attention
mask alike, are identical. `shared_prefix_logprobs` runs each distinct prompt once with a key/value
cache, selects the cache's rows out to every member of the group (indexing keeps the autograd
graph: its backward sums the G completions' gradients into the one prompt computation), and runs
the completions against it with the full prompt + completion attention mask and the position ids
the unshared path uses. The result equals `completion_logprobs` on the same rows up to float
rounding (tests/unit/policy/test_shared_prefix.py): the same attention, the same positions, the same logits.

Where the log-probs come from, for completion token t of a row:
  t = 0:  the logits at the last prompt column (P-1), from the prompt's forward, one per group;
  t >= 1: the logits at completion column t-1, from the completions' forward, which therefore
          never needs the last completion token as an input (no later token sees it).

A group is known on the host (`prompt_groups`, from the samples' prompt ids): grouping on the
device would cost a device sync per forward.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from policy.logprobs import completion_logprobs, padded_positions, selected_logprobs


def prompt_groups(prompts: list[list[int]]) -> Tensor:
    """The group code of every row [B]: rows with the same prompt token ids share one, numbered in
    order of first appearance."""
    codes: dict[tuple[int, ...], int] = {}
    return torch.tensor([codes.setdefault(tuple(p), len(codes)) for p in prompts], dtype=torch.long)  # [B]


def row_chunks(n_rows: int, chunks: int, groups: Tensor | None) -> list[Tensor]:
    """The positions 0..n_rows-1 in `chunks` pieces of (nearly) equal size, on the host. Without
    groups, contiguous pieces (the unshared path's chunks); with group codes `groups` [n_rows], the
    rows sorted by group first, so a group's rows share a chunk, and its prompt is computed once
    there (a group cut by a piece's border is still exact: each piece runs the prompt itself)."""
    if groups is None:
        order = torch.arange(n_rows)  # [n]
    else:
        order = torch.sort(groups, stable=True).indices  # [n] a group's rows side by side
    return list(order.chunk(chunks))


def in_row_order(parts: list[Tensor], pieces: list[Tensor]) -> Tensor:
    """The per-piece results `parts` ([n_i, C] each, for the row positions `pieces`) back in row
    order: [n, C]."""
    order = torch.cat(pieces).to(parts[0].device)  # [n] row position of each stacked row
    stacked = torch.cat(parts)  # [n, C]
    return stacked[torch.argsort(order)]  # [n, C]


def group_layout(groups: Tensor) -> tuple[Tensor, Tensor]:
    """(leaders [u]: the first row of each distinct group, member_of [n]: each row's group as an
    index into leaders), for the group codes `groups` [n] of the rows at hand, on the host."""
    codes, member_of = torch.unique(groups, return_inverse=True)  # [u], [n]
    first_row = torch.full((codes.numel(),), groups.numel(), dtype=torch.long)  # [u]
    first_row.scatter_reduce_(0, member_of, torch.arange(groups.numel()), reduce="amin")  # [u]
    return first_row, member_of


def supports_shared_prefix(model: nn.Module) -> bool:
    """Can the model continue from a key/value cache with autograd through it, every layer seeing the
    whole prompt? Activation (gradient) checkpointing makes transformers drop the cache in training
    (transformers 5 renamed the flag); a sliding-window layer's cache keeps only its window."""
    layer_types = getattr(getattr(model, "config", None), "layer_types", None) or ()
    if not getattr(model, "_supports_cache_class", True) or any(t != "full_attention" for t in layer_types):
        return False
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return not checkpointing


def shared_prefix_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, n_completion: int,
                           temperature: float, groups: Tensor) -> Tensor:
    """`completion_logprobs` of the rows input_ids / attention_mask [n, P+C] with each group's prompt
    computed once: [n, C]. `groups` [n] (host) is each row's group code (`prompt_groups`). Without
    a group of two rows, or with nothing to predict, it is the unshared path itself."""
    leaders, member_of = group_layout(groups)  # [u], [n]
    if leaders.numel() == groups.numel() or n_completion == 0 or not supports_shared_prefix(model):
        return completion_logprobs(model, input_ids, attention_mask, n_completion, temperature)  # [n, C]
    positions = padded_positions(attention_mask)  # [n, P+C]
    return logprobs_over_shared_prompts(model, input_ids, attention_mask, positions, n_completion, temperature,
                                        leaders.to(input_ids.device), member_of.to(input_ids.device))


def logprobs_over_shared_prompts(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, positions: Tensor,
                                 n_completion: int, temperature: float, leaders: Tensor,
                                 member_of: Tensor) -> Tensor:
    """Log-probs [n, C] of rows input_ids / attention_mask / positions [n, P+C], whose prompt columns
    are those of row leaders[member_of[row]] (leaders [u], member_of [n], on the device)."""
    prompt_len = input_ids.shape[1] - n_completion  # P
    prompt = model(input_ids=input_ids[leaders, :prompt_len], attention_mask=attention_mask[leaders, :prompt_len],
                   position_ids=positions[leaders, :prompt_len], use_cache=True, logits_to_keep=1)
    first_logits = prompt.logits[member_of]  # [n, 1, V] the last prompt column predicts token 0
    first = selected_logprobs(first_logits, input_ids[:, prompt_len:prompt_len + 1], temperature)  # [n, 1]
    if n_completion == 1:
        return first  # [n, 1]
    cache = prompt.past_key_values
    cache.batch_select_indices(member_of)  # every layer's keys/values [u, H, P, D] -> [n, H, P, D], in the graph
    # completion tokens 0..C-2 in, the logits predicting tokens 1..C-1 out; the mask covers prompt and inputs
    inputs_end = input_ids.shape[1] - 1  # P+C-1
    rest_logits = model(input_ids=input_ids[:, prompt_len:inputs_end], attention_mask=attention_mask[:, :inputs_end],
                        position_ids=positions[:, prompt_len:inputs_end], past_key_values=cache, use_cache=True,
                        logits_to_keep=0).logits  # [n, C-1, V]
    rest = selected_logprobs(rest_logits, input_ids[:, prompt_len + 1:], temperature)  # [n, C-1]
    return torch.cat([first, rest], dim=1)  # [n, C]
