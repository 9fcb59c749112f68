"""Plain data passed between generation, the learner and the node loop."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policy.behavior import SegmentPlan

# Behavior tiers of an external (peer-sampled) completion; policy/ALGORITHMS.md "Shared rollouts".
TIER_EXACT = 0    # same tokenizer, same token ids: the sender's log-probs are b exactly
TIER_ALIGNED = 1  # other tokenizer: sender log-probs redistributed over shared character boundaries
TIER_PROXY = 2    # nothing usable (or untrusted): b = the receiver's own l^prox (SAPO's ratio 1)
TIERS = (TIER_EXACT, TIER_ALIGNED, TIER_PROXY)


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled. Behavior log-probs are taken at `temperature` (the learner
    divides logits by the same temperature, else the on-policy ratio is not 1). Only plain
    temperature sampling is supported: top-p/top-k would change the behavior distribution."""

    temperature: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None


@dataclass
class Rollout:
    """One sampled completion of one prompt."""

    prompt_ids: list[int]
    completion_ids: list[int]  # excludes padding; includes the eos token if one was emitted
    logprobs: list[float] | None  # behavior log-prob per token at the sampling temperature; None = unknown
    text: str  # decoded completion, special tokens skipped
    offsets: list[tuple[int, int]]  # character span of each completion token inside `text`
    truncated: bool  # hit max_new_tokens without emitting eos
    hint_tokens: int = 0  # leading completion tokens forced from a hint (context, never trained)
    tier: int | None = None  # None: sampled by this node; else the behavior tier of a peer's rollout
    alignment: SegmentPlan | None = None  # tier 1 only: how the sender's log-probs map onto our tokens
    policy_version: int | None = None  # optimizer steps of the weights that sampled it (our own rollouts)
    # mean per-token entropy (nats) of the distribution each generated token was drawn from (hint
    # prefix excluded); None: not measured (vLLM, a peer's rollout)
    entropy: float | None = None


@dataclass
class TrainSample:
    """One completion as the learner sees it. `behavior_logprobs` is None when the sampler's
    log-probs are unknown (tier 2: the learner then uses its own recomputation) or must be derived
    from it (tier 1: `alignment`). `tier` is None for this node's own samples. `correct` is this
    node's verifier's verdict on the answer (None: unknown); with
    loss.off_policy.peer_failures = "drop" only a peer's correct samples train."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behavior_logprobs: list[float] | None
    reward: float
    loss_mask: list[int] | None = None  # per completion token; None means all 1 (hint tokens get 0)
    tier: int | None = None
    alignment: SegmentPlan | None = None
    correct: bool | None = None


@dataclass
class TrainGroup:
    """The completions of one prompt; advantages are computed within a group. A group may mix this
    node's samples with a peer's (cross-actor composition): the baseline is over all of them."""

    samples: list[TrainSample]
    meta: dict = field(default_factory=dict)

    @property
    def external(self) -> bool:
        """True when every sample came from a peer (SAPO's external group)."""
        return all(s.tier is not None for s in self.samples)
