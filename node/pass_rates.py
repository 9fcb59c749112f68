"""Pass rates: Beta posteriors of how often the policy solves a prompt and a task family
(policy/ALGORITHMS.md, "Beta pass-rate posterior"). Read by DARS (allocation.accuracy = posterior),
hint annealing and the weak_tasks sampler; saved in checkpoints.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from node.tasks.base import Task


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the regularized incomplete beta (modified Lentz; Numerical Recipes)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def beta_cdf(x: float, a: float, b: float) -> float:
    """I_x(a, b) = P(p <= x) for p ~ Beta(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):  # the continued fraction converges fast on this side
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


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

    def prob_above(self, threshold: float) -> float:
        """P(pass rate > threshold) under the posterior."""
        return 1.0 - beta_cdf(threshold, self.alpha, self.beta)


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

    def state_dict(self) -> dict:
        return {"prompt": [(k, p.alpha, p.beta) for k, p in self.by_prompt.items()],
                "dataset": [(k, p.alpha, p.beta) for k, p in self.by_dataset.items()]}

    def load_state_dict(self, state: dict) -> None:
        self.by_prompt = OrderedDict((k, BetaPassRate(a, b)) for k, a, b in state.get("prompt", []))
        self.by_dataset = {k: BetaPassRate(a, b) for k, a, b in state.get("dataset", [])}
