"""Rollout allocation: which prompts get more samples (policy/ALGORITHMS.md, "Rollout allocation").

DARS (arXiv 2508.13755) adds rollouts to hard prompts so that their total advantage mass matches
an easy prompt's. The accuracy it reads is measured this round or is the prompt's pass-rate
posterior (node/train/pass_rates.py).
"""
from __future__ import annotations

import math
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


