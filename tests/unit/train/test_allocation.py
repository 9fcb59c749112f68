"""DARS allocation (policy/ALGORITHMS.md numeric check 5) and the Beta pass-rate posterior."""
from __future__ import annotations

import math

import pytest

from node.train.allocation import dars_extra_rollouts
from node.train.pass_rates import BetaPassRate


@pytest.mark.parametrize(
    "a,equal,hardness",
    [(0.125, 5, 14), (0.0, 9, 23), (0.25, 2, 6), (0.5, 0, 0), (0.75, 0, 0), (1.0, 0, 0)],
)
def test_check5_dars_std_normalized(a, equal, hardness):
    assert dars_extra_rollouts(a, n=8, n_max=64, scheme="equal") == equal
    assert dars_extra_rollouts(a, n=8, n_max=64, scheme="hardness") == hardness


def test_check5_dars_without_std():
    assert dars_extra_rollouts(0.125, n=8, n_max=64, scheme="equal", std_normalized=False) == 11
    # (7 - 1.75) / 0.21875 is exactly 24: the ceil must not round it up to 25
    assert dars_extra_rollouts(0.125, n=8, n_max=64, scheme="hardness", std_normalized=False) == 24


def test_dars_cap_and_errors():
    assert dars_extra_rollouts(0.0, n=8, n_max=16, scheme="hardness") == 8  # 23 capped at N_max - N
    assert dars_extra_rollouts(0.0, n=8, n_max=8, scheme="equal") == 0
    with pytest.raises(ValueError):
        dars_extra_rollouts(0.1, n=8, n_max=4, scheme="equal")
    with pytest.raises(ValueError):
        dars_extra_rollouts(0.1, n=8, n_max=64, scheme="uniform")


# The posterior's tail P(p > x) = 1 - I_x(alpha, beta), for check 5d. The node reads only the posterior
# mean, so the regularised incomplete beta I_x lives here.
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


def prob_above(post: BetaPassRate, threshold: float) -> float:
    """P(pass rate > threshold) under the posterior."""
    return 1.0 - beta_cdf(threshold, post.alpha, post.beta)


def test_beta_cdf_closed_forms():
    for t in (0.05, 0.35, 0.5, 0.9):
        assert beta_cdf(t, 1, 1) == pytest.approx(t, abs=1e-12)
        assert beta_cdf(t, 2, 1) == pytest.approx(t**2, abs=1e-12)
        assert beta_cdf(t, 1, 3) == pytest.approx(1 - (1 - t) ** 3, abs=1e-12)
    # Beta(3, 5): I_x = P(Binomial(7, x) >= 3)
    from math import comb
    x = 0.3
    assert beta_cdf(x, 3, 5) == pytest.approx(sum(comb(7, k) * x**k * (1 - x) ** (7 - k) for k in range(3, 8)), abs=1e-12)


def test_beta_pass_rate_posterior():
    p = BetaPassRate()
    assert p.mean == 0.5 and prob_above(p, 0.35) == pytest.approx(0.65)
    p.update(successes=1, trials=8)
    assert (p.alpha, p.beta) == (2.0, 8.0) and p.mean == pytest.approx(0.2)
    assert prob_above(p, 0.35) < 0.2
    p.update(successes=30, trials=32)
    assert prob_above(p, 0.35) > 0.99
    with pytest.raises(ValueError):
        p.update(successes=3, trials=2)
