"""Behavior log-probs for rollouts sampled by a peer (policy/ALGORITHMS.md, "Shared rollouts").

Tier 1 (different tokenizer; the sender shipped its log-probs and character offsets): the sender's
log-probs cannot be mapped token by token, but on every character boundary that BOTH tokenizations
share, the two token sequences cover the same text, so the sum of log-probs over a segment between
consecutive shared boundaries is a well-defined quantity on both sides. We spread the segment's
difference evenly over the receiver tokens of the segment:

    Delta_k = sum_{sender tokens in k} logp  -  sum_{receiver tokens in k} l^prox
    b_t     = l^prox_t + Delta_k / |V_k|              for every receiver token t in V_k

so every segment sum of b equals the sender's, hence the prefix products of rho at every shared
boundary (and the total sequence log-ratio) are exact.

The work splits in two: `plan_alignment` needs only offsets and the sender's numbers, so the node
runs it once when a peer's rollout arrives; `apply_alignment` needs l^prox (the receiver's own
log-probs at the start of the update), so the learner runs it, with no extra forward pass.
`bound_claims` then bounds every claimed b (tier 0 or 1) by l^prox from below.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class SegmentPlan:
    """Tier-1 alignment of one external completion, fixed at ingest.

    token_segment[t] is the segment k of receiver token t, or -1 for tokens past the last shared
    boundary (they keep the proxy b_t = l^prox_t); sender_sums[k] is the sender's log-prob sum
    over segment k."""

    token_segment: tuple[int, ...]
    sender_sums: tuple[float, ...]


def _effective_ends(offsets: list[tuple[int, int]]) -> list[int]:
    """Token end positions made non-decreasing by a running max.

    Assumptions: offsets are (start, end) character spans into the same decoded text on both
    sides; only END positions matter (starts may be > 0, e.g. a stripped leading space, and are
    not used). A token with an empty or out-of-order span (special tokens such as eos often get
    (0, 0); byte-fallback pieces of one character repeat the same span) is attached to the end of
    the token before it, i.e. joins the preceding segment."""
    ends, running = [], 0
    for start, end in offsets:
        if end < start:
            raise ValueError(f"token span ({start}, {end}) ends before it starts")
        running = max(running, end)
        ends.append(running)
    return ends


def plan_alignment(
    sender_offsets: list[tuple[int, int]],
    sender_logprobs: list[float],
    receiver_offsets: list[tuple[int, int]],
) -> SegmentPlan:
    """The segment of each receiver token and the sender's log-prob sum per segment.

    Segment k is (B_{k-1}, B_k] for the sorted shared end positions B_1 < B_2 < ...; a token
    belongs to the segment containing its (effective) end. Unmatched trailing sender tokens are
    ignored. Raises ValueError when the sender's offsets and log-probs differ in length."""
    if len(sender_offsets) != len(sender_logprobs):
        raise ValueError(f"sender has {len(sender_offsets)} offsets but {len(sender_logprobs)} log-probs")
    s_ends, r_ends = _effective_ends(sender_offsets), _effective_ends(receiver_offsets)
    shared = sorted(set(s_ends) & set(r_ends))  # B_1 < B_2 < ...

    def segment_of(end: int) -> int:
        """k of the segment (B_{k-1}, B_k] holding `end`; -1 past the last boundary."""
        k = bisect.bisect_left(shared, end)
        return k if k < len(shared) else -1

    sums = [0.0] * len(shared)
    for end, lp in zip(s_ends, sender_logprobs):
        k = segment_of(end)
        if k >= 0:
            sums[k] += lp
    return SegmentPlan(tuple(segment_of(end) for end in r_ends), tuple(sums))


def apply_alignment(plan: SegmentPlan, prox: Tensor) -> Tensor:
    """b [n] for the receiver's proxy log-probs prox [n] (detached): b_t = prox_t + Delta_k / |V_k|."""
    if prox.shape != (len(plan.token_segment),):
        raise ValueError(f"receiver has {len(plan.token_segment)} tokens but {tuple(prox.shape)} log-probs")
    n_segments = len(plan.sender_sums)
    segment = torch.tensor(plan.token_segment, dtype=torch.long)  # [n]
    covered = segment >= 0  # [n]
    index = segment.clamp_min(0)  # [n]
    dtype = prox.dtype
    prox = prox.detach().double()  # [n]
    receiver_sum = torch.zeros(n_segments, dtype=torch.float64).index_add_(0, index[covered], prox[covered])  # [K]
    count = torch.bincount(index[covered], minlength=n_segments).double()  # [K]
    sender_sum = torch.tensor(plan.sender_sums, dtype=torch.float64)  # [K]
    delta = torch.where(count > 0, (sender_sum - receiver_sum) / count.clamp_min(1), 0.0)  # [K]
    return (prox + torch.where(covered, delta[index], 0.0)).to(dtype)  # [n], prox's dtype


def align_behavior_logprobs(
    sender_offsets: list[tuple[int, int]],
    sender_logprobs: list[float],
    receiver_offsets: list[tuple[int, int]],
    receiver_prox_logprobs: list[float],
) -> list[float]:
    """Tier-1 behavior log-probs b_t for the receiver's tokens: plan_alignment, then apply_alignment.
    Receiver tokens after the last shared boundary keep the tier-2 proxy b_t = l^prox_t."""
    if len(receiver_offsets) != len(receiver_prox_logprobs):
        raise ValueError(f"receiver has {len(receiver_offsets)} offsets but {len(receiver_prox_logprobs)} log-probs")
    plan = plan_alignment(sender_offsets, sender_logprobs, receiver_offsets)
    prox = torch.tensor(receiver_prox_logprobs, dtype=torch.float64)  # [n]
    return apply_alignment(plan, prox).tolist()


def bound_claims(behavior: Tensor, prox: Tensor, claimed: Tensor) -> tuple[Tensor, float]:
    """A peer's claimed behavior log-probs b, bounded below by ours: b' = max(b, l^prox) where
    `claimed` [B, T] (bool) is set, b elsewhere. Returns (b' [B, T], fraction of claimed positions
    raised: a 0-dim float64 tensor, 0 when nothing is claimed, left on the device for the learner to
    read with the step's other statistics).

    Why: every weight in the loss menu grows with rho = exp(l - b), so a sender that claims its
    text was unlikely (b far below our l) buys weight: minpro's cap 1.28 against 0.26 for an
    honest stale sender, prefix/ftis 2.0, an unbounded ratio for PPO with proximal = behavior.
    After the bound rho <= exp(l - l^prox), the ratio of the tier-2 (SAPO, ratio 1) treatment of
    the same text, and each objective's weight is monotone in rho, so no claim weighs a token more
    than sending no log-probs at all would (policy/ALGORITHMS.md, "What a peer's claims can buy").
    A claim above ours (the sender found the text likelier) only lowers the weight and is kept:
    that is the correction for a stale or other sampler."""
    raised = claimed & (behavior < prox)  # [B, T]
    frac = raised.sum().double() / claimed.sum().double().clamp_min(1.0)  # []
    return torch.where(raised, prox, behavior), frac  # [B, T], []
