"""Plain data passed between generation, the learner and the node loop."""
from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class TrainSample:
    """One completion as the learner sees it. `behavior_logprobs` is None when the sampler's
    log-probs are unknown (tier 2: the learner then uses its own recomputation)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    behavior_logprobs: list[float] | None
    reward: float
    loss_mask: list[int] | None = None  # per completion token; None means all 1 (hint tokens get 0)


@dataclass
class TrainGroup:
    """The G completions of one prompt; advantages are computed within a group."""

    samples: list[TrainSample]
    external: bool = False
    meta: dict = field(default_factory=dict)
