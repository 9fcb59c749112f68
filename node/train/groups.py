"""Scored groups, and how local and peers' groups become training groups (group composition).

    sapo         every group trains as its own group (the SAPO paper): a peer's group is
                 baselined only against itself
    cross_actor  a peer's group for the same prompt as one of ours joins our group: one
                 baseline over the union of completions (as in Gensyn's PipelineRL fork), so a
                 peer's all-correct group lifts our all-wrong one into a group with signal

Zero-variance groups are dropped after composition (the learner skips groups whose advantages are
all 0), so a merge can rescue groups that alone carry no signal.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from node.tasks.base import Task
from policy.types import Rollout, TrainGroup, TrainSample

Composition = Literal["sapo", "cross_actor"]


@dataclass(frozen=True)
class HintUse:
    """The hint a group's hinted completions were conditioned on."""

    level: str  # "l1" | "l2" | "l3" | "prefix"
    text: str


@dataclass
class ScoredGroup:
    """The completions of one task with rewards recomputed by this node's verifier."""

    task: Task
    rollouts: list[Rollout]
    rewards: list[float]
    correct: list[bool]
    origin: str = "local"  # "local" or the sender's peer id
    meta: dict = field(default_factory=dict)
    policy_version: int = 0  # optimizer steps of the policy that sampled it (ours for local groups)
    hint: HintUse | None = None  # set when some completions were conditioned on a hint
    hinted: list[bool] = field(default_factory=list)  # per completion; empty = none hinted

    @property
    def local(self) -> bool:
        return self.origin == "local"

    @property
    def flat(self) -> bool:
        """All rewards equal: alone, the group has no advantage signal."""
        return len(set(self.rewards)) <= 1

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.rollouts]

    def unhinted(self) -> list[bool]:
        """Correctness of the completions that saw no hint."""
        hinted = self.hinted or [False] * len(self.correct)
        return [c for c, h in zip(self.correct, hinted) if not h]


def to_train_sample(rollout: Rollout, reward: float, correct: bool | None = None) -> TrainSample:
    mask = None
    if rollout.hint_tokens:  # a solution prefix given as a hint: context, never a training target
        mask = [0] * rollout.hint_tokens + [1] * (len(rollout.completion_ids) - rollout.hint_tokens)
    return TrainSample(prompt_ids=rollout.prompt_ids, completion_ids=rollout.completion_ids,
                       behavior_logprobs=rollout.logprobs, reward=reward, loss_mask=mask,
                       tier=rollout.tier, alignment=rollout.alignment, correct=correct)


def to_train_group(group: ScoredGroup) -> TrainGroup:
    """The group as the learner sees it; each sample carries our verifier's verdict (`correct`:
    under loss.off_policy.peer_failures = "drop" only a peer's correct samples train)."""
    samples = [to_train_sample(rollout, reward, ok)
               for rollout, reward, ok in zip(group.rollouts, group.rewards, group.correct)]
    return TrainGroup(samples=samples, meta={"task": group.task.ref.key, "origin": group.origin})


def compose(local: list[ScoredGroup], external: list[ScoredGroup], mode: Composition) -> tuple[list[TrainGroup], int]:
    """Training groups from this round's local groups and the chosen peer groups; also returns how
    many peer groups were merged into a local group."""
    groups = [to_train_group(g) for g in local]
    merged = 0
    # a hinted group is never a merge target: its completions were conditioned on a hint, and the
    # pool never takes peers' groups for those prompts either (Exchange.collect)
    by_prompt = {g.task.prompt_key: train for g, train in zip(local, groups)
                 if g.hint is None} if mode == "cross_actor" else {}
    for group in external:
        target = by_prompt.get(group.task.prompt_key)
        if target is None:
            groups.append(to_train_group(group))
            continue
        target.samples.extend(to_train_group(group).samples)
        target.meta.setdefault("merged_from", []).append(group.origin)
        merged += 1
    return groups, merged
