"""node/testnet/stats.py: the statistics the testnet report and arm-comparing scripts share, against
numbers computed by hand and by numpy."""
from __future__ import annotations

import numpy as np
import pytest

from node.testnet.stats import (ci_excludes_zero, format_interval, learned_counts, mean_ci, paired_comparison,
                                paired_differences, sample_std)


def test_sample_std_is_numpys_with_one_degree_of_freedom():
    assert sample_std([1.0, 2.0, 3.0, 4.0]) == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert sample_std([1.0, 2.0, 3.0, 4.0]) == pytest.approx((5 / 3) ** 0.5)  # sum of squares 5, over n - 1
    assert sample_std([0.3, 0.3]) == 0.0
    assert sample_std([0.5]) is None and sample_std([]) is None


def test_paired_differences_by_hand():
    summary = paired_comparison([0.1, 0.2, 0.3], [0.0, 0.1, 0.1])
    assert summary["diffs"] == pytest.approx([0.1, 0.1, 0.2])
    assert summary["mean"] == pytest.approx(0.4 / 3) and summary["n"] == 3
    # a bootstrap mean of these three differences lies within [min, max]; the interval holds the mean
    assert 0.1 - 1e-9 <= summary["ci_low"] <= summary["mean"] <= summary["ci_high"] <= 0.2 + 1e-9
    assert summary["ci_low"] < summary["ci_high"] and summary["confidence"] == 0.95
    assert paired_comparison([0.1, 0.2, 0.3], [0.0, 0.1, 0.1]) == summary  # fixed resampling seed: repeats
    with pytest.raises(ValueError, match="one reference value per seed"):
        paired_differences([0.1, 0.2], [0.0])


def test_pairing_sees_a_small_constant_gain_under_a_large_spread_between_seeds():
    """Seeds differ a lot (0.1 .. 0.9) but the arm is 0.02 above the reference on every one: the
    paired interval is tight around 0.02 and excludes 0; unpaired spreads (0.3) would hide it."""
    reference = [0.1, 0.5, 0.9, 0.3, 0.7, 0.2, 0.6, 0.4]
    arm = [r + 0.02 + e for r, e in zip(reference, [0.001, -0.002, 0.003, 0.0, -0.001, 0.002, -0.003, 0.001])]
    summary = paired_comparison(arm, reference)
    assert summary["mean"] == pytest.approx(np.mean(np.subtract(arm, reference)))
    assert 0.015 < summary["ci_low"] < summary["mean"] < summary["ci_high"] < 0.025
    assert ci_excludes_zero(summary) and sample_std(reference) > 0.25


def test_an_interval_around_zero_is_not_a_gain_and_a_worse_arm_excludes_zero_below():
    mixed = mean_ci([-0.1, 0.1, -0.05, 0.05, 0.02, -0.03])
    assert mixed["ci_low"] < 0 < mixed["ci_high"] and not ci_excludes_zero(mixed)
    worse = mean_ci([-0.05, -0.1, -0.2, -0.03, -0.08, -0.12, -0.07, -0.09])
    assert worse["ci_high"] < 0 and ci_excludes_zero(worse)


def test_one_seed_has_no_interval_and_says_why():
    summary = paired_comparison([0.3], [0.1])
    assert summary["mean"] == pytest.approx(0.2) and summary["ci_low"] is None and summary["ci_high"] is None
    assert summary["note"].startswith("n/a: 1 seed") and not ci_excludes_zero(summary)
    assert format_interval(summary) == "+0.200 [CI n/a: 1 seed, a confidence interval needs at least 2] (n=1 seed)"
    same = mean_ci([0.05, 0.05, 0.05])  # nothing to resample: the interval is the value itself
    assert (same["ci_low"], same["ci_high"]) == (0.05, 0.05) and ci_excludes_zero(same)
    assert mean_ci([])["mean"] is None and format_interval(mean_ci([])) == "n/a (no paired seeds)"


def test_format_interval():
    summary = {"n": 8, "mean": 0.0432, "ci_low": 0.0121, "ci_high": 0.0709, "confidence": 0.95, "note": None}
    assert format_interval(summary) == "+0.043 [95% CI +0.012, +0.071] (n=8 seeds)"


def test_learned_counts_by_hand():
    def fam(pass1: float, tasks: int = 16) -> dict:
        return {"pass1": pass1, "passk": pass1, "tasks": tasks}

    runs = [
        ({"rev": fam(0.0), "inc": fam(0.25)}, {"rev": fam(1 / 16), "inc": fam(0.25)}),  # rev +1 task, inc same
        ({"rev": fam(0.5), "inc": fam(0.25)}, {"rev": fam(0.4375), "inc": fam(0.5)}),  # rev -1 task, inc +4
        ({"rev": fam(0.1, 10), "ood:add": fam(0.0, 10)}, {"rev": fam(0.3, 10), "ood:add": fam(0.0, 10)}),
    ]
    assert learned_counts(runs) == {"inc": {"learned": 1, "runs": 2}, "ood:add": {"learned": 0, "runs": 1},
                                    "rev": {"learned": 2, "runs": 3}}
    assert learned_counts([]) == {}
