"""Hints for peers (policy/ALGORITHMS.md, "Hints"): the solving side.

When a peer asks for hints on a task, this node needs a verified-correct completion of it: one it
produced while training (remembered per prompt). It never generates to solve a peer's task: that
was most of a SmolLM2 node's exchange time (G samples on the training thread, and four solves in
five found nothing to send); a request for a prompt it has not solved waits (node/peers/hint_requests.py)
and is answered if it solves that prompt later. From the solution it writes the levels:
    prefix  the first `prefix_fraction` of the solution's characters, cut before the answer
            first appears (any model)
    l1-l3   written by our own model from the problem and the solution (chat models only)
Any level that contains the gold answer is refused (node/train/hints.py leaks_answer), so a hint never
gives the answer away; peers check the same rule on receipt.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from node.train.assembly import SamplingContext
from node.train.groups import ScoredGroup
from node.config.sections import HintConfig
from node.train.hints import ABSTRACT_LEVELS, leaks_answer
from node.train.prompts import render_prompt
from node.tasks.base import Task
from policy.types import SamplingParams

MAX_REMEMBERED = 4096
MAX_HINT_CHARS = 1024  # well under the wire limit (protocol Limits.max_hint_chars)

LEVEL_INSTRUCTIONS = {
    "l1": "In one short sentence, state the key idea needed to solve the problem.",
    "l2": "In at most two sentences, describe the method and an intermediate result to aim for.",
    "l3": "Give a short step-by-step plan for solving the problem.",
}
WRITER_PROMPT = ("Problem:\n{question}\n\nA correct solution:\n{solution}\n\n{instruction} "
                 "Do not state the final answer.")


def solution_prefix(solution: str, answer: str | None, fraction: float) -> str:
    """The first `fraction` of `solution`'s characters, cut before the answer first appears."""
    cut = int(len(solution) * fraction)
    prefix = solution[:cut]
    while prefix and leaks_answer(prefix, answer):
        prefix = prefix[:-1]
    return prefix if prefix.strip() else ""


@dataclass
class HintWriter:
    ctx: SamplingContext
    cfg: HintConfig
    solutions: OrderedDict[str, str] = field(default_factory=OrderedDict)  # prompt key -> correct text
    written: OrderedDict[str, dict[str, str]] = field(default_factory=OrderedDict)  # prompt key -> levels
    counters: Counter[str] = field(default_factory=Counter)

    def remember(self, group: ScoredGroup) -> None:
        """Keep one correct completion of each prompt we solved (hint material for peers)."""
        if not group.local or group.task.prompt_key in self.solutions:
            return
        for rollout, ok in zip(group.rollouts, group.correct):
            if ok and rollout.hint_tokens == 0:
                _put(self.solutions, group.task.prompt_key, rollout.text)
                return

    def can_answer(self, task: Task) -> bool:
        """We hold a correct completion of `task`'s prompt (or hints already written for it)."""
        return task.prompt_key in self.written or task.prompt_key in self.solutions

    def hints_for(self, task: Task) -> dict[str, str]:
        """Levels for `task` (cached) from the solution we hold; {} if we hold none."""
        key = task.prompt_key
        if key in self.written:
            return self.written[key]
        solution = self.solutions.get(key)
        if solution is None:
            self.counters["requests_unsolved"] += 1
            return {}
        levels = self.write(task, solution)
        _put(self.written, key, levels)
        self.counters["hint_sets_written"] += 1
        return levels

    def write(self, task: Task, solution: str) -> dict[str, str]:
        """Every level we can write without leaking the answer."""
        answer = task.reference_answer
        levels: dict[str, str] = {}
        if self.ctx.policy.chat:
            prompts = [render_prompt(self.ctx.policy, WRITER_PROMPT.format(question=task.question, solution=solution,
                                                                       instruction=LEVEL_INSTRUCTIONS[level]))
                       for level in ABSTRACT_LEVELS]
            greedy = SamplingParams(temperature=0.0, max_new_tokens=self.cfg.max_hint_tokens)
            with self.ctx.autocast():
                written = self.ctx.generate(prompts, 1, greedy, for_peers=True)
            for level, (rollout,) in zip(ABSTRACT_LEVELS, written):
                text = rollout.text.strip()[:MAX_HINT_CHARS]
                if not text:
                    continue
                if leaks_answer(text, answer):
                    self.counters[f"rejected_leak_{level}"] += 1
                    continue
                levels[level] = text
        prefix = solution_prefix(solution, answer, self.cfg.prefix_fraction)[:MAX_HINT_CHARS]
        if prefix:
            levels["prefix"] = prefix
        return levels


def _put(cache: OrderedDict, key: str, value) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > MAX_REMEMBERED:
        cache.popitem(last=False)
