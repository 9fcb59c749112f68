"""Behavior log-probs for rollouts sampled by a peer (ALGORITHMS.md, "Shared (external) rollouts").

Tier 1 (different tokenizer; the sender shipped its log-probs and character offsets): the sender's
log-probs cannot be mapped token by token, but on every character boundary that BOTH tokenizations
share, the two token sequences cover the same text, so the sum of log-probs over a segment between
consecutive shared boundaries is a well-defined quantity on both sides. We spread the segment's
difference evenly over the receiver tokens of the segment:

    Delta_k = sum_{sender tokens in k} logp  -  sum_{receiver tokens in k} l^prox
    b_t     = l^prox_t + Delta_k / |V_k|              for every receiver token t in V_k

so every segment sum of b equals the sender's, hence the prefix products of rho at every shared
boundary (and the total sequence log-ratio) are exact.
"""
from __future__ import annotations

import math


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


def align_behavior_logprobs(
    sender_offsets: list[tuple[int, int]],
    sender_logprobs: list[float],
    receiver_offsets: list[tuple[int, int]],
    receiver_prox_logprobs: list[float],
) -> list[float]:
    """Tier-1 behavior log-probs b_t for the receiver's tokens (see module docstring).

    Segment k is (B_{k-1}, B_k] for the sorted shared end positions B_1 < B_2 < ...; a token
    belongs to the segment containing its (effective) end. Receiver tokens after the last shared
    boundary (the two texts are not covered to the same end, e.g. one side truncated) cannot be
    corrected and keep the tier-2 proxy b_t = l^prox_t; unmatched trailing sender tokens are
    ignored. Raises ValueError when offsets and log-probs differ in length."""
    if len(sender_offsets) != len(sender_logprobs):
        raise ValueError(f"sender has {len(sender_offsets)} offsets but {len(sender_logprobs)} log-probs")
    if len(receiver_offsets) != len(receiver_prox_logprobs):
        raise ValueError(f"receiver has {len(receiver_offsets)} offsets but {len(receiver_prox_logprobs)} log-probs")
    s_ends, r_ends = _effective_ends(sender_offsets), _effective_ends(receiver_offsets)
    shared = sorted(set(s_ends) & set(r_ends))  # B_1 < B_2 < ...

    def segment_of(end: int) -> int | None:
        """Index k of the segment (B_{k-1}, B_k] holding `end`; None past the last boundary."""
        for k, boundary in enumerate(shared):  # short lists: linear scan is clearest
            if end <= boundary:
                return k
        return None

    sender_sum = [0.0] * len(shared)  # sum of sender log-probs per segment
    for end, lp in zip(s_ends, sender_logprobs):
        k = segment_of(end)
        if k is not None:
            sender_sum[k] += lp
    receiver_sum, receiver_count = [0.0] * len(shared), [0] * len(shared)
    r_segment = [segment_of(end) for end in r_ends]
    for k, lp in zip(r_segment, receiver_prox_logprobs):
        if k is not None:
            receiver_sum[k] += lp
            receiver_count[k] += 1
    delta = [(s - r) / n if n else 0.0 for s, r, n in zip(sender_sum, receiver_sum, receiver_count)]
    return [lp + (delta[k] if k is not None else 0.0) for k, lp in zip(r_segment, receiver_prox_logprobs)]


def sequence_trust_ok(
    prox_logprobs: list[float], sender_logprobs: list[float], n_bytes: int, lambda_min: float = -1.0
) -> bool:
    """Sequence trust gate: keep an external rollout unless

        (sum l^prox - sum sender logp) / n_bytes < lambda_min     [lambda_min = -1 nat/byte]

    i.e. drop it when the receiver finds the text far less likely than the sender claims (a lying
    or badly mismatched sender). Non-finite sums are untrusted; n_bytes < 1 is treated as 1."""
    gap = math.fsum(prox_logprobs) - math.fsum(sender_logprobs)
    if not math.isfinite(gap):
        return False
    return gap / max(n_bytes, 1) >= lambda_min
