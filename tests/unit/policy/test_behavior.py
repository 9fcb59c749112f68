"""Tier-1 behavior alignment (policy/ALGORITHMS.md numeric check 8) and the bound on peers' claims."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.behavior import align_behavior_logprobs, bound_claims


def spans(ends: list[int], start: int = 0) -> list[tuple[int, int]]:
    out, prev = [], start
    for e in ends:
        out.append((prev, e))
        prev = e
    return out


def segment_sums(ends: list[int], values: list[float], boundaries: list[int]) -> list[float]:
    """Sum of values per segment (B_{k-1}, B_k], computed independently of the module."""
    sums, lo = [], -1
    for hi in boundaries:
        sums.append(sum(v for e, v in zip(ends, values) if lo < e <= hi))
        lo = hi
    return sums


def test_check8_tier1_segment_sums_and_total_exact():
    # "Hello world!": sender "Hel|lo| wor|ld|!", receiver "He|llo| world|!"
    s_ends, r_ends = [3, 5, 9, 11, 12], [2, 5, 11, 12]
    sender = [-1.0, -0.5, -2.0, -0.25, -0.1]
    prox = [-0.7, -0.9, -3.0, -0.4]
    b = align_behavior_logprobs(spans(s_ends), sender, spans(r_ends), prox)
    shared = [5, 11, 12]
    assert segment_sums(r_ends, b, shared) == pytest.approx(segment_sums(s_ends, sender, shared))
    assert segment_sums(r_ends, b, shared) == pytest.approx([-1.5, -2.25, -0.1])
    assert sum(b) == pytest.approx(sum(sender))  # total sequence log-ratio sum(l - b) unchanged
    assert b == pytest.approx([-0.7 + 0.05, -0.9 + 0.05, -3.0 + 0.75, -0.4 + 0.3])  # Delta_k / |V_k|


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_check8_tier1_random_tokenizations(data):
    n_chars = data.draw(st.integers(1, 40))
    cuts = st.sets(st.integers(1, n_chars - 1), max_size=n_chars - 1) if n_chars > 1 else st.just(set())
    s_ends = sorted(data.draw(cuts)) + [n_chars]
    r_ends = sorted(data.draw(cuts)) + [n_chars]
    lp = st.floats(-8.0, 0.0)
    sender = data.draw(st.lists(lp, min_size=len(s_ends), max_size=len(s_ends)))
    prox = data.draw(st.lists(lp, min_size=len(r_ends), max_size=len(r_ends)))
    b = align_behavior_logprobs(spans(s_ends), sender, spans(r_ends), prox)
    shared = sorted(set(s_ends) & set(r_ends))
    assert segment_sums(r_ends, b, shared) == pytest.approx(segment_sums(s_ends, sender, shared), abs=1e-9)
    assert sum(b) == pytest.approx(sum(sender), abs=1e-9)


def test_tier1_empty_spans_and_offsets_not_starting_at_zero():
    # text " ab": both sides skip the leading space (starts at 1); both end with an eos at (0, 0)
    sender_offsets = [(1, 2), (2, 3), (0, 0)]
    receiver_offsets = [(1, 3), (0, 0)]
    b = align_behavior_logprobs(sender_offsets, [-1.0, -2.0, -0.5], receiver_offsets, [-2.0, -0.1])
    assert sum(b) == pytest.approx(-3.5)
    assert b == pytest.approx([-2.0 - 0.7, -0.1 - 0.7])  # one segment (1, 3]: Delta = -3.5 + 2.1


def test_tier1_uncovered_tail_keeps_proxy():
    # the sender stopped at char 5, the receiver's tokens go on to 8: the tail stays at l^prox
    b = align_behavior_logprobs(spans([5]), [-2.0], spans([5, 8]), [-1.0, -0.3])
    assert b == pytest.approx([-2.0, -0.3])


def test_tier1_length_mismatch_raises():
    with pytest.raises(ValueError, match="sender"):
        align_behavior_logprobs(spans([1, 2]), [-1.0], spans([2]), [-1.0])
    with pytest.raises(ValueError, match="receiver"):
        align_behavior_logprobs(spans([2]), [-1.0], spans([2]), [-1.0, -2.0])


def test_bound_claims_raises_only_claimed_positions_below_our_logprob():
    b = torch.tensor([[-5.0, -0.1, -2.0], [-9.0, -9.0, -9.0]])  # [2, 3]
    prox = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])  # [2, 3]
    claimed = torch.tensor([[True, True, False], [False, False, False]])  # [2, 3]
    bounded, frac = bound_claims(b, prox, claimed)
    # raised where the claim is below ours; a claim above ours (-0.1) stays; unclaimed positions stay
    assert torch.equal(bounded, torch.tensor([[-1.0, -0.1, -2.0], [-9.0, -9.0, -9.0]]))
    assert float(frac) == pytest.approx(0.5)  # a 0-dim tensor: the learner reads it with its other statistics
    assert float(bound_claims(b, prox, torch.zeros_like(claimed))[1]) == 0.0
