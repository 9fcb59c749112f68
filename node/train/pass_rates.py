"""Pass rates: Beta posteriors of how often the policy solves a prompt and a task family
(policy/ALGORITHMS.md, "Beta pass-rate posterior"). Read by DARS (allocation.accuracy = posterior),
hint annealing and the weak_tasks sampler; saved in checkpoints.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from node.train.groups import ScoredGroup
from node.tasks.base import Task


@dataclass
class BetaPassRate:
    """Beta(alpha, beta) posterior of a prompt's pass rate (uniform prior by default). Peers can
    pool evidence per task ref by summing successes and failures."""

    alpha: float = 1.0
    beta: float = 1.0

    def update(self, successes: int, trials: int) -> None:
        """Add `successes` out of `trials` Bernoulli outcomes."""
        if not 0 <= successes <= trials:
            raise ValueError(f"need 0 <= successes <= trials, got {successes}/{trials}")
        self.alpha += successes
        self.beta += trials - successes

    @property
    def mean(self) -> float:
        """Posterior mean alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)


class PassRates:
    """Beta pass-rate posteriors per prompt (Task.prompt_key) and per task family (dataset), with
    forgetting so they follow a policy that learns; bounded (least recently seen prompts go)."""

    def __init__(self, decay: float = 0.9, max_prompts: int = 50_000):
        self.decay = decay
        self.max_prompts = max_prompts
        self.by_prompt: OrderedDict[str, BetaPassRate] = OrderedDict()
        self.by_dataset: dict[str, BetaPassRate] = {}

    def observe(self, task: Task, correct: list[bool]) -> None:
        if not correct:
            return
        for table, key in ((self.by_prompt, task.prompt_key), (self.by_dataset, task.ref.dataset)):
            post = table.get(key)
            if post is None:
                post = table[key] = BetaPassRate()
            else:  # forget toward the uniform prior
                post.alpha = 1.0 + (post.alpha - 1.0) * self.decay
                post.beta = 1.0 + (post.beta - 1.0) * self.decay
            post.update(sum(correct), len(correct))
        self.by_prompt.move_to_end(task.prompt_key)
        while len(self.by_prompt) > self.max_prompts:
            self.by_prompt.popitem(last=False)

    def mean_with(self, task: Task, correct: list[bool]) -> float:
        """The prompt's posterior mean if `correct` were observed now (nothing is stored)."""
        post = self.by_prompt.get(task.prompt_key)
        alpha = beta = 1.0
        if post is not None:
            alpha, beta = 1.0 + (post.alpha - 1.0) * self.decay, 1.0 + (post.beta - 1.0) * self.decay
        return (alpha + sum(correct)) / (alpha + beta + len(correct))

    def prompt(self, key: str) -> BetaPassRate | None:
        return self.by_prompt.get(key)

    def estimate(self, task: Task) -> float | None:
        """Posterior mean for the prompt if seen, else for its family, else None."""
        post = self.by_prompt.get(task.prompt_key) or self.by_dataset.get(task.ref.dataset)
        return None if post is None else post.mean

    def weakness(self, group: ScoredGroup) -> float:
        """The weak_tasks sampler's weight of a group: 1 - our pass rate on its prompt or family (0.5
        unknown)."""
        estimate = self.estimate(group.task)
        return 0.5 if estimate is None else 1.0 - estimate

    def state_dict(self) -> dict:
        return {"prompt": [(k, p.alpha, p.beta) for k, p in self.by_prompt.items()],
                "dataset": [(k, p.alpha, p.beta) for k, p in self.by_dataset.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.by_prompt = OrderedDict((k, BetaPassRate(a, b)) for k, a, b in state.get("prompt", []))
        self.by_dataset = {k: BetaPassRate(a, b) for k, a, b in state.get("dataset", [])}
