"""Rollout allocation: which prompts get more samples (ALGORITHMS.md, "Rollout allocation").

DARS (arXiv 2508.13755) adds rollouts to hard prompts so that their total advantage mass matches
an easy prompt's; BetaPassRate is the per-prompt pass-rate posterior (also used by hint annealing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

_CEIL_EPS = 1e-9  # ceil(x - eps): 24.000000000001 from float rounding must give 24, not 25


def dars_extra_rollouts(
    accuracy: float,
    n: int,
    n_max: int,
    scheme: Literal["equal", "hardness"],
    std_normalized: bool = True,
) -> int:
    """Extra rollouts dN for a prompt with measured accuracy a over N base rollouts.

    a = 0 is replaced by 0.5 / N; a >= 0.5 gets 0.
    S(a) = 2 sqrt(a (1 - a)), peak = N       (std-normalised advantages)
    S(a) = 2 a (1 - a),        peak = N / 2  (mean-only advantages)
    equal:    dN = ceil((peak - N S) / S)
    hardness: dN = ceil((2 (1 - a) peak - N S) / S)
    then 0 <= dN <= N_max - N.
    """
    if n < 1 or n_max < n:
        raise ValueError(f"need 1 <= n <= n_max, got n={n}, n_max={n_max}")
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy}")
    if scheme not in ("equal", "hardness"):
        raise ValueError(f"unknown scheme {scheme!r}; valid: 'equal', 'hardness'")
    a = 0.5 / n if accuracy == 0 else accuracy
    if a >= 0.5:
        return 0
    if std_normalized:
        S, peak = 2 * math.sqrt(a * (1 - a)), float(n)
    else:
        S, peak = 2 * a * (1 - a), n / 2
    target = peak if scheme == "equal" else 2 * (1 - a) * peak  # advantage mass to reach
    dn = math.ceil((target - n * S) / S - _CEIL_EPS)
    return max(0, min(dn, n_max - n))


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
