"""Sampling and scoring this round's groups: plain groups, hinted groups, DARS extra rollouts.

    plain     G completions of the prompt
    hinted    1 completion of the plain prompt + G-1 conditioned on the prompt's current hint:
              an abstract level (l1-l3) is appended to the question; a prefix is forced as the
              first completion tokens, which the loss never sees (Rollout.hint_tokens), and the
              text generated after it keeps the budget max_new_tokens - len(prefix)
    DARS      prompts whose base accuracy is low get extra completions (node/train/allocation.py)

The round's own completions (plain and hinted) come from ONE generate call: every completion is a
row of its own (its prompt repeated, n = 1), since a call has a fixed cost (its own decode loop)
that separate calls per kind of prompt paid several times a round; the generator prefills each
distinct prompt once however often it repeats. A prefix row is sampled with the full budget and cut
to its room afterwards: sampling goes token by token, so the first `room` tokens of a longer row
have exactly the distribution of a row sampled with budget `room`. DARS's extra completions, which
depend on this call's scores, are a call of their own.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from node.config.sections import AllocationConfig
from node.train.allocation import dars_extra_rollouts
from node.train.assembly import SamplingContext
from node.train.pass_rates import PassRates
from node.train.groups import HintUse, ScoredGroup
from node.tasks.base import Task
from policy.generation import StaleWeightsError, decode_with_offsets, eos_token_ids
from policy.types import Rollout


@dataclass(frozen=True)
class _Row:
    """One completion of the round's generate call: whose task, whether hinted, and for a prefix
    hint the forced ids (the generator's prompt is the task's prompt + these)."""

    task: int
    hinted: bool
    prefix: tuple[int, ...] | None = None


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
        plain = [i for i, h in enumerate(hints) if h is None]
        prompts = [self.ctx.prompt(t.question) for t in tasks]
        rows, generator_prompts = self._rows(tasks, hints, prompts)
        rollouts: list[list[Rollout]] = [[] for _ in tasks]
        flags: list[list[bool]] = [[] for _ in tasks]
        with self.ctx.autocast():
            generated = self._generate(generator_prompts, 1)
        for row, (rollout,) in zip(rows, generated):
            if row.prefix is not None:
                rollout = self._with_prefix(prompts[row.task], list(row.prefix), rollout)
            rollouts[row.task].append(rollout)
            flags[row.task].append(row.hinted)
        self._score_seconds = 0.0
        groups = [self._score(task, rollouts[i], policy_version, hints[i], flags[i]) for i, task in enumerate(tasks)]
        extra = self._allocate([groups[i] for i in plain], [prompts[i] for i in plain], policy_version)
        stats = {"t_score": self._score_seconds, **diversity_stats(groups)}
        if self.allocation.scheme != "off":
            stats["dars_extra_rollouts"] = float(extra)
        return groups, stats

    def _rows(self, tasks: list[Task], hints: list[HintUse | None],
              prompts: list[list[int]]) -> tuple[list[_Row], list[list[int]]]:
        """Every completion of the round in task order (a hinted task's unhinted completion first),
        and the prompt the generator continues for each."""
        n = self.group_size
        tok = self.ctx.policy.tokenizer
        rows: list[_Row] = []
        generator_prompts: list[list[int]] = []
        for i, (task, hint) in enumerate(zip(tasks, hints)):
            if hint is None:
                rows += [_Row(i, False)] * n
                generator_prompts += [prompts[i]] * n
                continue
            rows.append(_Row(i, False))
            generator_prompts.append(prompts[i])
            if hint.level == "prefix":
                prefix = tok(hint.text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                rows += [_Row(i, True, tuple(prefix))] * (n - 1)
                generator_prompts += [prompts[i] + prefix] * (n - 1)
            else:
                rows += [_Row(i, True)] * (n - 1)
                generator_prompts += [self.ctx.prompt(task.question, hint.text)] * (n - 1)
        return rows, generator_prompts

    def _generate(self, prompts: list[list[int]], n: int) -> list[list[Rollout]]:
        if not prompts or n < 1:
            return [[] for _ in prompts]
        return self.ctx.generate(prompts, n, self.ctx.params)

    def _with_prefix(self, prompt: list[int], prefix: list[int], rollout: Rollout) -> Rollout:
        """The prefix becomes the first completion tokens (masked from the loss by hint_tokens), and
        the text generated after it is cut to its room, max(1, max_new_tokens - len(prefix)): the
        row was sampled with the full budget, its first `room` tokens are what a call with budget
        `room` would have drawn. Kept whole, it ended (eos) within its room; cut or filling the room
        without eos, it is truncated. A cut row's entropy stays the mean over every token it
        generated (the generator returns no per-token entropies to re-average): the same policy's
        draws, some past the room."""
        room = max(1, self.ctx.params.max_new_tokens - len(prefix))
        generated, logprobs, truncated = rollout.completion_ids, list(rollout.logprobs), rollout.truncated
        if len(generated) > room or (len(generated) == room and generated[-1] not in self._eos_ids):
            generated, logprobs, truncated = generated[:room], logprobs[:room], True
        ids = prefix + generated
        text, offsets = decode_with_offsets(self.ctx.policy.tokenizer, ids)
        return Rollout(prompt_ids=prompt, completion_ids=ids, logprobs=[0.0] * len(prefix) + logprobs,
                       text=text, offsets=offsets, truncated=truncated, hint_tokens=len(prefix),
                       policy_version=rollout.policy_version, entropy=rollout.entropy)

    @cached_property
    def _eos_ids(self) -> frozenset[int]:
        """Every token that ends a completion (the generator's own cut: policy/generation.py)."""
        return frozenset(eos_token_ids(self.ctx.policy.model, self.ctx.policy.tokenizer))

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
