"""Behavior tiers of a peer's completion, chosen once at ingest (policy/ALGORITHMS.md, "Shared rollouts").

    tier 0  same tokenizer fingerprint and the sender's token ids are exactly our encoding of
            the text: the sender's log-probs ARE the behavior log-probs b
    tier 1  otherwise, if the sender shipped log-probs and character offsets and the two
            tokenizations share at least one character boundary: b is derived from l^prox by
            segment-sum alignment (policy/behavior.py); the learner bounds it by its own l^prox
    tier 2  nothing usable: b = l^prox, the receiver's own log-probs (SAPO's ratio-1 proxy)

Why a rollout did not get tier 0 is kept as a named reason, counted per round.
"""
from __future__ import annotations

from dataclasses import dataclass

from node.train.prompts import Retokenizer
from policy.behavior import SegmentPlan, plan_alignment
from policy.types import TIER_ALIGNED, TIER_EXACT, TIER_PROXY
from proto import swarm_pb2

# Reasons (metric and status labels).
EXACT = "exact"                        # tier 0
OTHER_TOKENIZER = "other_tokenizer"    # tier 1: different tokenizer fingerprint
NONCANONICAL = "noncanonical_ids"      # tier 1: same tokenizer, but the sender's ids are not our encoding
NO_LOGPROBS = "no_logprobs"            # tier 2: the sender shipped no log-probs
NO_OFFSETS = "no_offsets"              # tier 2: no character offsets to align on
NO_SHARED_BOUNDARY = "no_shared_boundary"  # tier 2: the two tokenizations never meet


@dataclass(frozen=True)
class Behavior:
    tier: int
    completion_ids: list[int]  # in our tokens, eos included when the sender's completion ended
    logprobs: list[float] | None  # tier 0: the sender's b per token; else None
    alignment: SegmentPlan | None  # tier 1 only
    reason: str


def assign_tier(completion: swarm_pb2.Completion, sender_fingerprint: str, text_ids: list[int],
                text_offsets: list[tuple[int, int]], tokenizer: Retokenizer) -> Behavior:
    """The behavior tier of one peer completion whose text we encoded as text_ids / text_offsets."""
    sender_ids = list(completion.token_ids)
    ids = list(text_ids)
    offsets = list(text_offsets)
    if not completion.truncated:  # the sender's policy chose to stop: so does ours, with its eos
        ended_with = sender_ids[-1] if sender_ids and sender_ids[-1] in tokenizer.eos_ids else tokenizer.eos_id
        ids.append(ended_with)
        offsets.append((len(completion.text), len(completion.text)))
    logprobs = [min(lp, 0.0) for lp in completion.behavior_logprobs]  # limits allow +1e-4 rounding slack
    if not logprobs:
        return Behavior(TIER_PROXY, ids, None, None, NO_LOGPROBS)
    same_tokenizer = sender_fingerprint == tokenizer.fingerprint
    if same_tokenizer and sender_ids == ids:
        return Behavior(TIER_EXACT, ids, logprobs, None, EXACT)
    raw = list(completion.char_offsets)
    if not raw:
        return Behavior(TIER_PROXY, ids, None, None, NO_OFFSETS)
    sender_offsets = list(zip(raw[0::2], raw[1::2]))
    plan = plan_alignment(sender_offsets, logprobs, offsets)
    if not plan.sender_sums:
        return Behavior(TIER_PROXY, ids, None, None, NO_SHARED_BOUNDARY)
    return Behavior(TIER_ALIGNED, ids, None, plan, NONCANONICAL if same_tokenizer else OTHER_TOKENIZER)
