"""Sampling and scoring this round's groups: plain groups, hinted groups, DARS extra rollouts.

    plain     G completions of the prompt (one batched generate call for all plain prompts)
    hinted    1 completion of the plain prompt + G-1 conditioned on the prompt's current hint:
              an abstract level (l1-l3) is appended to the question; a prefix is forced as the
              first completion tokens, which the loss never sees (Rollout.hint_tokens)
    DARS      prompts whose base accuracy is low get extra completions (node/allocation.py)
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from node.allocation import AllocationConfig, dars_extra_rollouts
from node.assembly import SamplingContext
from node.pass_rates import PassRates
from node.groups import HintUse, ScoredGroup
from node.prompts import render_prompt
from node.tasks.base import Task
from policy.generation import StaleWeightsError, decode_with_offsets
from policy.types import Rollout, SamplingParams


@dataclass
class RolloutSampler:
    ctx: SamplingContext
    group_size: int  # completions per plain group (G, or G+1 for mc)
    allocation: AllocationConfig
    pass_rates: PassRates
    std_normalized: bool  # the local objective scales advantages by std (DARS's S(a) depends on it)
    _score_seconds: float = 0.0

    def sample(self, tasks: list[Task], hints: list[HintUse | None], policy_version: int) -> tuple[list[ScoredGroup], dict]:
        """One scored group per task, in task order, and sampling statistics."""
        n = self.group_size
        plain = [i for i, h in enumerate(hints) if h is None]
        hinted = [i for i, h in enumerate(hints) if h is not None]
        prompts = [render_prompt(self.ctx.policy, t.question) for t in tasks]
        rollouts: dict[int, list[Rollout]] = {}
        flags: dict[int, list[bool]] = {}
        with self.ctx.autocast():
            for i, rs in zip(plain, self._generate([prompts[i] for i in plain], n)):
                rollouts[i], flags[i] = rs, [False] * n
            for i, rs in zip(hinted, self._generate([prompts[i] for i in hinted], 1)):
                rollouts[i], flags[i] = rs, [False]
            for i, rs in zip(hinted, self._generate_hinted([tasks[i] for i in hinted], [prompts[i] for i in hinted],
                                                           [hints[i] for i in hinted], n - 1)):
                rollouts[i] += rs
                flags[i] += [True] * len(rs)
        self._score_seconds = 0.0
        groups = [self._score(task, rollouts[i], policy_version, hints[i], flags[i]) for i, task in enumerate(tasks)]
        extra = self._allocate([groups[i] for i in plain], [prompts[i] for i in plain], policy_version)
        stats = {"t_score": self._score_seconds, **diversity_stats(groups)}
        if self.allocation.scheme != "off":
            stats["dars_extra_rollouts"] = float(extra)
        return groups, stats

    def _generate(self, prompts: list[list[int]], n: int) -> list[list[Rollout]]:
        if not prompts or n < 1:
            return [[] for _ in prompts]
        return self.ctx.generate(prompts, n, self.ctx.params)

    def _generate_hinted(self, tasks: list[Task], prompts: list[list[int]], hints: list[HintUse],
                         n: int) -> list[list[Rollout]]:
        """n completions per task conditioned on its hint, in task order."""
        out: list[list[Rollout]] = [[] for _ in tasks]
        abstract = [i for i, h in enumerate(hints) if h.level != "prefix"]
        prefixed = [i for i, h in enumerate(hints) if h.level == "prefix"]
        hinted_prompts = [render_prompt(self.ctx.policy, tasks[i].question, hints[i].text) for i in abstract]
        for i, rs in zip(abstract, self._generate(hinted_prompts, n)):
            out[i] = rs
        tok = self.ctx.policy.tokenizer
        prefix_ids = {i: tok(hints[i].text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                      for i in prefixed}
        by_room: dict[int, list[int]] = defaultdict(list)  # tokens left after the prefix -> tasks
        for i in prefixed:
            by_room[max(1, self.ctx.params.max_new_tokens - len(prefix_ids[i]))].append(i)
        for room, indices in by_room.items():
            params = SamplingParams(self.ctx.params.temperature, room, self.ctx.params.seed)
            generated = self.ctx.generate([prompts[i] + prefix_ids[i] for i in indices], n, params)
            for i, rs in zip(indices, generated):
                out[i] = [self._with_prefix(prompts[i], prefix_ids[i], r) for r in rs]
        return out

    def _with_prefix(self, prompt: list[int], prefix: list[int], rollout: Rollout) -> Rollout:
        """The prefix becomes the first completion tokens (masked from the loss by hint_tokens)."""
        ids = prefix + rollout.completion_ids
        text, offsets = decode_with_offsets(self.ctx.policy.tokenizer, ids)
        return Rollout(prompt_ids=prompt, completion_ids=ids, logprobs=[0.0] * len(prefix) + list(rollout.logprobs),
                       text=text, offsets=offsets, truncated=rollout.truncated, hint_tokens=len(prefix),
                       policy_version=rollout.policy_version, entropy=rollout.entropy)

    def _score(self, task: Task, rollouts: list[Rollout], policy_version: int, hint: HintUse | None,
               hinted: list[bool]) -> ScoredGroup:
        stale = {r.policy_version for r in rollouts} - {None, policy_version}
        if stale:
            raise StaleWeightsError(f"the generator sampled with policy v{sorted(stale)} but the learner is at "
                                    f"v{policy_version}: a generator.refresh() was missed")
        started = time.perf_counter()
        scored = [self.ctx.verifier.score(task, self.ctx.source, r.text) for r in rollouts]
        self._score_seconds += time.perf_counter() - started
        return ScoredGroup(task=task, rollouts=rollouts, rewards=[s[0] for s in scored],
                           correct=[bool(s[1]["correct"]) for s in scored], policy_version=policy_version,
                           hint=hint, hinted=hinted if hint is not None else [])

    def _allocate(self, groups: list[ScoredGroup], prompts: list[list[int]], policy_version: int) -> int:
        """DARS: extra completions for low-accuracy prompts, appended to their groups in place."""
        cfg = self.allocation
        if cfg.scheme == "off" or not groups:
            return 0
        by_extra: dict[int, list[int]] = defaultdict(list)
        for i, group in enumerate(groups):
            n = len(group.rollouts)
            if cfg.accuracy == "posterior":
                accuracy = self.pass_rates.mean_with(group.task, group.correct)
            else:
                accuracy = sum(group.correct) / n
            extra = dars_extra_rollouts(accuracy, n, max(n, cfg.max_rollouts), cfg.scheme, self.std_normalized)
            if extra:
                by_extra[extra].append(i)
        total = 0
        with self.ctx.autocast():
            for extra, indices in sorted(by_extra.items()):
                for i, rs in zip(indices, self._generate([prompts[i] for i in indices], extra)):
                    more = self._score(groups[i].task, rs, policy_version, None, [])
                    groups[i].rollouts += more.rollouts
                    groups[i].rewards += more.rewards
                    groups[i].correct += more.correct
                    total += len(rs)
        return total


def diversity_stats(groups: list[ScoredGroup]) -> dict:
    """How varied this node's own rollouts of the round were (every group's final rollouts: plain,
    hinted, DARS extra). entropy_mean: the mean over generated tokens (hint prefixes excluded) of
    the entropy of the distribution each was drawn from, None when the backend measures none (vLLM);
    distinct_completions: distinct token sequences per group, averaged over groups;
    flat_group_share: share of groups whose rewards are all equal (zero variance, no advantage)."""
    measured = [(r.entropy, len(r.completion_ids) - r.hint_tokens) for g in groups for r in g.rollouts
                if r.entropy is not None]
    tokens = sum(n for _, n in measured)
    sized = [g for g in groups if g.rollouts]
    return {
        "entropy_mean": sum(e * n for e, n in measured) / tokens if tokens else None,
        "distinct_completions": (sum(len({tuple(r.completion_ids) for r in g.rollouts}) for g in sized) / len(sized)
                                 if sized else None),
        "flat_group_share": sum(max(g.rewards) == min(g.rewards) for g in sized) / len(sized) if sized else None,
    }
